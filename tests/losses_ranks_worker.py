"""One GRPO step of a fixed model on a fixed global batch under each policy loss and aggregation, each rank taking its
share of the batch.

    torchrun --nproc_per_node=N tests/losses_ranks_worker.py OUT.pt

The global batch holds 8 sequences (tests/test_grpo.py's _batch: the first half short responses, the second half long
ones, so that two ranks hold different token counts) in views 0 1 1 0 1 1 1 0, so that each rank holds other token
counts of each view. Each case starts from fresh models and takes one step of two mini-batches in a fixed order, such
that the one-rank mini-batch k is exactly the union of the ranks' mini-batch k; the second update's ratios are away
from 1, so the clips act. Plain SGD and no gradient clipping: the update scales with the gradient, so a wrong
normalisation across ranks shows.

Cases (CASES): each row of LOSS_AGG_TABLE with the clip; seq_mean_token_mean and seq_mean_token_sum_norm with rows 1
and 6 dropped (weight 0: one row on each rank, so the sequence counts differ by rank); clip-higher (0.1, 0.3); GSPO at
its table's ranges and at (0.2, 0.28); CISPO at its table's; an entropy bonus of 0.05.

Rank 0 saves the updated full weights of each case to OUT.pt; test_losses compares N=1 with N=2.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from grpo import POLICY_LOSS_SETTINGS, train_step  # noqa: E402
from harness.sharding import gather_full_weights, init_distributed, shard  # noqa: E402
from ranks_worker import end_ranks  # noqa: E402
from test_grpo import _batch, _tiny_model, step_config  # noqa: E402

N, MINI_BATCHES = 8, 2
DROPPED = [1, 6]

CASES = {
    "view_token_mean":                 dict(),
    "token_mean":                      dict(loss_agg="token_mean"),
    "seq_mean_token_mean":             dict(loss_agg="seq_mean_token_mean"),
    "seq_mean_token_sum_norm":         dict(loss_agg="seq_mean_token_sum_norm"),
    "seq_mean_token_mean/dropped":     dict(loss_agg="seq_mean_token_mean"),
    "seq_mean_token_sum_norm/dropped": dict(loss_agg="seq_mean_token_sum_norm"),
    "clip_higher":                     dict(clip_eps=0.1, clip_high=0.3),
    "gspo":                            dict(policy_loss="gspo", **POLICY_LOSS_SETTINGS["gspo"]),
    "gspo/wide":                       dict(policy_loss="gspo", clip_high=0.28),
    "cispo":                           dict(policy_loss="cispo", clip_eps=1.0, clip_high=4.0),
    "entropy":                         dict(entropy_coef=0.05),
}


def one_step(batch, order, **loss):
    """Full weights after one step of two mini-batches on fresh models."""
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = step_config(**{**dict(temperature=0.8, clip_eps=0.2, kl_coef=0.05, mini_batches=MINI_BATCHES,
                               micro_batch_size=3, max_grad_norm=1e9), **loss})
    train_step(model, ref, opt, batch, cfg, world, order=order)
    return {k: v.clone() for k, v in gather_full_weights(model)}


if __name__ == "__main__":
    rank, world, _ = init_distributed()
    per_rank = N // world
    full = _batch(n=N)
    full.view = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0])
    mine = full.rows(slice(rank * per_rank, (rank + 1) * per_rank))
    full.weight = full.weight.clone()                  # rows() of a slice are views: keep `mine`'s weights 1
    full.weight[DROPPED] = 0.0
    mine_dropped = full.rows(slice(rank * per_rank, (rank + 1) * per_rank))
    # Each rank takes its rows in order, so its mini-batch k is its k-th chunk. One rank holding all 8 takes them as
    # 0,1,4,5 | 2,3,6,7: the union of the two ranks' chunks k.
    order = torch.arange(per_rank) if world > 1 else \
        torch.arange(N).view(2, MINI_BATCHES, -1).transpose(0, 1).flatten()
    out = {case: one_step(mine_dropped if case.endswith("/dropped") else mine, order, **loss)
           for case, loss in CASES.items()}
    if rank == 0:
        torch.save(out, sys.argv[1])
    end_ranks()
