"""GRPO steps of a fixed model on a fixed global batch, each rank taking its share of it.

    torchrun --nproc_per_node=N tests/ranks_worker.py OUT.pt

The global batch holds 8 sequences: the first half short responses, the second half long ones,
so that two ranks hold different token counts. Each case starts from fresh models:

- `one_update`: one step, one update;
- `two_updates`: one step, two mini-batches in a fixed order, such that the one-rank mini-batch k
  is exactly the union of the ranks' mini-batch k;
- `token_budget`: the same by a budget of 14 padded tokens per pass: per update, the rank with the
  short rows (5 and 6 tokens) packs one pass and the other (9 and 10) two, so the first splits its
  pass in two to match;
- `deferred_sync`: the same with gradients reduce-scattered once per update;
- `two_views`: two mini-batches of rows in two views (each view's token mean, summed), so that
  each rank holds other token counts of each view;
- `nan_on_one_rank` (N > 1 only): the last rank's sampler log-probs hold a NaN; every rank must
  stop with NonFiniteError, its weights unmoved.

Rank 0 saves the updated full weights of each case and every rank's outcome of the last to
OUT.pt; test_grpo compares N=1 with N=2.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from grpo import train_step  # noqa: E402
from harness.errors import NonFiniteError  # noqa: E402
from harness.sharding import gather_full_weights, init_distributed, shard  # noqa: E402
from test_grpo import _batch, _tiny_model, step_config  # noqa: E402

N, MINI_BATCHES = 8, 2


def one_step(batch, mini_batches, order, **split):
    """Full weights after one step on fresh models, or the NonFiniteError it raised."""
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    # plain SGD and no clipping: unlike Adam's or clipping's, its update scales with the gradient,
    # so a wrong normalisation across ranks shows
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = step_config(temperature=0.8, clip_eps=0.2, kl_coef=0.05, mini_batches=mini_batches, micro_batch_size=3,
                     max_grad_norm=1e9, **split)
    start = {k: v.clone() for k, v in gather_full_weights(model)}
    try:
        train_step(model, ref, opt, batch, cfg, world, order=order)
    except NonFiniteError as e:
        moved = any(not torch.equal(v, start[k]) for k, v in gather_full_weights(model))
        return {"stopped": str(e), "moved": moved}
    return {k: v.clone() for k, v in gather_full_weights(model)}


def end_ranks():
    """Wait for every rank, end the group, and end the process at once. A gloo worker thread frees a finished
    collective's tensors after the rank's wait() returned; should it do so once the interpreter has begun finalizing,
    it cannot take the GIL and the rank aborts ("terminate called without an active exception", SIGABRT: seen about
    once in 50 runs). Nothing is left to run when this is called."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    rank, world, _ = init_distributed()
    per_rank = N // world
    full = _batch(n=N)
    mine = full.rows(slice(rank * per_rank, (rank + 1) * per_rank))
    full.view = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0])
    mine_two_views = full.rows(slice(rank * per_rank, (rank + 1) * per_rank))
    # Each rank takes its rows in order, so its mini-batch k is its k-th chunk. One rank holding
    # all 8 takes them as 0,1,4,5 | 2,3,6,7: the union of the two ranks' chunks k.
    order = torch.arange(per_rank) if world > 1 else \
        torch.arange(N).view(2, MINI_BATCHES, -1).transpose(0, 1).flatten()
    out = {"one_update": one_step(mine, 1, order), "two_updates": one_step(mine, MINI_BATCHES, order),
           "token_budget": one_step(mine, MINI_BATCHES, order, max_tokens_per_micro_batch=14),
           "deferred_sync": one_step(mine, MINI_BATCHES, order, defer_grad_sync=True),
           "two_views": one_step(mine_two_views, MINI_BATCHES, order)}
    if world > 1:
        if rank == world - 1:
            mine.sampler_logp[0, mine.mask[0].nonzero()[0, 0]] = float("nan")
        outcomes = [None] * world
        torch.distributed.all_gather_object(outcomes, one_step(mine, 1, None))
        out["nan_on_one_rank"] = outcomes
    if rank == 0:
        torch.save(out, sys.argv[1])
    end_ranks()
