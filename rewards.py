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
    coreward2  the majority answer over G responses of the EMA teacher (teacher.py) to the
               same question (Co-rewarding-II)
    coreward3  the majority answer over G teacher responses to the question's rephrasing;
               the policy samples and trains on the original questions only (the two
               combined, as the official Co-rewarding-II code does with data.use_aug=True)
    coreward3_both  this project's variant of coreward3: the policy trains on both views,
               each labelled by the teacher's vote on the other view

Two baselines need no answer at all; their reward is computed from the policy's own token
distributions over the response (`certainty_per_token`):

    self_certainty   mean over response tokens of KL(Uniform || p)   (Intuitor)
    entropy          minus the mean token entropy                  (RENT)

A step's groups come as one flat list: groups [0, P) are the original questions and, when the
run samples both views (`--views both`: the two-view methods coreward1 and coreward3_both
always, the others on request), [P, 2P) their rephrasings, so group i's twin is
`twin(i) = (i + P) mod 2P`. The other methods train on the original questions only by default,
as the official scripts do; with both views they treat the two as independent questions. The
teacher's groups come in the same order as the policy's: for coreward3 group i of the teacher
answered the rephrasing of the policy's group i.

Departure from the official code: answers are compared and voted on as mathematics
(answers.py), not as raw strings, so "\\frac12", "0.5" and "1/2" are one answer.
"""
import math

import torch

from answers import answer_classes, is_equiv, majority_vote

METHODS = ("gt", "majority", "coreward1", "coreward2", "coreward3", "coreward3_both", "self_certainty", "entropy")
TEACHER_METHODS = ("coreward2", "coreward3", "coreward3_both")   # label with the EMA teacher's votes
TWO_VIEW_METHODS = ("coreward1", "coreward3_both")               # label each view with the other's vote
ANSWER_FREE_METHODS = ("self_certainty", "entropy")  # reward from the policy's token distributions


def check_method(method):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def twin(i, n_groups):
    """The group holding the other view of group i's question."""
    return (i + n_groups // 2) % n_groups


def labels_for(method, answers, ground_truth, teacher_answers=None):
    """One label per group.

    answers: [groups][G] extracted answers (None where a response has none), originals first, then
      (the two-view methods: always) their rephrasings.
    ground_truth: [groups] gold answers (used by `gt`, and by the metrics of every method).
    teacher_answers: [groups][G] the teacher's answers, group for group (teacher methods only): to the
      same prompts, or for coreward3 to their rephrasings.

    A vote's label is the largest class of equal answers (answers.majority_vote): a tie goes to the class
    whose first member came first, and a plurality of one labels, so that a group of G different answers
    is labelled by its first. A group without any answer gives no label (None: its responses get 0).
    """
    check_method(method)
    n = len(answers)
    if method in TWO_VIEW_METHODS and n % 2:
        raise ValueError(f"{method} needs each question's rephrasing: an even number of groups (originals, then "
                         f"rephrasings), got {n}")
    if method in ANSWER_FREE_METHODS:
        raise ValueError(f"{method} has no labels: its reward comes from certainty_per_token")
    if method == "gt":
        return list(ground_truth)
    if method in TEACHER_METHODS:
        if teacher_answers is None or len(teacher_answers) != n:
            raise ValueError(f"{method} needs the teacher's answers for each of the {n} groups")
        answers = teacher_answers
    votes = [majority_vote(group) for group in answers]
    if method not in TWO_VIEW_METHODS:
        return votes                                  # the vote on the same group (coreward3: on its rephrasing)
    return [votes[twin(i, n)] for i in range(n)]      # the other view's vote


def rewards_for(answers, labels):
    """[groups][G] rewards in {0, 1}: 1 when the answer equals the group's label."""
    return [[float(label is not None and a is not None and is_equiv(a, label)) for a in group]
            for group, label in zip(answers, labels)]


def certainty_per_token(method, logp_all):
    """The answer-free reward of each response token, from the policy's log-probs over the vocabulary
    logp_all [c, V] at that token's position -> [c]; a response's reward is the mean over its tokens
    (grpo.score_responses, which computes them chunk by chunk, never for a whole batch at once):
      self_certainty: KL(U || p) = -log V - (1/V) sum_v log p(v)
      entropy:        -H(p)      = sum_v p(v) log p(v)
    """
    if method == "self_certainty":
        return -math.log(logp_all.shape[-1]) - logp_all.mean(-1)
    if method == "entropy":
        return torch.linalg.vecdot(logp_all.exp(), logp_all)
    raise ValueError(f"{method} is not an answer-free method ({', '.join(ANSWER_FREE_METHODS)})")


def group_diagnostics(answers, rewards):
    """What a run without labels can see of its groups, summed over the groups given (the caller
    sums over ranks and divides by the number of groups):
      unanimous:      groups whose every response answered, all with one answer;
      distinct:       distinct answers (classes of equal answers; no answer is not one), summed;
      zero_variance:  groups whose rewards are all equal: zero advantages, no learning signal.
    answers: [groups][G] extracted answers (None: no answer); rewards: [groups, G]."""
    classes = [answer_classes(group) for group in answers]
    return {
        "unanimous": sum(len(c) == 1 and len(c[0]) == len(group) for c, group in zip(classes, answers)),
        "distinct": sum(len(c) for c in classes),
        "zero_variance": int((rewards == rewards[:, :1]).all(-1).sum()),
    }


def common_answer_share(votes):
    """The share of groups whose majority answer is the most common one among them: a policy that
    gives one answer whatever the question (a reward hack of every vote-based reward) drives it
    up, while on distinct questions it stays small. votes: each group's majority answer (None:
    the group answered nothing; counted in the denominator, never as the common answer)."""
    if not votes:
        return 0.0
    classes = answer_classes(votes)
    return max((len(c) for c in classes), default=0) / len(votes)
