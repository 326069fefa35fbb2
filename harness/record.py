"""A step's record: the line of metrics.jsonl train.py writes after each step (METRICS.md says what each metric means).

One row of RECORD a metric: its name, its kind (how every rank's part comes together), and this rank's part, a
function of what the step saw and did (`Step`). Mean(count): the parts' sum over ranks over the sum of a count
(COUNTS; with view=v, of view v's, and left out where no rank sampled it), None where a part is None (a label-free
method's label share) or the count is 0. Total: the sum over ranks. Gathered(then): every rank's parts, joined, then
`then` of them. Same: rank 0's own value (the gradient norm, the same on every rank; the learning rate). A new metric
is one row, e.g. ("overlong_penalty", Mean("responses"), lambda s: (s.shaped - s.rewards).sum().item()).

The accuracies against the gold answer (rollout_acc, label_acc) count the groups that have one (`graded_groups`): a
question without gold (harness/data.py keeps three) is in the reward and the diagnostics, not in those. Per view, as
the official Co-rewarding-III logs them: the label share and accuracy, the mean reward, the loss parts, the clip share.
"""
import dataclasses
import functools

import torch
import torch.distributed as dist

from harness.answers import answer_classes, is_equiv, majority_vote
from harness.sharding import all_sum

VIEW_NAMES = ("original", "rephrased")      # grpo.py's views 0 and 1


@dataclasses.dataclass
class ViewSums:
    """One view's part of LossSums."""
    loss_policy: float = 0.0
    loss_kl: float = 0.0
    loss_entropy: float = 0.0
    clipped: float = 0.0
    tokens: float = 0.0


@dataclasses.dataclass
class LossSums:
    """What grpo.train_step sums over a step's micro-batches on this rank, and the record reads (the contract between
    the two): token sums, and the loss and its parts as this rank's share of each update's loss (each view's in
    views[v]), the step's optimizer updates and the largest gradient norm before clipping."""
    updates: int
    grad_norm: float = 0.0
    tokens: float = 0.0
    loss_sum: float = 0.0
    kl_sum: float = 0.0
    entropy_sum: float = 0.0
    sampler_gap_sum: float = 0.0
    sampler_ratio_sum: float = 0.0
    sampler_capped_sum: float = 0.0
    clipped_low_sum: float = 0.0
    clipped_high_sum: float = 0.0
    views: list = dataclasses.field(default_factory=lambda: [ViewSums() for _ in VIEW_NAMES])


def add(sums, **parts):
    """sums.NAME += the sum of tensor `parts[NAME]`, for each name."""
    for name, value in parts.items():
        setattr(sums, name, getattr(sums, name) + value.sum().item())


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
    flat: torch.Tensor        # [groups] bool: the group's rewards are all equal (grpo.zero_variance)
    stats: LossSums           # grpo.train_step's sums
    view: list                # [groups] each group's view (0, 1)
    lr: float
    alpha: float | None       # the teacher's EMA weight (teacher methods)
    times: dict

    def of_view(self, v, values):
        """The entries of a [groups] list or tensor whose group is in view v."""
        return [x for x, w in zip(values, self.view) if w == v]

    @functools.cached_property
    def diagnostics(self):
        """What a run without labels can see of its groups, computed once a step (`group_diagnostics`)."""
        return group_diagnostics(self.answers)


def group_diagnostics(answers):
    """What a run without labels can see of its groups (answers: [groups][G], None: no answer), summed over them:
    unanimous, the groups whose every response answered, all with one answer; distinct, the classes of equal answers."""
    classes = [answer_classes(group) for group in answers]
    return {"unanimous": sum(len(c) == 1 and len(c[0]) == len(group) for c, group in zip(classes, answers)),
            "distinct": sum(len(c) for c in classes)}


def common_answer_share(votes):
    """The share of groups whose majority answer (`votes`; None: no answer, never the common one) is the most common
    among them: one answer whatever the question (a reward hack of every vote-based reward) drives it up."""
    if not votes:
        return 0.0
    return max((len(c) for c in answer_classes(votes)), default=0) / len(votes)


@dataclasses.dataclass(frozen=True)
class Mean:
    count: str                # a key of COUNTS
    view: int | None = None   # divide by the count of this view, and leave the metric out where no rank sampled it


@dataclasses.dataclass(frozen=True)
class Total:
    pass


@dataclasses.dataclass(frozen=True)
class Gathered:
    then: object              # [every rank's parts, joined] -> the metric


@dataclasses.dataclass(frozen=True)
class Same:
    pass


# The counts a Mean divides by, summed over ranks in the all-reduce of the sums: of the whole step, and of each view.
COUNTS = {
    "responses":        lambda s: s.rewards.numel(),
    "groups":           lambda s: len(s.groups),
    "graded_responses": lambda s: sum(len(grp) for grp, g in zip(s.answers, s.gold) if g is not None),
    "graded_groups":    lambda s: sum(g is not None for g in s.gold),             # those with a gold answer
    "tokens":           lambda s: s.stats.tokens,
    "updates":          lambda s: s.stats.updates,        # optimizer updates x ranks: the loss is their mean
}
VIEW_COUNTS = {
    "groups":           lambda s, v: s.view.count(v),
    "graded_groups":    lambda s, v: sum(g is not None for g in s.of_view(v, s.gold)),
    "responses":        lambda s, v: s.view.count(v) * s.rewards.shape[1],
    "tokens":           lambda s, v: s.stats.views[v].tokens,
}


def labelled(s, v=None):
    """The groups with a label (in view v), or None for a label-free method."""
    if s.labels is None:
        return None
    return float(sum(label is not None for label in (s.labels if v is None else s.of_view(v, s.labels))))


