"""Rewards: who labels a response, and the reward it gets.

Every answer-based method gives a response reward 1 when its final answer (the last
\\boxed{...}) is mathematically equal to its question's label, and 0 otherwise; a response
without an answer, or a question without a label (no response of the voters answered), gets 0.
Methods differ only in where the label comes from:

    gt         the ground truth (RLVR; uses labels, the upper baseline)
    majority   the majority answer over the question's own G responses (TTRL / SRT)
    coreward1  the majority answer over the G responses to the *other view* of the question:
               the rephrased view's vote labels the original's responses, and vice versa
               (Co-rewarding-I)

A step's groups come as one flat list over views: groups [0, P) are the original questions
and [P, 2P) their rephrasings, so group i's twin is `twin(i) = (i + P) mod 2P`. All methods
sample both views, so that they spend the same compute and differ in the reward alone; the
baselines treat the two views as two independent questions.

Departure from the official code: answers are compared and voted on as mathematics
(answers.py), not as raw strings, so "\\frac12", "0.5" and "1/2" are one answer.
"""
from answers import extract_answer, is_equiv, majority_vote  # noqa: F401  (re-exported API)

METHODS = ("gt", "majority", "coreward1")


def check_method(method):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def twin(i, n_groups):
    """The group holding the other view of group i's question."""
    return (i + n_groups // 2) % n_groups


def labels_for(method, answers, ground_truth):
    """One label per group.

    answers: [2P][G] extracted answers (None where a response has none), originals first.
    ground_truth: [2P] gold answers (used by `gt`, and by the metrics of every method).
    """
    check_method(method)
    n = len(answers)
    if n % 2:
        raise ValueError(f"expected an even number of groups (originals, then rephrasings), got {n}")
    if method == "gt":
        return list(ground_truth)
    votes = [majority_vote(group) for group in answers]
    if method == "majority":
        return votes
    return [votes[twin(i, n)] for i in range(n)]     # coreward1: the other view's vote


def rewards_for(answers, labels):
    """[2P][G] rewards in {0, 1}: 1 when the answer equals the group's label."""
    return [[float(label is not None and a is not None and is_equiv(a, label)) for a in group]
            for group, label in zip(answers, labels)]
