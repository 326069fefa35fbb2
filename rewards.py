"""Rewards: who labels a response, and the reward it gets. A method is one row of METHOD_TABLE.

An answer-based method gives a response reward 1 when its final answer (the last \\boxed{...}) is mathematically equal
to its group's label, else 0 (`agreement`); a response without an answer, or a group without a label (none of its
voters answered), gets 0. The label is the majority answer of the group's voters, and methods differ in who votes (the
label source, LABEL_SOURCES):

    gold                       the ground truth (RLVR, `gt`; the upper baseline)
    own vote                   the group's own G responses (TTRL / SRT, `majority`)
    other view's vote          the G responses to the other view of the question: the rephrasing's vote labels the
                               original's responses, and vice versa (Co-rewarding-I, `coreward1`)
    teacher's vote             G responses of the EMA teacher (teacher.py) to the policy's prompts (Co-rewarding-II,
                               `coreward2`), or to their rephrasings, the policy training on the originals only
                               (`coreward2_rephrased`: the official Co-rewarding-II code with data.use_aug=True)
    teacher's other-view vote  the teacher answers both views, and its vote on each group's other view labels it
                               (Co-rewarding-III, `coreward3`, as the authors' Co-rewarding-III/ code does)
    both views' vote           the 2G responses to both views vote together, and their majority labels both groups
                               (`coreward1_union`, a variant)
    both views' harmony        the answer with the highest harmonic mean of its shares of the original's G answers
                               and of the rephrasing's labels both groups (Self-Harmony, Wang et al. 2025, the
                               closest rival of Co-rewarding-I, `self_harmony`; `harmonic_vote`)
    a coin                     no one: a fair coin per response, seeded by its group (run seed, step, question, view),
                               blind to the answer (`random`, the control of Spurious Rewards, Shao et al. 2025)
    a wrong answer             the gold answer plus one: a label consistently wrong (`wrong_label`, a control)

Two more controls break the link of Co-rewarding-I's rewards to the responses and keep their number: `matched_coin`
replays a coreward1 run of the same seed (`--replay RUN`), giving each group as many 1s as that run's group of the same
question and view had at that step, at places drawn by the group's coin seed; `permuted` shuffles its own coreward1
rewards over a rank's responses of the step (seeded by the first group's coin seed).

A vote over both views takes the original's answers first, then the rephrasing's, for either group, so that the tie
rule (majority_vote, harness/answers.py: the class whose first member came first) gives the two groups one label.

RESTRAIN (`restrain`, Yu et al. 2025) weighs every answer of the group's own vote by its share, penalises every
response of a group without consensus, and weighs each prompt by the start model's consistency on it (`restrain`).

Two baselines need no answer (label source None): a response's reward is its token mean of a value of the policy's
distribution (grpo.score_responses): KL(Uniform || p) for `self_certainty` (Intuitor), -entropy for `entropy` (RENT).

A step's groups come as one flat list: [0, P) the original questions and, when the run samples both views
(`--views both`: always for the methods labelled by the other view), [P, 2P) their rephrasings, so group i's twin is
`twin(i) = (i + P) mod 2P`. The other methods train on the originals only by default, as the official scripts do;
with both views they label the two as independent questions, and train on J(q) + J(q') too. The teacher's groups come in the order of its prompts.

A new reward is one function beside `agreement` or `self_certainty` (Method.reward: what it takes), and a row.

Departure from the official code: answers are compared and voted on as mathematics (harness/answers.py), not as
strings, so "\\frac12", "0.5" and "1/2" are one answer; the official reward managers vote on the strings and reward a
string equal to the label (Co-rewarding-III's `_answers_equal` strips spaces). An empty \\boxed{} is no answer in both.
"""
import dataclasses
import math
from fractions import Fraction
from typing import Callable

import torch

from grpo import group_advantages
from harness.answers import answer_class_indices, is_equiv, majority_vote
from harness.errors import InputError


# --------------------------------------------------------------------------------------------
# Rewards: of a response's answer, given its group's label and voters; or of its tokens

def agreement(answers, labels):
    """[groups][G] rewards in {0, 1}: 1 when the answer equals the group's label (the voters' majority)."""
    return [[float(label is not None and a is not None and is_equiv(a, label)) for a in group]
            for group, label in zip(answers, labels)]


