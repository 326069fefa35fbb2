"""The watches: what a step's record says about the run's health. The collapse watch warns; the sampler gap's
watch warns on a jump and stops the run past its ceiling.
"""
from harness.errors import SamplerGapStop


class CollapseWatch:
    """Warns each time the label-free diagnostics, averaged over the last WINDOW steps, start to reach THRESHOLDS
    (study/README.md): unanimous groups or zero reward variance (no signal); responses without an answer or cut at the
    length limit (degenerate text); one majority answer for many questions (the reward hack of a vote)."""
    WINDOW = 10
    THRESHOLDS = {"unanimous": 0.8, "zero_variance": 0.8, "no_answer": 0.8, "truncated": 0.8, "common_answer": 0.2}

    def __init__(self):
        self.history, self.firing = [], False

    def update(self, record):
        """The warning to print after this step's record, or None."""
        self.history = (self.history + [record])[-self.WINDOW:]
        if len(self.history) < self.WINDOW:
            return None
        means = {k: sum(r.get(k, 0.0) for r in self.history) / self.WINDOW for k in self.THRESHOLDS}
        signs = [f"{k} {v:.2f}" for k, v in means.items() if v >= self.THRESHOLDS[k]]
        was, self.firing = self.firing, bool(signs)
        if signs and not was:
            return (f"warning: step {record['step']}: the policy may be collapsing ({', '.join(signs)} over the last "
                    f"{self.WINDOW} steps; limits {self.THRESHOLDS}): a label-free reward then rewards whatever its "
                    f"groups agree on. Check eval_acc; consider stopping or a lower --lr")
        return None


# The sampler gap a correct run of each precision cannot reach: fp32 on a CPU stayed at or under 5.1e-7 in every step
# of the classroom studies (47 runs); bf16 at or under 0.003 in study/bf16 (public reports for 4B models: 0.01-0.04).
# Each ceiling is far above that and below what an engine on stale weights soon reaches (study/bf16/README.md).
SAMPLER_GAP_CEILING = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.25}


class SamplerGapWatch:
    """The sampler gap (`sampler_gap`: the mean |engine - trainer| log-prob per token of the engine's own samples) as
    a health signal: a warning when it passes --sampler_gap_factor times the mean of the first BASELINE_STEPS steps,
    and again each time it doubles (bf16 kernels' gap may grow with training); a stop past the ceiling of the run's
    precision (SAMPLER_GAP_CEILING, or --max_sampler_gap). `first` goes into checkpoints: a resumed run keeps it."""
    BASELINE_STEPS = 3

    def __init__(self, ceiling, factor, first=()):
        self.ceiling, self.factor, self.first, self.warned = ceiling, factor, list(first), None

    @property
    def baseline(self):
        return sum(self.first) / len(self.first) if len(self.first) == self.BASELINE_STEPS else None

    def check(self, step, record):
        """Raises SamplerGapStop past the ceiling; returns a warning (a line) or None."""
        gap = record["sampler_gap"]
        if not gap <= self.ceiling:
            raise SamplerGapStop(f"step {step}: the rollout engine's log-probs differ from the trainer's by {gap:.3g} "
                               f"per token (> {self.ceiling:g}, the ceiling of a correct run in this precision: "
                               f"--max_sampler_gap): the engine is not running the trainer's weights. Check the "
                               f"weight sync (names and dtypes the engine expects); the run's metrics.jsonl shows "
                               f"the gap step by step")
        if self.baseline is None:
            self.first.append(gap)
            return None
        if gap > self.factor * self.baseline and (self.warned is None or gap > 2 * self.warned):
            self.warned = gap
            return (f"step {step}: the sampler gap is {gap:.3g} per token, {gap / self.baseline:.1f}x the mean of the "
                    f"run's first steps ({self.baseline:.3g}); the run goes on (it stops above {self.ceiling:g}). "
                    f"A gap that keeps growing suggests the engine misses part of the weights")
        return None
