"""A step's record: the line of metrics.jsonl that train.py writes after each step (METRICS.md says what each
metric means).

One row of RECORD a metric: its name, the collective that brings every rank's part of it together, this rank's
part (a function of the step's values, `Step`), and what the collective's result becomes:

    sum      all_sum: one all-reduce of every sum row's part and of every count (COUNTS), in float64; the metric
             is the global sum divided by the global count its row names (None: the sum itself). A part that is
             None (a label-free method's label share) makes the metric None. A per-view metric whose view no rank
             sampled is left out of the record.
    gather   all_gather_object: every rank's list of parts, joined, then the row's function of it.
    same     rank 0's own value: the same on every rank (the gradient norm, after clip_grad_norm_'s all-reduce),
             or rank 0's (the learning rate, the timings).

A new metric is one row, with its collective. For example, `overlong_penalty` (--overlong soft) is

    ("overlong_penalty", "sum", lambda s: (s.shaped - s.rewards).sum().item(), "responses"),

the mean of the penalty over the step's responses, 0 without the soft shaping.

Per view (the original questions, their rephrasings), as the official Co-rewarding-III logs them: the share of
groups with a label, the label's accuracy against the ground truth, the mean reward, and the view's parts of the
loss and its clip fraction. A one-view method logs the original's only.
"""
import dataclasses

import torch
import torch.distributed as dist

from answers import is_equiv, majority_vote
from rewards import common_answer_share, group_diagnostics
from sharding import all_sum

VIEW_NAMES = ("original", "rephrased")      # grpo.py's views 0 and 1


@dataclasses.dataclass
class Step:
    """What this rank's step saw and did: the record's rows are functions of it."""
    step: int
    groups: list              # [groups][G] rollout.Sample, the originals, then (two views) their rephrasings
    answers: list             # [groups][G] extracted answers (None: no answer)
    gold: list                # [groups] ground truth
    labels: list | None       # [groups] each group's label (None: none); None for a label-free method
    rewards: torch.Tensor     # [groups, G] the method's rewards
    shaped: torch.Tensor      # [groups, G] the rewards the advantages came from (--overlong soft shapes them)
    keep: torch.Tensor        # [groups] bool: kept by the group filter
    stats: dict               # grpo.train_step's sums
    view: list                # [groups] each group's view (0, 1)
    lr: float
    alpha: float | None       # the teacher's EMA weight (teacher methods)
    times: dict

    def of_view(self, v, values):
        """The entries of a [groups] list or tensor whose group is in view v."""
        return [x for x, w in zip(values, self.view) if w == v]


# Counts that the sums are divided by: summed over ranks in the same all-reduce.
COUNTS = {
    "responses": lambda s: s.rewards.numel(),
    "groups":    lambda s: len(s.groups),
    "tokens":    lambda s: s.stats["tokens"],
    "updates":   lambda s: s.stats["updates"],        # optimizer updates x ranks: the loss is their mean
    **{f"{what}/{v}": (lambda s, v=v, what=what: {"groups": s.view.count(v), "responses": s.view.count(v) *
                                                   s.rewards.shape[1], "tokens": s.stats[f"tokens/{v}"]}[what])
       for v in range(len(VIEW_NAMES)) for what in ("groups", "responses", "tokens")},
}


def labelled(s, v=None):
    """The groups with a label (in view v), or None for a label-free method."""
    if s.labels is None:
        return None
    labels = s.labels if v is None else s.of_view(v, s.labels)
    return float(sum(label is not None for label in labels))


def label_correct(s, v=None):
    if s.labels is None:
        return None
    pairs = zip(s.labels, s.gold) if v is None else zip(s.of_view(v, s.labels), s.of_view(v, s.gold))
    return float(sum(is_equiv(label, g) for label, g in pairs))


