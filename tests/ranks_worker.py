"""One GRPO update of a fixed model on a fixed global batch, each rank taking its share of it.

    torchrun --nproc_per_node=N tests/ranks_worker.py OUT.pt

Rank 0 saves the updated full weights to OUT.pt; test_grpo compares N=1 with N=2.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from grpo import StepConfig, full_weights, init_distributed, shard, train_step  # noqa: E402
from test_grpo import _batch, _tiny_model  # noqa: E402

if __name__ == "__main__":
    rank, world, _ = init_distributed()
    batch = _batch(n=8)
    share = slice(rank * len(batch) // world, (rank + 1) * len(batch) // world)
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    # plain SGD and no clipping: unlike Adam's or clipping's, its update scales with the gradient,
    # so a wrong normalisation across ranks shows
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = StepConfig(temperature=0.8, clip_eps=0.2, kl_coef=0.05, mini_batches=1, micro_batch_size=3, max_grad_norm=1e9)
    train_step(model, ref, opt, batch.rows(share), cfg, world)
    weights = {k: v.clone() for k, v in full_weights(model)}
    if rank == 0:
        torch.save(weights, sys.argv[1])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
