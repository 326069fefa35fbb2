"""GRPO: group-normalised advantages and the clipped policy loss, trained under FSDP2.

For each question we sample G responses o_1..o_G with rewards r_1..r_G and set every token
of response i to the advantage

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)          (std with Bessel's correction, as verl)

The policy loss of one response token, with ratio ρ = π_θ / π_old at the sampling temperature
(log-probs of logits / T), is PPO's clipped surrogate plus a KL penalty to a reference model
(the low-variance "k3" estimator, always ≥ 0):

    loss_t = -min(ρ A, clip(ρ, 1-ε, 1+ε) A) + β (exp(r_t) - r_t - 1),   r_t = log π_ref - log π_θ

π_old is the policy that sampled the batch; its log-probs are recomputed by the trainer
rather than taken from the sampler, so that sampler/trainer numerical gaps never enter the
ratio. The sampler's own log-probs are only compared against them, as a check that
the weight sync worked. A step's batch may be split into several optimizer updates
(mini-batches, where clipping matters) and each update into micro-batches (for memory).

NORMALISATION (the one place it is stated): the loss of an update is the mean over every
response token of that update's mini-batch on all ranks,

    L = Σ_{ranks, sequences, response tokens} loss_t  /  N_tokens(global mini-batch).

FSDP2 averages gradients over ranks (it divides the summed gradient by the world size W), so
each rank backpropagates Σ_local loss_t / (N_tokens_global / W); micro-batches add their
gradients up. The result is the gradient of L, whatever the number of ranks or micro-batches.

Sharding: `fully_shard` on each decoder layer, then on the root, on every run (a world of one
included), so that one code path runs from a laptop to a cluster.
"""
import math
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


# --------------------------------------------------------------------------------------------
# Processes and sharding (the device switch point)

def init_distributed():
    """Join the process group torchrun describes; a plain `python train.py` is a world of one.
    Returns (rank, world_size, device)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        if "RANK" in os.environ:                      # under torchrun: it says who we are
            dist.init_process_group(backend)
        else:                                         # alone: a world of one on a free local port
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


def shard(model, param_dtype=None, activation_checkpointing=False):
    """FSDP2: each decoder layer is its own unit, then the root (embeddings, norm, head).
    `param_dtype` (e.g. torch.bfloat16) turns on mixed precision with fp32 gradient reduction.
    `activation_checkpointing` keeps only each decoder layer's input for the backward and
    recomputes the layer's insides there: activation memory falls from every intermediate of
    every layer to one hidden state per layer, for about one more forward pass of compute."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if activation_checkpointing:
            checkpoint(layer)                   # composable: the layer keeps its parameter names
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def reshard(*models):
    """Put every FSDP unit back into its sharded state: FSDP leaves the root's parameters gathered
    after a forward, and the EMA and checkpoints work on the shards."""
    for model in models:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def full_weights(model):
    """[(name, full tensor)] on every rank: what the rollout engine and the checkpoint need."""
    return [(name, t.full_tensor() if isinstance(t, DTensor) else t) for name, t in model.state_dict().items()]


# --------------------------------------------------------------------------------------------
# Advantages, log-probs, loss

def group_advantages(rewards, eps=1e-6):
    """rewards [P, G] -> advantages [P, G]; a group whose rewards are all equal gets zeros."""
    if rewards.shape[-1] < 2:
        raise ValueError(f"groups of {rewards.shape[-1]} response(s): advantages normalise within a group, which needs at least 2")
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True)                      # unbiased; G must be ≥ 2
    return (rewards - mean) / (std + eps)


def vocab_logprobs(model, input_ids, temperature):
    """log π(· | tokens ≤ t) over the vocabulary at the sampling temperature.
    input_ids [B, T] right-padded (causal attention needs no mask then) -> [B, T-1, V]."""
    return (model(input_ids=input_ids).logits[:, :-1].float() / temperature).log_softmax(-1)


def token_logprobs(model, input_ids, temperature):
    """log π(token_{t+1} | tokens ≤ t) at the sampling temperature, and (no grad) the entropy of
    that distribution: logp [B, T-1], entropy [B, T-1]."""
    logp_all = vocab_logprobs(model, input_ids, temperature)                      # [B, T-1, V]
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, kl_coef, normalizer):
    """Token-summed GRPO loss over a micro-batch, divided by `normalizer` (see NORMALISATION).
    logp, old_logp, ref_logp, mask [B, T-1]; advantages [B]. Returns (loss, clipped [B, T-1])."""
    ratio = torch.exp(logp - old_logp)                                             # [B, T-1]
    adv = advantages[:, None]
    policy_term = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    log_r = ref_logp - logp
    kl = torch.exp(log_r) - log_r - 1                                              # k3 ≥ 0
    loss = ((policy_term + kl_coef * kl) * mask).sum() / normalizer
    clipped = (ratio * adv > ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).float()
    return loss, clipped


def loss_normalizer(n_tokens_local, world_size, device):
    """N_tokens of the global mini-batch / world_size (see NORMALISATION)."""
    n = torch.tensor(float(n_tokens_local), device=device)
    dist.all_reduce(n)
    return n / world_size


# --------------------------------------------------------------------------------------------
# A batch of sampled responses

@dataclass
class Batch:
    input_ids: torch.Tensor         # [N, T] prompt + response, right-padded
    mask: torch.Tensor              # [N, T-1] 1 where position t predicts a response token
    advantages: torch.Tensor        # [N]
    sampler_logp: torch.Tensor      # [N, T-1] the sampler's log-probs (0 off the mask)

    def __len__(self):
        return len(self.input_ids)

    def rows(self, idx):
        return Batch(self.input_ids[idx], self.mask[idx], self.advantages[idx], self.sampler_logp[idx])


