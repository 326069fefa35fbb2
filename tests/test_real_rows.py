"""Every row of every shipped training set (data/train/) through every answer-based method's labels and rewards, as
train.sample_and_reward calls them, in steps of P questions: the classroom's rows all have a gold answer, the real
files' do not (openrs row 4303, math rows 5341 and 5343 are kept as answer=None, harness/data.py), and a run must
neither stop on such a row nor reward it against a label it does not have.

Each group's G = 4 responses answer [its gold, its gold, the next question's gold, nothing]; the teacher answers the
same; a step's groups are its originals, then (a method trained on both views) their rephrasings.
"""
import functools

import pytest

import grpo
from harness import data
from harness.answers import is_equiv
from harness.record import Step, label_correct
from rewards import METHODS, agreement, label_groups
from rollout import request_seed

SHIPPED = [*data.SHIPPED_PAIRS, *data.SHIPPED_VERL_PAIRS]
ANSWER_BASED = [name for name, method in METHODS.items() if method.labels is not None]
P = 128                                        # the seed run's questions a step
UNLABELED = {"openrs": [4303], "math": [5341, 5343], "dapo": [], "amc_ttt": []}


@functools.cache
def shipped(source):
    return data.load_training(source, "both")[0]


def responses(golds):
    """[groups][4] the synthetic answers of the module's docstring, for groups whose gold answers are `golds`."""
    return [[g, g, golds[(i + 1) % len(golds)], None] for i, g in enumerate(golds)]


def step_rewards(method, questions, step):
    """(gold, labels, rewards) of one step on `questions`, as train.sample_and_reward computes them."""
    m = METHODS[method]
    views = (0, 1) if m.views == "both" else (0,)
    gold = [q.answer for q in questions] * len(views)
    answers = responses(gold)
    teacher = responses([q.answer for q in questions] * 2)[len(questions):] if m.teacher == "rephrased" else answers
    coins = [request_seed(0, "reward", step, i, view) for view in views for i in range(len(questions))]
    labels, voters = label_groups(method, answers, gold, teacher if m.teacher else None)
    replayed = [sum(r) for r in agreement(answers, label_groups("coreward1", answers, gold)[0])] \
        if m.views == "both" else None                         # matched_coin's: a coreward1 step's group rewards
    return gold, labels, grpo.call(m.reward, answers=answers, labels=labels, voters=voters, seeds=coins,
                                   teacher_answers=teacher if m.teacher else None, replayed=replayed)


@pytest.mark.parametrize("source", SHIPPED)
def test_every_shipped_row_labels_and_rewards_with_every_method(source):
    pairs = shipped(source)
    assert [i for i, p in enumerate(pairs) if p.answer is None] == UNLABELED[source]
    for method in ANSWER_BASED:
        for step, start in enumerate(range(0, len(pairs), P)):
            questions = pairs[start:start + P]
            gold, labels, rewards = step_rewards(method, questions, step)
            assert len(rewards) == len(gold) and all(len(r) == 4 for r in rewards)
            if method == "restrain":         # its own advantages: centred, or a group's penalty
                assert all(abs(sum(r)) < 1e-5 or max(r) < 0 for r in rewards), (source, start)
            else:
                assert all(set(r) <= {0.0, 1.0} for r in rewards), (source, method, start)
            for g, label, r in zip(gold, labels, rewards):
                if g is None and METHODS[method].labels in ("gold", "a wrong answer"):    # unlabeled: no reward
                    assert label is None and r == [0.0] * 4, (source, method, start)
            if method == "gt":               # the gold labels: its own two responses right, the blank one wrong
                assert labels == gold and all(r[:2] == [float(g is not None)] * 2 and r[3] == 0.0
                                              for g, r in zip(gold, rewards))


def test_a_group_without_gold_is_left_out_of_label_acc_and_rollout_acc(dist_world):
    """gt's label is the gold answer: on a step that draws openrs row 4303, its record's label_acc is 1 (7 of the 7
    groups with a gold answer), where counting the gold-less group as a wrong label gave 7/8; rollout_acc is 2 of each
    graded group's 4 responses (its third answers the next question's gold, none equal to its own here)."""
    import types
    import torch
    from harness.record import LossSums, step_record_over_ranks
    pairs = shipped("openrs")[4303 - 5:4303 + 3]                  # 8 questions, row 4303 the sixth
    gold, labels, rewards = step_rewards("gt", pairs, 1)
    stats = LossSums(updates=1, tokens=1.0)                                                    # not read here
    step = Step(1, [[types.SimpleNamespace(finished=True)] * 4] * 8, responses(gold), gold, labels,
                torch.tensor(rewards), torch.tensor(rewards), torch.ones(8, dtype=torch.bool),
                torch.zeros(8, dtype=torch.bool), stats, [0] * 8, 0.0, None, {})
    record = step_record_over_ranks(step, torch.device("cpu"), 1)
    assert gold[5] is None and label_correct(step) == 7
    assert record["label_acc"] == record["original/label_acc"] == 1.0 and record["rollout_acc"] == 0.5
    assert record["original/label_share"] == 7 / 8 and record["reward"] == 14 / 32
