"""Who labels whom: the methods' labels and rewards on hand-made answer groups."""
import re

import pytest

import rewards
from rewards import agreement as rewards_for, label_groups, twin


def labels_for(*args):
    return label_groups(*args)[0]

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
    from harness.record import group_diagnostics
    answers = [
        ["1/2", "0.5", "\\frac12", "1/2"],    # unanimous, 1 distinct
        ["3", "3", None, "3"],                # one answer but a response without: not unanimous; 1 distinct
        ["1", "2", "3", "2"],                 # 3 distinct
        [None, None, None, None],             # 0 distinct
    ]
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert group_diagnostics(answers) == {"unanimous": 1, "distinct": 5}
    from grpo import zero_variance
    assert zero_variance(rewards).tolist() == [True, False, False, True]


def test_common_answer_share_by_hand():
    """The largest class of equal majority answers over all groups, divided by the number of groups
    (groups without a vote count in the denominator only)."""
    from harness.record import common_answer_share
    assert common_answer_share(["72", "0.5", "72.0", "\\frac12", "1/2", "9", None, None]) == 3 / 8   # {0.5, 1/2, 1/2}
    assert common_answer_share(["1", "2", "3", "4"]) == 1 / 4
    assert common_answer_share([None, None]) == 0.0 and common_answer_share([]) == 0.0