def matched_coin(answers, seeds, replayed):
    """[groups][G] rewards in {0, 1}, blind to the answers: group i gets as many 1s as the replayed run's group i had at
    this step (`--replay`: its group_rewards), at the places its coin seed draws."""
    if len(replayed) != len(answers) or any(not 0 <= c <= len(g) or c != round(c) for c, g in zip(replayed, answers)):
        raise InputError(f"matched_coin: the replayed step's group rewards {replayed} are not counts of 1s for these "
                         f"{len(answers)} groups: replay a run of an answer-based method with this run's batch")
    return [(torch.randperm(len(group), generator=torch.Generator().manual_seed(seed)) < round(count)).float().tolist()
            for group, seed, count in zip(answers, seeds, replayed)]


def permuted(answers, labels, seeds):
    """[groups][G] the agreement rewards of the given groups, shuffled over their responses (first group's seed)."""
    flat = torch.tensor(agreement(answers, labels)).flatten()
    order = torch.randperm(len(flat), generator=torch.Generator().manual_seed(seeds[0]))
    return flat[order].view(len(answers), -1).tolist()


def coin_flip(answers, seeds):
    """[groups][G] rewards in {0, 1}: a fair coin per response from its group's seed (request_seed's "reward" role)."""
    return [torch.randint(0, 2, (len(group),), generator=torch.Generator().manual_seed(seed)).float().tolist()
            for group, seed in zip(answers, seeds)]


def self_certainty(logp_all):
    """KL(U || p) = -log V - (1/V) sum_v log p(v) of each token's distribution: logp_all [c, V] -> [c]."""
    return -math.log(logp_all.shape[-1]) - logp_all.mean(-1)


def negative_entropy(logp_all):
    """-H(p) = sum_v p(v) log p(v) of each token's distribution: logp_all [c, V] -> [c]."""
    return torch.linalg.vecdot(logp_all.exp(), logp_all)


# RESTRAIN (Yu et al. 2025, arXiv 2510.02172): g(f) = exp(-(f - centre)^2 / (2 width^2)) weighs a vote share f; a
# group whose largest class of equal answers holds fewer than κ of its G answers gets every advantage -δ. The paper's
# values were not to be read here: these are this project's, for G = 8 (study/README.md).
RESTRAIN_CENTRE, RESTRAIN_WIDTH, RESTRAIN_KAPPA, RESTRAIN_DELTA = 1.0, 0.3, 3, 0.5


def consistency(share):
    """RESTRAIN's g of a vote share: 1 for a unanimous group, less the more its answers are split."""
    return math.exp(-(share - RESTRAIN_CENTRE) ** 2 / (2 * RESTRAIN_WIDTH ** 2))


def restrain(answers, teacher_answers):
    """[groups][G] RESTRAIN's advantages (its row sets --advantage_std given), from the group's own answers and the G
    answers of the frozen start model (its teacher, EMA decay 1) to the same prompt:
    - pseudo-label weighting: every class j of equal answers, of share f_j, is a label of weight w_j = g(f_j) / Σ g;
      the advantage is Σ_j w_j A_ij, A_ij GRPO's advantage of the rewards 1[answer i in class j];
    - negative rollout penalization: a group whose largest class holds fewer than κ answers: every advantage -δ;
    - prompt-level weighting: the advantages times u = g(the start model's largest share), over its mean on the step's
      groups (the loss's scale unchanged, as a weighted token mean would leave it).
    Departures: u is estimated from the start model's G samples at each visit of a prompt, not once; it scales the
    advantages, not the KL term; Σ_j w_j A_ij is one advantage, equal to the paper's sum of clipped terms where no
    clip binds (one update a step)."""
    u = torch.tensor([consistency(max(map(len, answer_class_indices(start)), default=0) / len(start))
                      for start in teacher_answers])                                             # [groups]
    out = []
    for group, u in zip(answers, (u / u.mean()).tolist()):
        g, classes = len(group), answer_class_indices(group)
        if max(map(len, classes), default=0) < RESTRAIN_KAPPA:
            out.append([-RESTRAIN_DELTA * u] * g)
            continue
        member = torch.zeros(len(classes), g)                                  # [classes, G] 1[answer i in class j]
        for j, members in enumerate(classes):
            member[j, members] = 1.0
        w = torch.tensor([consistency(len(members) / g) for members in classes])                  # [classes]
        out.append((u * (w[:, None] / w.sum() * group_advantages(member)).sum(0)).tolist())      # [G]
    return out


