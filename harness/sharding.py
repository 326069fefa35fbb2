"""Processes and sharding: the device switch point between a laptop and a cluster.

`init_distributed` joins the process group torchrun describes (gloo on a CPU, NCCL for CUDA
tensors); a plain `python train.py` is a world of one, so that every run takes the same path.

Sharding is FSDP2's `fully_shard` on each decoder layer, then on the root, on every run (a world
of one included). Models are built on the meta device and filled shard by shard
(`load_sharded`); the weight sync streams them parameter by parameter (`gather_full_weights`): no rank
holds a whole model on its device. FSDP2 averages gradients over ranks (grpo.py's NORMALISATION
says how the loss accounts for it).
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
    """Join the process group torchrun describes (with `store`, the keys of a restart: resume.restart_store); a plain
    `python train.py` is a world of one. Returns (rank, world_size, device)."""
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
    """FSDP2: each decoder layer is its own unit, then the root (embeddings, norm, head).
    `param_dtype` (e.g. torch.bfloat16) turns on mixed precision with fp32 gradient reduction.
    `activation_checkpointing` keeps only each decoder layer's input for the backward and
    recomputes the layer's insides there: activation memory falls from every intermediate of
    every layer to one hidden state per layer, for about one more forward pass of compute.
    `compile_layers` compiles each decoder layer (torch.compile) on its first call: its elementwise
    operations fuse, at the price of a compilation at the start (bench/speed.md says where it pays)."""
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
    """The Hugging Face model in `model_dir`, sharded (`shard`), its parameters kept in `dtype` and
    computed in `compute_dtype`, without any rank holding the whole model on `device`: it is built
    on the meta device (no memory), sharded, given empty shards on `device`, and filled from rank 0,
    which reads the weights into CPU memory and sends each rank its shards one tensor at a time
    (torch.distributed.checkpoint's broadcast_from_rank0). Buffers computed at construction rather
    than stored (the rotary frequencies) come from rank 0's model too."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
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
    """Put every FSDP unit back into its sharded state: FSDP leaves the root's parameters gathered
    after a forward, and the EMA and checkpoints work on the shards."""
    for model in models:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def gather_full_weights(model, dtype=None):
    """(name, full tensor) of each parameter, one at a time, in `dtype` (default: its own): each is cast
    on its shard, then all-gathered when the consumer asks for it, so a rank holds one full parameter
    beyond its shards, never a full copy of the model (the weight sync streams the model through).
    Every rank must consume the whole iterator, in order: each parameter is a collective. A tied
    parameter (the embedding and the output layer) is gathered once and given under each of its
    names, as a checkpoint names it (vLLM expects both)."""
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
    """Load `model`'s weights into this rank's rollout engine (`gather_full_weights`), checked by the engine
    (rollout.py: every tensor sent and taken, a sample read back). A collective: every rank stops,
    with the failing rank's words, if any rank's engine did not take its weights."""
    problem = engine.load_weights(gather_full_weights(model, engine.dtype))
    raise_if_any_rank(problem, WeightSyncError, "the weight sync into the rollout engine",
                      "The engine would sample from other weights than the trainer's, so the run stopped. Check that "
                      "the trainer and the engine load the same --model folder, and that vLLM is the version the "
                      "requirements pin")


def failed_ranks(problem):
    """[(rank, its problem)] of the ranks whose `problem` is not None, the same list on every rank: an all-reduce of
    who failed (a CPU tensor: gloo, on a CPU and beside NCCL on a GPU), then, only when one did, an all-gather of
    their words."""
    failed = torch.zeros(dist.get_world_size())
    failed[dist.get_rank()] = float(problem is not None)
    dist.all_reduce(failed)
    if not failed.any():
        return []
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return [(rank, p) for rank, p in enumerate(problems) if p is not None]


def raise_if_any_rank(problem, error, what, advice):
    """A collective: raise `error` on every rank, naming the first rank that failed and its words, and how many others
    did, if any rank's `problem` is not None."""
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