def make_batch(samples, pad_id, device):
    """samples: [N] rollout.Sample. Advantages start at zero; the caller sets them."""
    width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), width - 1)
    slogp = torch.zeros(len(samples), width - 1)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.token_ids)
        if len(s.logprobs) != r:
            raise ValueError(f"sample {i}: {r} response tokens but {len(s.logprobs)} log-probs")
        ids[i, :p + r] = torch.tensor(s.prompt_ids + s.token_ids)
        mask[i, p - 1:p + r - 1] = 1.0                     # logits at t predict token t+1
        slogp[i, p - 1:p + r - 1] = torch.tensor(s.logprobs)
    return Batch(ids.to(device), mask.to(device), torch.zeros(len(samples), device=device), slogp.to(device))


# --------------------------------------------------------------------------------------------
# One training step

@dataclass
class StepConfig:
    temperature: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.005
    mini_batches: int = 1           # optimizer updates per step
    micro_batch_size: int = 64      # sequences per forward/backward
    max_grad_norm: float = 1.0


def micro_batches(n, size):
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def score(model, batch, cfg):
    """logp, entropy [N, T-1] of a frozen model over the batch, in micro-batches."""
    outs = [token_logprobs(model, batch.input_ids[s], cfg.temperature) for s in micro_batches(len(batch), cfg.micro_batch_size)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


@torch.no_grad()
def score_responses(model, batch, cfg, fn):
    """[N] per-response values fn(log-probs over the vocabulary [B, T-1, V], mask [B, T-1]) of a
    model at the sampling temperature, in micro-batches (the answer-free rewards)."""
    return torch.cat([fn(vocab_logprobs(model, batch.input_ids[s], cfg.temperature), batch.mask[s])
                      for s in micro_batches(len(batch), cfg.micro_batch_size)])


class NonFiniteError(FloatingPointError):
    """A loss, sampler log-prob gap or gradient norm that is NaN or infinite: the step stops
    before the optimizer touches the weights."""


def train_step(policy, ref, optimizer, batch, cfg, world_size, order=None):
    """Reference log-probs, then `cfg.mini_batches` clipped-GRPO updates.

    π_old is the policy that sampled the batch. With one update per step it is the policy
    being updated, so its log-probs are the update's own forward, detached; with several
    updates they come from one no-grad pass before the first, so that later updates take
    their ratio against the sampling policy and can clip. `order` (a permutation of the rows,
    default random) says which rows each update takes: update k takes its k-th chunk.

    Every rank must hold the same number of sequences, divisible by `cfg.mini_batches` (FSDP's
    collectives pair up per forward and backward). Before each optimizer step the ranks agree
    that every loss, sampler gap and the gradient norm is finite; otherwise all of them raise
    NonFiniteError and the weights stay as they were.

    Returns token sums for metrics (the caller sums them over ranks; kl and entropy are those
    of each update's forward) and grad_norm, the largest pre-clipping gradient norm among the
    step's updates."""
    if len(batch) % cfg.mini_batches:
        raise ValueError(f"{len(batch)} sequences on this rank do not split into {cfg.mini_batches} equal mini-batches")
    ref_logp, _ = score(ref, batch, cfg)
    old_logp = score(policy, batch, cfg)[0] if cfg.mini_batches > 1 else None
    m = batch.mask
    stats = {"tokens": m.sum().item(), "kl_sum": 0.0, "entropy_sum": 0.0, "sampler_gap_sum": 0.0,
             "clipped_sum": 0.0, "grad_norm": 0.0}
    order = torch.randperm(len(batch)) if order is None else order
    for update, mb in enumerate(order.to(m.device).chunk(cfg.mini_batches)):
        normalizer = loss_normalizer(m[mb].sum().item(), world_size, m.device)
        nonfinite = torch.zeros(2, device=m.device)          # [losses, sampler gaps] that are NaN or inf
        for s in micro_batches(len(mb), cfg.micro_batch_size):
            rows, mask = mb[s], m[mb[s]]
            logp, entropy = token_logprobs(policy, batch.input_ids[rows], cfg.temperature)
            old = logp.detach() if old_logp is None else old_logp[rows]
            loss, clipped = grpo_loss(logp, old, ref_logp[rows], batch.advantages[rows],
                                      mask, cfg.clip_eps, cfg.kl_coef, normalizer)
            loss.backward()
            with torch.no_grad():
                log_r = ref_logp[rows] - logp
                gap = ((batch.sampler_logp[rows] - old).abs() * mask).sum()
                nonfinite += torch.stack([~loss.isfinite(), ~gap.isfinite()]).float()
                stats["kl_sum"] += ((torch.exp(log_r) - log_r - 1) * mask).sum().item()
                stats["entropy_sum"] += (entropy * mask).sum().item()
                stats["sampler_gap_sum"] += gap.item()
                stats["clipped_sum"] += (clipped * mask).sum().item()
        dist.all_reduce(nonfinite)                    # a loss is rank-local: every rank must stop together
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if nonfinite.any() or not math.isfinite(norm):
            raise NonFiniteError(
                f"update {update + 1} of {cfg.mini_batches}: {int(nonfinite[0])} non-finite loss(es), "
                f"{int(nonfinite[1])} non-finite sampler log-prob gap(s), gradient norm {norm}. The update was not "
                f"applied: the weights are those before it. Look for NaN or infinite rewards or advantages, a "
                f"rollout engine returning NaN log-probs (its weights), or a learning rate too high for the dtype.")
        stats["grad_norm"] = max(stats["grad_norm"], norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stats