# --------------------------------------------------------------------------------------------
# The methods

def harmonic_vote(voters):
    """Self-Harmony's label of the original's G answers followed by the rephrasing's G: the first member of the class
    of equal answers with the highest harmonic mean 2 p p' / (p + p') of its shares p, p' of each view's G answers (a
    tie: the earliest class); None where no answer is in both views (every harmonic mean 0). Exact, in Fractions."""
    g = len(voters) // 2
    best, top = None, Fraction(0)
    for members in answer_class_indices(voters):
        p, p_rephrased = Fraction(sum(i < g for i in members), g), Fraction(sum(i >= g for i in members), g)
        harmonic = 2 * p * p_rephrased / (p + p_rephrased)
        if harmonic > top:
            best, top = voters[members[0]], harmonic
    return best


@dataclasses.dataclass(frozen=True)
class LabelSource:
    voters: str            # "gold", "policy", "teacher", "wrong" (wrong_answer of the gold) or "coin" (no one votes)
    views: str             # which views vote: its "own", its twin's ("other") or "both" (original's, then rephrasing's)
    vote: Callable = majority_vote     # the voters' answers -> the label


LABEL_SOURCES = {
    "gold":                      LabelSource("gold", "own"),
    "own vote":                  LabelSource("policy", "own"),
    "other view's vote":         LabelSource("policy", "other"),
    "both views' vote":          LabelSource("policy", "both"),
    "both views' harmony":       LabelSource("policy", "both", harmonic_vote),
    "teacher's vote":            LabelSource("teacher", "own"),
    "teacher's other-view vote": LabelSource("teacher", "other"),
    "a coin":                    LabelSource("coin", "own"),
    "a wrong answer":            LabelSource("wrong", "own"),
}


def wrong_answer(gold):
    """A wrong label for a gold answer: its value plus one, as text ('7' -> '8', '\\frac12' -> '(\\frac12)+1'); None
    for a question without gold (harness/data.py keeps three such rows): it is unlabeled, as under `gt`."""
    if gold is None:
        return None
    return str(int(gold) + 1) if gold.lstrip("-").isdigit() else f"({gold})+1"


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    labels: str | None     # the label source (LABEL_SOURCES); None: an answer-free reward of the tokens
    views: str             # the views it trains on unless --views says otherwise: "original", or "both"
    teacher: str | None    # what the teacher answers (--teacher_prompts): the "same" prompts, or "rephrased"; None
    kl_anchor: str         # the KL term's reference: the frozen "start" model, or the EMA "teacher"
    kl_coef: float | None  # β of the KL term (--kl_coef); None: the preset's
    reward: Callable       # labels: (answers, labels, voters, seeds: those it names) -> [groups][G]; none: (logp_all
                           # [c, V]) -> [c]
    two_view: bool = dataclasses.field(init=False)   # labelled by the other view's answers: it needs --views both

    def __post_init__(self):
        source = LABEL_SOURCES.get(self.labels) if self.labels is not None else None
        if self.labels is not None and source is None:
            raise ValueError(f"method {self.name}: unknown label source {self.labels!r}; one of "
                             f"{', '.join(LABEL_SOURCES)}, or None for a reward of the tokens")
        object.__setattr__(self, "two_view", source is not None and source.views != "own")     # frozen: set here
        if self.views not in ("original", "both") or (self.two_view and self.views != "both"):
            raise ValueError(f"method {self.name}: views {self.views!r} must be 'original' or 'both', and 'both' "
                             f"when the other view labels")
        if self.teacher not in (None, "same", "rephrased") or self.kl_anchor not in ("start", "teacher"):
            raise ValueError(f"method {self.name}: teacher {self.teacher!r} must be None, 'same' or 'rephrased', "
                             f"and kl_anchor {self.kl_anchor!r} 'start' or 'teacher'")
        if self.teacher is None and (self.kl_anchor == "teacher" or (source and source.voters == "teacher")):
            raise ValueError(f"method {self.name} votes or anchors with the teacher: it needs teacher 'same' or "
                             f"'rephrased'")

    def settings(self):
        """The run settings the method sets (config.py: they override the preset's, a flag overrides them)."""
        return {**{k: v for k, v in (("views", self.views), ("teacher_prompts", self.teacher), ("kl_coef", self.kl_coef))
                   if v is not None}, **MORE_SETTINGS.get(self.name, {})}