def rollout_correct(s):
    return sum(is_equiv(a, g) for grp, g in zip(s.answers, s.gold) for a in grp)


def label_correct(s, v=None):
    if s.labels is None:
        return None
    pairs = zip(s.labels, s.gold) if v is None else zip(s.of_view(v, s.labels), s.of_view(v, s.gold))
    return float(sum(is_equiv(label, g) for label, g in pairs))


#  metric               kind                  this rank's part
RECORD = [
    ("responses",         Total(),              lambda s: s.rewards.numel()),
    ("reward",            Mean("responses"),    lambda s: s.rewards.sum().item()),
    ("rollout_acc",       Mean("graded_responses"), rollout_correct),
    ("label_acc",         Mean("graded_groups"), label_correct),
    ("no_answer",         Mean("responses"),    lambda s: sum(a is None for grp in s.answers for a in grp)),
    # label-free: what a run without labels can watch (watches.CollapseWatch)
    ("unanimous",         Mean("groups"),       lambda s: s.diagnostics["unanimous"]),
    ("distinct_answers",  Mean("groups"),       lambda s: s.diagnostics["distinct"]),
    ("zero_variance",     Mean("groups"),       lambda s: int(s.flat.sum())),
    ("groups_dropped",    Mean("groups"),       lambda s: int((~s.keep).sum())),
    ("common_answer",     Gathered(common_answer_share), lambda s: [majority_vote(grp) for grp in s.answers]),
    ("group_rewards",     Gathered(list),       lambda s: [round(x, 4) for x in s.rewards.sum(1).tolist()]),
    ("truncated",         Mean("responses"),    lambda s: sum(not x.finished for grp in s.groups for x in grp)),
    ("kl",                Mean("tokens"),       lambda s: s.stats.kl_sum),
    ("entropy",           Mean("tokens"),       lambda s: s.stats.entropy_sum),
    ("response_len",      Mean("responses"),    lambda s: s.stats.tokens),
    ("clip_frac",         Mean("tokens"),       lambda s: s.stats.clipped_low_sum + s.stats.clipped_high_sum),
    ("grad_norm",         Same(),               lambda s: s.stats.grad_norm),
    ("lr",                Same(),               lambda s: s.lr),
    ("sampler_gap",       Mean("tokens"),       lambda s: s.stats.sampler_gap_sum),
    ("sampler_ratio",     Mean("tokens"),       lambda s: s.stats.sampler_ratio_sum),
    ("sampler_capped",    Mean("tokens"),       lambda s: s.stats.sampler_capped_sum),
    # the loss (the mean over the step's updates) and its parts as they enter it: policy + kl + entropy = loss
    ("loss",              Mean("updates"),      lambda s: s.stats.loss_sum),
    ("loss_policy",       Mean("updates"),      lambda s: sum(v.loss_policy for v in s.stats.views)),
    ("loss_kl",           Mean("updates"),      lambda s: sum(v.loss_kl for v in s.stats.views)),
    ("loss_entropy",      Mean("updates"),      lambda s: sum(v.loss_entropy for v in s.stats.views)),
    ("clip_frac_low",     Mean("tokens"),       lambda s: s.stats.clipped_low_sum),
    ("clip_frac_high",    Mean("tokens"),       lambda s: s.stats.clipped_high_sum),
    ("overlong_penalty",  Mean("responses"),    lambda s: (s.shaped - s.rewards).sum().item()),
    *[row for v, name in enumerate(VIEW_NAMES) for row in [
        (f"{name}/label_share",  Mean("groups", v),    lambda s, v=v: labelled(s, v)),
        (f"{name}/label_acc",    Mean("graded_groups", v), lambda s, v=v: label_correct(s, v)),
        (f"{name}/reward",       Mean("responses", v), lambda s, v=v: sum(map(sum, s.of_view(v, s.rewards.tolist())))),
        (f"{name}/loss_policy",  Mean("updates"),      lambda s, v=v: s.stats.views[v].loss_policy),
        (f"{name}/loss_kl",      Mean("updates"),      lambda s, v=v: s.stats.views[v].loss_kl),
        (f"{name}/clip_frac",    Mean("tokens", v),    lambda s, v=v: s.stats.views[v].clipped),
    ]],
]


def step_record_over_ranks(s, device, world_size):
    """A step's line of metrics.jsonl from every rank's `Step` (one all_sum of the Means, Totals and counts, then one
    all_gather_object per Gathered row, in RECORD's order)."""
    summed = {name: part(s) for name, kind, part in RECORD if isinstance(kind, (Mean, Total))}
    totals = all_sum({**{f"sum:{k}": v for k, v in summed.items() if v is not None},
                      **{f"count:{k}": count(s) for k, count in COUNTS.items()},
                      **{f"count:{k}:{v}": count(s, v) for k, count in VIEW_COUNTS.items()
                         for v in range(len(VIEW_NAMES))}}, device)
    record = {"step": s.step}
    for name, kind, part in RECORD:
        if isinstance(kind, Mean):
            per = totals[f"count:{kind.count}" + ("" if kind.view is None else f":{kind.view}")]
            if kind.view is not None and per == 0:                   # a view no rank sampled (or graded)
                continue
            record[name] = None if summed[name] is None or per == 0 else totals[f"sum:{name}"] / per
        elif isinstance(kind, Total):
            record[name] = int(totals[f"sum:{name}"])
        elif isinstance(kind, Gathered):
            everyone = [None] * world_size
            dist.all_gather_object(everyone, part(s))
            record[name] = kind.then([x for rank_parts in everyone for x in rank_parts])
        else:
            record[name] = part(s)
    return {**record, **s.times, **({"ema_alpha": s.alpha} if s.alpha is not None else {})}
