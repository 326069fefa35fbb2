"""Who labels whom: the methods' labels and rewards on hand-made answer groups."""
import re

import pytest

from rewards import labels_for, rewards_for, twin

# two questions (P = 2), G = 4; groups 0, 1 are the originals, 2, 3 their rephrasings
ANSWERS = [
    ["3", "3", "4", None],        # q0: votes 3
    ["7", "8", "8", "8"],         # q1: votes 8
    ["5", "5", "3", "5"],         # q0': votes 5
    ["7", "7", None, "9"],        # q1': votes 7
]
GOLD = ["5", "7", "5", "7"]


def test_twin():
    assert [twin(i, 4) for i in range(4)] == [2, 3, 0, 1]


def test_coreward1_labels_come_from_the_other_view():
    assert labels_for("coreward1", ANSWERS, GOLD) == ["5", "7", "3", "8"]


def test_swapping_the_views_swaps_the_labels():
    swapped = ANSWERS[2:] + ANSWERS[:2]
    labels = labels_for("coreward1", ANSWERS, GOLD)
    assert labels_for("coreward1", swapped, GOLD[2:] + GOLD[:2]) == labels[2:] + labels[:2]


def test_majority_and_gt_labels():
    assert labels_for("majority", ANSWERS, GOLD) == ["3", "8", "5", "7"]
    assert labels_for("gt", ANSWERS, GOLD) == GOLD


def test_rewards_match_the_label_and_no_answer_gets_zero():
    labels = labels_for("coreward1", ANSWERS, GOLD)
    assert rewards_for(ANSWERS, labels) == [
        [0.0, 0.0, 0.0, 0.0],      # q0 labelled 5 by q0'
        [1.0, 0.0, 0.0, 0.0],      # q1 labelled 7 by q1'
        [0.0, 0.0, 1.0, 0.0],      # q0' labelled 3 by q0
        [0.0, 0.0, 0.0, 0.0],      # q1' labelled 8 by q1
    ]


def test_a_group_without_any_answer_gives_no_label_and_zero_reward():
    answers = [[None, None], ["2", "2"], ["2", "3"], [None, None]]
    labels = labels_for("coreward1", answers, ["2", "2", "2", "2"])
    assert labels == ["2", None, None, "2"]
    assert rewards_for(answers, labels) == [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]


def test_labels_use_mathematical_equality():
    answers = [["0.5", "\\frac12", "1/3"], ["1/2", "2", "2"]]
    labels = labels_for("coreward1", answers, ["1/2", "1/2"])
    assert labels[1] in ("0.5", "\\frac12")
    assert rewards_for(answers, labels)[1] == [1.0, 0.0, 0.0]


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="unknown method 'ttrl'"):
        labels_for("ttrl", ANSWERS, GOLD)
    with pytest.raises(ValueError, match="even number of groups"):
        labels_for("coreward1", ANSWERS[:3], GOLD[:3])


def test_label_free_diagnostics_by_hand():
    """Unanimous: every response answered, one answer among them ("1/2" and "0.5" are one); distinct
    answers: classes of equal answers, no answer not counted; zero variance: all rewards equal."""
    import torch
    from rewards import group_diagnostics
    answers = [
        ["1/2", "0.5", "\\frac12", "1/2"],    # unanimous, 1 distinct
        ["3", "3", None, "3"],                # one answer but a response without: not unanimous; 1 distinct
        ["1", "2", "3", "2"],                 # 3 distinct
        [None, None, None, None],             # 0 distinct
    ]
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert group_diagnostics(answers, rewards) == {"unanimous": 1, "distinct": 5, "zero_variance": 2}


def test_common_answer_share_by_hand():
    """The largest class of equal majority answers over all groups, divided by the number of groups
    (groups without a vote count in the denominator only)."""
    from rewards import common_answer_share
    assert common_answer_share(["72", "0.5", "72.0", "\\frac12", "1/2", "9", None, None]) == 3 / 8   # {0.5, 1/2, 1/2}
    assert common_answer_share(["1", "2", "3", "4"]) == 1 / 4
    assert common_answer_share([None, None]) == 0.0 and common_answer_share([]) == 0.0


def test_label_groups_gives_each_group_its_voters():
    """The answers that voted for each label: the other view's (coreward1), the group's own (majority), the
    ground truth alone (gt), the teacher's on the other view (coreward3_both)."""
    from rewards import label_groups
    assert label_groups("coreward1", ANSWERS, GOLD) == (["5", "7", "3", "8"], [ANSWERS[2], ANSWERS[3], ANSWERS[0],
                                                                             ANSWERS[1]])
    assert label_groups("majority", ANSWERS, GOLD)[1] == ANSWERS
    assert label_groups("gt", ANSWERS, GOLD) == (GOLD, [["5"], ["7"], ["5"], ["7"]])
    teacher = [["1"], ["2"], ["3"], ["4"]]
    assert label_groups("coreward3_both", ANSWERS, GOLD, teacher) == (["3", "4", "1", "2"], [["3"], ["4"], ["1"],
                                                                                           ["2"]])


@pytest.mark.parametrize("row, message", [
    (("m", "the crowd", "original", None, "start", None, None), "unknown label source 'the crowd'"),
    (("m", "other view's vote", "original", None, "start", None, None), "'both' when the other view labels"),
    (("m", "teacher's vote", "original", None, "start", None, None), "votes or anchors with the teacher"),
    (("m", "own vote", "original", None, "teacher", None, None), "votes or anchors with the teacher"),
    (("m", "own vote", "original", "sometimes", "start", None, None), "teacher 'sometimes' must be None"),
])
def test_a_row_that_cannot_work_is_refused_where_the_table_is_read(row, message):
    from rewards import Method
    with pytest.raises(ValueError, match=re.escape(message)):
        Method(*row)