# Settings a method sets beyond its row's: RESTRAIN computes its advantages, and its teacher is the start model, frozen.
MORE_SETTINGS = {"restrain": {"advantage_std": "given", "ema_start": 1.0, "ema_end": 1.0}}


# README.md's list of methods is this table. A new row goes last: study/plot.py colours methods by their place here.
#  method                 label source                 views       teacher      KL anchor  β      reward
METHOD_TABLE = [
    ("gt",                  "gold",                      "original", None,        "start",   None,  agreement),
    ("majority",            "own vote",                  "original", None,        "start",   None,  agreement),
    ("coreward1",           "other view's vote",         "both",     None,        "start",   None,  agreement),
    ("coreward2",           "teacher's vote",            "original", "same",      "teacher", 0.001, agreement),
    ("coreward3",           "teacher's other-view vote", "both",     "same",      "teacher", 0.001, agreement),
    ("coreward2_rephrased", "teacher's vote",            "original", "rephrased", "teacher", 0.001, agreement),
    ("self_certainty",      None,                        "original", None,        "start",   None,  self_certainty),
    ("entropy",             None,                        "original", None,        "start",   None,  negative_entropy),
    ("coreward1_union",     "both views' vote",          "both",     None,        "start",   None,  agreement),
    ("random",              "a coin",                    "original", None,        "start",   None,  coin_flip),
    ("self_harmony",        "both views' harmony",       "both",     None,        "start",   None,  agreement),
    ("matched_coin",        "a coin",                    "both",     None,        "start",   None,  matched_coin),
    ("permuted",            "other view's vote",         "both",     None,        "start",   None,  permuted),
    ("wrong_label",         "a wrong answer",            "original", None,        "start",   None,  agreement),
    ("restrain",            "own vote",                  "original", "same",      "start",   None,  restrain),
]
METHODS = {name: Method(name, *facts) for name, *facts in METHOD_TABLE}


# --------------------------------------------------------------------------------------------
# Labels

def twin(i, n_groups):
    """The group holding the other view of group i's question."""
    return (i + n_groups // 2) % n_groups


def label_groups(method, answers, ground_truth, teacher_answers=None):
    """(labels, voters): one label per group, and the answers that voted for it (the method's label source).

    answers: [groups][G] extracted answers (None where there is none), in the step's order (the module docstring);
    ground_truth: [groups] gold answers (`gt`'s label; every method's metrics); teacher_answers: [groups][G] the
    teacher's. A vote's label is the largest class of equal answers (majority_vote), a plurality of one too: a group
    of G different answers is labelled by its first. A question without gold (None) is unlabeled under `gt` and
    `wrong_label`, and labelled as any other by the votes."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    m = METHODS[method]
    if m.labels is None:
        raise ValueError(f"{method} has no labels: its reward is a value of the response's tokens")
    source, n = LABEL_SOURCES[m.labels], len(answers)
    if source.views != "own" and n % 2:
        raise ValueError(f"{method} needs each question's rephrasing: an even number of groups (originals, then "
                         f"rephrasings), got {n}")
    if source.voters == "teacher" and (teacher_answers is None or len(teacher_answers) != n):
        raise ValueError(f"{method} needs the teacher's answers for each of the {n} groups")
    voters = (answers if source.voters == "policy" else                          # the source's voters only
              teacher_answers if source.voters == "teacher" else
              [[g] for g in ground_truth] if source.voters == "gold" else
              [[wrong_answer(g)] for g in ground_truth] if source.voters == "wrong" else
              [[] for _ in answers])                                              # "coin": no one votes
    if source.views == "other":
        voters = [voters[twin(i, n)] for i in range(n)]   # the other view's answers
    elif source.views == "both":                          # the original's answers, then the rephrasing's: one label
        voters = [voters[min(i, twin(i, n))] + voters[max(i, twin(i, n))] for i in range(n)]
    labels = list(ground_truth) if source.voters == "gold" else [source.vote(group) for group in voters]
    return labels, voters
