"""Processes and sharding: the device switch point between a laptop and a cluster.

`init_distributed` joins the process group torchrun describes (gloo on a CPU, NCCL for CUDA tensors); a plain
`python train.py` is a world of one, so that every run takes the same path. Every run shards with FSDP2's
`fully_shard` on each decoder layer, then the root. Models are built on the meta device and filled shard by shard
(`load_sharded`), and the weight sync streams them one parameter at a time (`gather_full_weights`): no rank holds a
whole model on its device. FSDP2 averages gradients over ranks (grpo.py's LOSS_AGG_TABLE accounts for it).
"""
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from harness.errors import WeightSyncError


def init_distributed(store=None):
    """Join torchrun's process group, or a world of one (`store`: a restart's keys, resume.restart_store). Returns
    (rank, world_size, device)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        if "WORLD_SIZE" in os.environ:                # under torchrun: it says who we are
            dist.init_process_group(backend, **(store or {}))
        else:                                         # alone: a world of one on a free local port
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


def shard(model, param_dtype=None, activation_checkpointing=False, compile_layers=False):
    """FSDP2: each decoder layer its own unit, then the root. `param_dtype` (e.g. torch.bfloat16): mixed precision with
    fp32 gradient reduction. `activation_checkpointing`: each layer keeps only its input and recomputes the rest in the
    backward. `compile_layers`: torch.compile each layer on its first call (bench/speed.md says where it pays)."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if compile_layers:
            layer.compile()
        if activation_checkpointing:
            checkpoint(layer)                   # composable: the layer keeps its parameter names
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def load_sharded(model_dir, device, dtype=torch.float32, compute_dtype=torch.float32, activation_checkpointing=False,
                 compile_layers=False):
    """The Hugging Face model in `model_dir`, sharded (`shard`), kept in `dtype` and computed in `compute_dtype`, with
    no rank holding it whole on `device`: built on the meta device, sharded, filled from rank 0's CPU copy one tensor
    at a time, buffers (the rotary frequencies) included. It keeps the folder's generation_config. A collective."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    if os.path.isfile(os.path.join(model_dir, "generation_config.json")):    # its end tokens, as from_pretrained's
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    shard(model, None if compute_dtype == dtype else compute_dtype, activation_checkpointing, compile_layers)
    model.to_empty(device=device)
    full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype) if dist.get_rank() == 0 else None
    set_model_state_dict(model, full.state_dict() if full else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if full is not None:
                buffer.copy_(full.get_buffer(name))
            dist.broadcast(buffer, src=0)
    return model


def reshard(*models):
    """Put every FSDP unit back into its sharded state (FSDP leaves the root gathered after a forward)."""
    for model in models:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def gather_full_weights(model, dtype=None):
    """(name, full tensor) of each parameter, one at a time, in `dtype` (default: its own), all-gathered as the
    consumer asks: a collective, every rank must consume the whole iterator, in order. A tied parameter is gathered
    once and given under each of its names (vLLM expects both)."""
    reshard(model)
    names = {}                                      # id -> (parameter, [its names])
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), (param, []))[1].append(name)
    for param, aliases in names.values():
        param = param.detach().to(dtype or param.dtype)
        full = param.full_tensor() if isinstance(param, DTensor) else param
        for name in aliases:
            yield name, full


def sync_engine_weights(engine, model):
    """Load `model`'s weights into this rank's rollout engine, which checks them (harness/weightcheck.py). A collective:
    every rank raises WeightSyncError, with the failing rank's words, if any engine failed."""
    problem = engine.load_weights(gather_full_weights(model, engine.dtype))
    raise_if_any_rank(problem, WeightSyncError, "the weight sync into the rollout engine",
                      "The engine would sample from other weights than the trainer's, so the run stopped. Check that "
                      "the trainer and the engine load the same --model folder, and that vLLM is the version the "
                      "requirements pin")


def failed_ranks(problem):
    """[(rank, its problem)] of the ranks whose `problem` is not None, the same on every rank: an all-reduce of who
    failed (a CPU tensor: gloo), then, only if one did, an all-gather of their words."""
    failed = torch.zeros(dist.get_world_size())
    failed[dist.get_rank()] = float(problem is not None)
    dist.all_reduce(failed)
    if not failed.any():
        return []
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return [(rank, p) for rank, p in enumerate(problems) if p is not None]


def raise_if_any_rank(problem, error, what, advice):
    """A collective: if any rank's `problem` is not None, raise `error` on every rank, naming the first failed one."""
    failed = failed_ranks(problem)
    if failed:
        (rank, words), others = failed[0], len(failed) - 1
        also = f" (and on {others} other rank{'s' if others > 1 else ''})" if others else ""
        raise error(f"{what} failed on rank {rank}{also}: {words}. {advice}")


def all_sum(values, device):
    """Sum a dict of floats over ranks."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def pack_by_tokens(lengths, max_tokens, passes=0):
    """Rows (indices into `lengths`, the rows' token counts) grouped so that rows x the group's longest row stays
    within `max_tokens`: sorted longest first, each row joins the current group while it fits (a row longer than the
    budget goes alone). Then, while there are fewer than `passes` groups, the costliest group of two rows or more is
    halved."""
    groups = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    while len(groups) < passes:
        costly = max((g for g in groups if len(g) > 1), key=lambda g: len(g) * lengths[g[0]])
        groups.remove(costly)
        groups += [costly[:len(costly) // 2], costly[len(costly) // 2:]]
    return groups


def micro_batches_for_all_ranks(lengths, cfg):
    """Row indices [[i, ...], ...] of the sequences with token counts `lengths` [n], one list per forward/backward
    pass: runs of `cfg.micro_batch_size` rows, or with `cfg.max_tokens_per_micro_batch` `pack_by_tokens`. FSDP pairs
    its collectives pass by pass, so every rank runs as many passes: the largest count over ranks (a MAX all-reduce;
    every rank holds as many rows, and a pass at least one, so each rank can make that many)."""
    n = len(lengths)
    if not cfg.max_tokens_per_micro_batch:
        return [list(range(i, min(i + cfg.micro_batch_size, n))) for i in range(0, n, cfg.micro_batch_size)]
    lengths = lengths.tolist()
    passes = torch.tensor(len(pack_by_tokens(lengths, cfg.max_tokens_per_micro_batch)))
    dist.all_reduce(passes, op=dist.ReduceOp.MAX)
    return pack_by_tokens(lengths, cfg.max_tokens_per_micro_batch, int(passes))