#  metric               over ranks  this rank's part                                                           per
RECORD = [
    ("responses",         "sum",    lambda s: s.rewards.numel(),                                              None),
    ("reward",            "sum",    lambda s: s.rewards.sum().item(),                                         "responses"),
    ("rollout_acc",       "sum",    lambda s: sum(is_equiv(a, g) for grp, g in zip(s.answers, s.gold) for a in grp),
                                                                                                              "responses"),
    ("label_acc",         "sum",    label_correct,                                                            "groups"),
    ("no_answer",         "sum",    lambda s: sum(a is None for grp in s.answers for a in grp),              "responses"),
    # label-free: what a run without labels can watch (run.CollapseWatch)
    ("unanimous",         "sum",    lambda s: group_diagnostics(s.answers, s.rewards)["unanimous"],           "groups"),
    ("distinct_answers",  "sum",    lambda s: group_diagnostics(s.answers, s.rewards)["distinct"],            "groups"),
    ("zero_variance",     "sum",    lambda s: group_diagnostics(s.answers, s.rewards)["zero_variance"],       "groups"),
    ("groups_dropped",    "sum",    lambda s: int((~s.keep).sum()),                                           "groups"),
    ("common_answer",     "gather", lambda s: [majority_vote(grp) for grp in s.answers],            common_answer_share),
    ("truncated",         "sum",    lambda s: sum(not x.finished for grp in s.groups for x in grp),           "responses"),
    ("kl",                "sum",    lambda s: s.stats["kl_sum"],                                              "tokens"),
    ("entropy",           "sum",    lambda s: s.stats["entropy_sum"],                                         "tokens"),
    ("response_len",      "sum",    lambda s: s.stats["tokens"],                                              "responses"),
    ("clip_frac",         "sum",    lambda s: s.stats["clipped_low_sum"] + s.stats["clipped_high_sum"],       "tokens"),
    ("grad_norm",         "same",   lambda s: s.stats["grad_norm"],                                           None),
    ("lr",                "same",   lambda s: s.lr,                                                           None),
    ("sampler_gap",       "sum",    lambda s: s.stats["sampler_gap_sum"],                                     "tokens"),
    ("sampler_ratio",     "sum",    lambda s: s.stats["sampler_ratio_sum"],                                   "tokens"),
    ("sampler_capped",    "sum",    lambda s: s.stats["sampler_capped_sum"],                                  "tokens"),
    # the loss (the mean over the step's updates) and its parts as they enter it: policy + kl + entropy = loss
    ("loss",              "sum",    lambda s: s.stats["loss_sum"],                                            "updates"),
    ("loss_policy",       "sum",    lambda s: sum(s.stats[f"loss_policy_sum/{v}"] for v in (0, 1)),          "updates"),
    ("loss_kl",           "sum",    lambda s: sum(s.stats[f"loss_kl_sum/{v}"] for v in (0, 1)),              "updates"),
    ("loss_entropy",      "sum",    lambda s: sum(s.stats[f"loss_entropy_sum/{v}"] for v in (0, 1)),         "updates"),
    ("clip_frac_low",     "sum",    lambda s: s.stats["clipped_low_sum"],                                     "tokens"),
    ("clip_frac_high",    "sum",    lambda s: s.stats["clipped_high_sum"],                                    "tokens"),
    ("overlong_penalty",  "sum",    lambda s: (s.shaped - s.rewards).sum().item(),                            "responses"),
    *[row for v, name in enumerate(VIEW_NAMES) for row in [
        (f"{name}/label_share",  "sum", lambda s, v=v: labelled(s, v),                                        f"groups/{v}"),
        (f"{name}/label_acc",    "sum", lambda s, v=v: label_correct(s, v),                                   f"groups/{v}"),
        (f"{name}/reward",       "sum", lambda s, v=v: sum(sum(r) for r in s.of_view(v, s.rewards.tolist())),
                                                                                                              f"responses/{v}"),
        (f"{name}/loss_policy",  "sum", lambda s, v=v: s.stats[f"loss_policy_sum/{v}"],                       "updates"),
        (f"{name}/loss_kl",      "sum", lambda s, v=v: s.stats[f"loss_kl_sum/{v}"],                           "updates"),
        (f"{name}/clip_frac",    "sum", lambda s, v=v: s.stats[f"clipped_sum/{v}"],                           f"tokens/{v}"),
    ]],
]


def step_record_over_ranks(s, device, world_size):
    """A step's line of metrics.jsonl from every rank's `Step` (RECORD's collectives, in its order: one all_sum, then
    one all_gather_object per gather row)."""
    parts = {name: part(s) for name, over, part, _ in RECORD if over == "sum"}
    sums = all_sum({**{k: v for k, v in parts.items() if v is not None},
                    **{f"count:{k}": count(s) for k, count in COUNTS.items()}}, device)
    record = {"step": s.step}
    for name, over, part, then in RECORD:
        if over == "sum":
            per = sums[f"count:{then}"] if then else 1
            if then and per == 0 and "/" in then:            # a view no rank sampled
                continue
            record[name] = None if parts[name] is None else sums[name] / per if then else int(sums[name])
        elif over == "gather":
            everyone = [None] * world_size
            dist.all_gather_object(everyone, part(s))
            record[name] = then([x for rank_parts in everyone for x in rank_parts])
        else:
            record[name] = part(s)
    return {**record, **s.times, **({"ema_alpha": s.alpha} if s.alpha is not None else {})}