def test_label_groups_gives_each_group_its_voters():
    """The answers that voted for each label: the other view's (coreward1), the group's own (majority), the
    ground truth alone (gt), the teacher's on the other view (coreward3)."""
    from rewards import label_groups
    assert label_groups("coreward1", ANSWERS, GOLD) == (["5", "7", "3", "8"], [ANSWERS[2], ANSWERS[3], ANSWERS[0],
                                                                             ANSWERS[1]])
    assert label_groups("majority", ANSWERS, GOLD)[1] == ANSWERS
    assert label_groups("gt", ANSWERS, GOLD) == (GOLD, [["5"], ["7"], ["5"], ["7"]])
    teacher = [["1"], ["2"], ["3"], ["4"]]
    assert label_groups("coreward3", ANSWERS, GOLD, teacher) == (["3", "4", "1", "2"], [["3"], ["4"], ["1"],
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


# Co-rewarding-III on hand-made groups: two questions (P = 2), G = 4, the box contents of each response (None: no
# box). Groups 0, 1 are the originals q0, q1; groups 2, 3 their rephrasings q0', q1'.
C3_POLICY = [
    ["6", "6", "\\frac{12}{2}", None],     # q0
    ["0.5", "1/2", "3", ""],               # q1 (an empty box is no answer)
    ["6", "7", "7", "7"],                  # q0'
    ["2", "2", "2", "2"],                  # q1'
]
C3_TEACHER = [
    ["7", "7", "6", "8"],                  # q0: votes 7, the label of q0'
    [None, "", " ", None],                 # q1: no answer, so q1' has no label and earns nothing
    ["7", "6", "6.0", " 6 "],              # q0': 6 as mathematics (three of four), 7 as strings (the first of four)
    ["1/2", "0.5", "3", "1/2"],            # q1': 1/2 either way, the label of q1
]


def _responses(contents):
    return [[f"So the answer is \\boxed{{{c}}}." if c is not None else "I cannot tell." for c in g] for g in contents]


def official_co_rewarding_III(policy, teacher):
    """The official reward manager's rule (Co-rewarding-III/verl/workers/reward_manager/co_rewarding_III.py),
    restated on box contents: the label of a view's responses is the most common non-blank string among the
    teacher's answers to the other view (the first one met on a tie; '' when there is none), and a response earns 1
    when its string equals a non-empty label."""
    def vote(strings):
        strings = [s for s in strings if s is not None and s.strip() != ""]
        return max(strings, key=strings.count) if strings else ""    # max keeps the first of equal counts
    labels = [vote(teacher[twin(i, len(teacher))]) for i in range(len(teacher))]
    answers = [[c or "" for c in g] for g in policy]
    return labels, [[float(label != "" and a == label) for a in g] for g, label in zip(answers, labels)]


def coreward3_rewards(policy, teacher):
    from harness.answers import extract_answer
    from rewards import METHODS, label_groups
    answers = [[extract_answer(r) for r in g] for g in _responses(policy)]
    teacher_answers = [[extract_answer(r) for r in g] for g in _responses(teacher)]
    labels, voters = label_groups("coreward3", answers, ["?"] * 4, teacher_answers)
    return labels, METHODS["coreward3"].reward(answers, labels)


def test_coreward3_labels_each_view_by_the_teachers_vote_on_the_other_by_hand():
    labels, rewards = coreward3_rewards(C3_POLICY, C3_TEACHER)
    assert labels == ["6", "1/2", "7", None]
    assert rewards == [
        [1.0, 1.0, 1.0, 0.0],    # q0 by the teacher on q0' (6): 12/2 is 6; no box earns nothing
        [1.0, 1.0, 0.0, 0.0],    # q1 by the teacher on q1' (1/2): 0.5 is 1/2; the empty box earns nothing
        [0.0, 1.0, 1.0, 1.0],    # q0' by the teacher on q0 (7)
        [0.0, 0.0, 0.0, 0.0],    # q1' by the teacher on q1: no label, though the group is unanimous
    ]
    # a swapped view, the teacher's vote on the same view, gives other labels and rewards
    same_view = C3_TEACHER[2:] + C3_TEACHER[:2]
    assert coreward3_rewards(C3_POLICY, same_view) != (labels, rewards)
    assert coreward3_rewards(C3_POLICY, same_view)[0] == ["7", None, "6", "1/2"]


def test_coreward3_departs_from_the_official_string_comparison_only_where_answers_are_written_two_ways():
    """The official reward manager compares strings; this project compares mathematics (a departure, rewards.py):
    the two differ on q0 (the teacher's 6 written three ways, a response's 12/2) and on q1's 0.5."""
    labels, rewards = official_co_rewarding_III(C3_POLICY, C3_TEACHER)
    assert labels == ["7", "1/2", "7", ""]
    assert rewards == [
        [0.0, 0.0, 0.0, 0.0],    # q0: labelled 7, the first of four different strings
        [0.0, 1.0, 0.0, 0.0],    # q1: only the string 1/2 is 1/2
        [0.0, 1.0, 1.0, 1.0],    # q0': as here
        [0.0, 0.0, 0.0, 0.0],    # q1': the empty label, as here
    ]
    ours = coreward3_rewards(C3_POLICY, C3_TEACHER)[1]
    assert [g for g in range(4) if ours[g] != rewards[g]] == [0, 1]
    same_view = C3_TEACHER[2:] + C3_TEACHER[:2]
    assert official_co_rewarding_III(C3_POLICY, same_view)[0] == ["7", "", "7", "1/2"]   # q0 by 7 as strings


def test_a_vote_over_both_views_gives_the_two_groups_one_label_even_on_a_tie():
    """coreward1_union: q0 and q0' vote together, 3 x '3' against 3 x '5' (and a '4'); the tie goes to the class met
    first with the original's answers first, '3', for both groups. Voting with each group's own answers first would
    label q0' '5'. q1 and q1': 3 x '7' against 3 x '8', '7' for both."""
    from rewards import label_groups
    labels, voters = label_groups("coreward1_union", ANSWERS, GOLD)
    assert labels == ["3", "7", "3", "7"]
    assert voters[0] == voters[2] == ANSWERS[0] + ANSWERS[2] and voters[1] == voters[3] == ANSWERS[1] + ANSWERS[3]
    from harness.answers import majority_vote
    assert majority_vote(ANSWERS[2] + ANSWERS[0]) == "5"                 # the order that would split the label


def test_the_random_reward_is_a_seeded_coin_blind_to_the_answer():
    """`random`: no label; each response's reward a fair coin from its group's seed: the same seed gives the same
    flips whatever the answers, another seed others, and over many groups about half are 1."""
    answers = [["1", "2", None, "4"], ["5", "5", "5", "5"]]
    labels, voters = rewards.label_groups("random", answers, ["1", "5"])
    assert labels == [None, None] and voters == [[], []]
    flips = rewards.METHODS["random"].reward(answers, [11, 12])
    assert flips == rewards.METHODS["random"].reward([["9"] * 4, [None] * 4], [11, 12])   # blind to answers
    assert flips != rewards.METHODS["random"].reward(answers, [13, 14])
    assert all(f in (0.0, 1.0) for g in flips for f in g)
    many = rewards.coin_flip([[None] * 8] * 200, list(range(200)))
    assert 0.45 < sum(map(sum, many)) / 1600 < 0.55 and many[0] != many[1]


def test_self_harmony_labels_both_views_by_the_harmonic_mean_of_their_shares_by_hand():
    """self_harmony, G = 4, three questions (originals first, then rephrasings). The harmonic mean of an answer's
    shares p (original) and p' (rephrasing) is 2 p p' / (p + p'):
    - q0 6 6 6 1 / 1 1 2 3: '6' 3/4 and 0 -> 0; '1' 1/4 and 1/2 -> 1/3: '1' labels both views, where the union's
      majority (3 x '6' against 3 x '1', the tie to the first) says '6' and each view's own vote '6' and '1';
    - q1 7 8 - 8 / 9 9 9 -: no answer in both views, every mean 0: no label, every reward 0;
    - q2 2 2 3 3 / 3 3 2 2: '2' and '3' both 1/2: the tie goes to the class met first, '2'."""
    from fractions import Fraction
    from rewards import harmonic_vote, label_groups
    answers = [["6", "6", "6", "1"], ["7", "8", None, "8"], ["2", "2", "3", "3"],
               ["1", "1", "2", "3"], ["9", "9", "9", None], ["3", "3", "2", "2"]]
    labels, voters = label_groups("self_harmony", answers, ["1", "7", "2"] * 2)
    assert labels == ["1", None, "2", "1", None, "2"]
    assert voters[0] == voters[3] == answers[0] + answers[3]
    assert label_groups("coreward1_union", answers, ["1", "7", "2"] * 2)[0][0] == "6"
    assert 2 * Fraction(1, 4) * Fraction(1, 2) / (Fraction(1, 4) + Fraction(1, 2)) == Fraction(1, 3)
    assert rewards.METHODS["self_harmony"].reward(answers, labels) == \
        [[0, 0, 0, 1], [0] * 4, [1, 1, 0, 0], [1, 1, 0, 0], [0] * 4, [0, 0, 1, 1]]
    # one class as mathematics (0.5, 1/2, 2/4): 1/2 and 1/4 -> 1/3; 'x' 1/4 and 1/2 -> 1/3; the tie to the earlier
    assert harmonic_vote(["1", "0.5", "1/2", "x"] + ["2/4", "x", "x", None]) == "0.5"
    assert rewards.METHODS["self_harmony"].two_view                     # J(q) + J(q'), as coreward1


def test_the_matched_controls_keep_coreward1s_rewards_and_break_their_link_to_the_answers():
    """permuted labels as coreward1 does (the other view's vote) and gives the step's agreement rewards shuffled over
    its responses (the same multiset: 2 of 16 here), seeded. matched_coin replays a coreward1 run's step: each group as
    many 1s as that run's group had (3, 0, 8, 1 here), at places from the group's seed, blind to the answers; a count
    that is no count for these groups is refused. wrong_label labels each question with its gold answer plus one:
    '5' -> '6', and no response that is right wins."""
    from harness.errors import InputError
    from rewards import METHODS, label_groups, matched_coin, permuted, wrong_answer
    labels, _ = label_groups("permuted", ANSWERS, GOLD)
    assert labels == labels_for("coreward1", ANSWERS, GOLD) == ["5", "7", "3", "8"]
    agree = rewards_for(ANSWERS, labels)
    assert sum(map(sum, agree)) == 2                 # q1: one 7; q0': one 3
    shuffled = permuted(ANSWERS, labels, [3, 4, 5, 6])
    assert sorted(sum(shuffled, [])) == sorted(sum(agree, [])) and shuffled != agree
    assert shuffled == permuted(ANSWERS, labels, [3, 9, 9, 9]) != permuted(ANSWERS, labels, [4, 4, 5, 6])
    groups = [["1"] * 8, ["2"] * 8, [None] * 8, ["1"] * 8]
    coin = matched_coin(groups, [3, 4, 5, 6], [3.0, 0.0, 8.0, 1.0])
    assert [sum(g) for g in coin] == [3, 0, 8, 1] and set(sum(coin, [])) == {0.0, 1.0}
    assert coin == matched_coin([["x"] * 8] * 4, [3, 4, 5, 6], [3, 0, 8, 1])        # the answers do not matter
    assert coin[0] != matched_coin(groups, [7, 4, 5, 6], [3, 0, 8, 1])[0]            # the seed places them
    for counts in ([3, 0, 8], [3, 0, 9, 1], [3, 0.5, 8, 1]):
        with pytest.raises(InputError, match="not counts of 1s"):
            matched_coin(groups, [3, 4, 5, 6], counts)
    assert METHODS["permuted"].two_view and not METHODS["matched_coin"].two_view
    assert [wrong_answer(g) for g in ("5", "-3", "\\frac12")] == ["6", "-2", "(\\frac12)+1"]
    labels, voters = label_groups("wrong_label", [["5", "6", None, "6"]], ["5"])
    assert labels == ["6"] and METHODS["wrong_label"].reward([["5", "6", None, "6"]], labels) == [[0, 1, 0, 1]]


def test_restrain_by_hand():
    """Two groups of G = 8. Group A answers 2 2 2 2 3 3 5 and one none: classes of shares 1/2, 1/4, 1/8, weighted
    g(f) = exp(-(f - 1)^2 / 0.18): 0.249352, 0.043937, 0.014215, w = 0.810891, 0.142883, 0.046226. GRPO's advantages of
    each class's indicator (std with Bessel's correction): '2' ±0.935414; '3' 1.62019 / -0.540062; '5' 2.474874 /
    -0.353553. So a '2' gets 0.810891 x 0.935414 - 0.142883 x 0.540062 - 0.046226 x 0.353553 = 0.665009, a '3'
    -0.543366, the '5' -0.721279, no answer -0.852026. Group B's eight answers all differ: its largest class, 1, is under κ = 3,
    so every response gets -δ = -0.5. The start model answers A six times '2' (g(3/4) = 0.706648) and B eight ways
    (g(1/8) = 0.014215): over their mean, u = 1.960562 and 0.039438. The label (the own vote) is '2', and B's first."""
    from rewards import METHODS, label_groups, restrain
    a = ["2", "2", "2", "2", "3", "3", "5", None]
    b = ["1", "2", "3", "4", "5", "6", "7", "8"]
    start = [["2"] * 6 + ["4", "4"], b]
    got = restrain([a, b], start)
    by_answer = [0.665009] * 4 + [-0.543366] * 2 + [-0.721279, -0.852026]
    assert got[0] == pytest.approx([1.960562 * x for x in by_answer], abs=5e-6)
    assert got[1] == pytest.approx([-0.5 * 0.039438] * 8, abs=1e-6)
    assert sum(got[0]) == pytest.approx(0, abs=1e-5)                       # the weighted advantages are centred
    assert label_groups("restrain", [a, b], [None, None], start)[0] == ["2", "1"]
    m = METHODS["restrain"]
    assert m.settings() == {"views": "original", "teacher_prompts": "same", "advantage_std": "given",
                            "ema_start": 1.0, "ema_end": 1.0} and m.kl_anchor == "start"
