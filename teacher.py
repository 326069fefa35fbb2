"""The EMA teacher of Co-rewarding-II and -III (coreward2, coreward3, coreward2_rephrased).

The teacher has the policy's architecture and sharding and starts as a copy of it. After every
optimizer step it moves a little towards the policy,

    teacher <- (1 - α) · teacher + α · policy,      α = 1 - decay(s / T)  after step s of T,

with the decay following the paper's cosine schedule (Eq. 11), from 0.99 to 0.9999 over training:
the teacher follows the policy quickly at first and then ever more slowly, so that it is a
slowly-moving, stabler version of the student. (The official code ends at 0.99999; `--ema_end`
sets it.) The step's place is the official code's: it mixes the policy in at the start of step
s + 1, before the teacher samples, with the decay at s / T. Mixing at the end of step s is the
same, as nothing uses the teacher in between; the mix at the start of step 1 (s = 0) mixes two
equal models, and the policy after the last step is never mixed in, as no step after it
samples from the teacher (`ema_alpha`).

The teacher samples G responses per question through the policy's own rollout engine: its
weights are loaded into the engine and it samples. The engine is left serving the teacher: the
training loop loads the updated policy after the step, before anything samples from the policy
again, so a step makes two weight loads (teacher, updated policy), not three. One engine, not
two: a second vLLM engine would cost its own model copy, KV cache and runtime, while a weight load
is cheap (t_sync in metrics.jsonl is its time).
"""
import math

import torch

from harness.sharding import reshard, sync_engine_weights


def ema_decay(step, total_steps, start=0.99, end=0.9999):
    """Cosine schedule from `start` (step 0) to `end` (step total_steps)."""
    progress = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return end - (end - start) * (1 + math.cos(math.pi * progress)) / 2


def ema_alpha(step, total_steps, start=0.99, end=0.9999):
    """α, the policy's weight in the teacher after `step` of `total_steps` updates: 1 - decay(step / total_steps),
    and 0 after the last step (nothing samples from the teacher after it)."""
    return 1 - ema_decay(step, total_steps, start, end) if step < total_steps else 0.0


@torch.no_grad()
def ema_update(teacher, policy, alpha):
    """teacher <- (1 - alpha) * teacher + alpha * policy, shard by shard (the two are sharded alike)."""
    reshard(teacher, policy)
    for t, p in zip(teacher.parameters(), policy.parameters(), strict=True):
        t.mul_(1 - alpha).add_(p.detach(), alpha=alpha)


def teacher_rollout(engine, teacher, prompt_ids, seeds, n, temperature, max_tokens):
    """The teacher's responses (`seeds`: one per prompt, rollout.request_seed with role "teacher").
    The engine then serves the teacher, until the caller loads the policy."""
    sync_engine_weights(engine, teacher)
    return engine.generate(prompt_ids, n, temperature, max_tokens, seeds=seeds)
