"""The EMA teacher of Co-rewarding-II and -III (coreward2, coreward3, coreward2_rephrased).

Starting as a copy of the policy (same architecture and sharding), the teacher moves towards it after each step,

    teacher <- (1 - α) · teacher + α · policy,      α = 1 - decay(s / T)  after step s of T,

with the decay following the paper's cosine schedule (Eq. 11) from 0.99 to 0.9999 over training, so that the teacher
follows the policy quickly at first and then ever more slowly, a stabler version of the student (the official code ends
at 0.99999; `--ema_end` sets it). As in the official code, the policy is mixed in at the start of step s + 1, before
the teacher samples, with the decay at s / T (the same as at the end of step s: nothing uses the teacher in between).
The mix at s = 0 mixes two equal models, and the policy after the last step is never mixed in, as nothing samples from
the teacher after it (`ema_alpha`).

The teacher samples G responses per question through the policy's own rollout engine, its weights loaded into it, and
leaves it serving the teacher until the training loop loads the updated policy: two weight loads a step, not three. A
second vLLM engine would cost its own model copy, KV cache and runtime; a weight load is cheap (t_sync, metrics.jsonl).
"""
import math

import torch

from harness.sharding import reshard, sync_engine_weights


def ema_decay(step, total_steps, start, end):
    """Cosine schedule from `start` (step 0) to `end` (step total_steps)."""
    progress = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return end - (end - start) * (1 + math.cos(math.pi * progress)) / 2


def ema_alpha(step, total_steps, start, end):
    """α, the policy's weight in the teacher after `step` of `total_steps`: 1 - decay, and 0 after the last step."""
    return 1 - ema_decay(step, total_steps, start, end) if step < total_steps else 0.0


@torch.no_grad()
def ema_update(teacher, policy, alpha):
    reshard(teacher, policy)
    for t, p in zip(teacher.parameters(), policy.parameters(), strict=True):
        t.mul_(1 - alpha).add_(p.detach(), alpha=alpha)


def teacher_rollout(engine, teacher, prompt_ids, seeds, n, temperature, max_tokens):
    """The teacher's responses (`seeds`: rollout.request_seed's "teacher" role); the engine then serves the teacher."""
    sync_engine_weights(engine, teacher)
    return engine.generate(prompt_ids, n, temperature, max_tokens, seeds=seeds)
