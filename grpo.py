"""GRPO: group-normalised advantages and the clipped policy loss, trained under FSDP2.

For each question we sample G responses o_1..o_G with rewards r_1..r_G and set every token
of response i to the advantage

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)          (std with Bessel's correction, as verl)

The policy loss of one response token, with ratio ρ = π_θ / π_old at the sampling temperature
(log-probs of logits / T), is PPO's clipped surrogate plus a KL penalty to a reference model
(the low-variance "k3" estimator, always ≥ 0):

    loss_t = -min(ρ A, clip(ρ, 1-ε, 1+ε) A) + β min(exp(r_t) - r_t - 1, 10),   r_t = log π_ref - log π_θ

(the k3 value clamped at 10, as verl's low_var_kl clamps it to [-10, 10]: a token the policy has
moved far from the reference adds at most 10 β, and no KL gradient).

π_old is the policy that sampled the batch; its log-probs are recomputed by the trainer
rather than taken from the sampler, so that sampler/trainer numerical gaps never enter the
ratio. The sampler's own log-probs are only compared against them, as a check that
the weight sync worked. A step's batch may be split into several optimizer updates
(mini-batches, where clipping matters) and each update into micro-batches (for memory), by
count or by a budget of padded tokens, each padded only to its own longest row. Log-probs come
from the decoder's last hidden states at response positions, through the output layer one chunk
of tokens at a time (never a [B, T, V] tensor).

NORMALISATION (the one place it is stated): the loss of an update is, for each view in it, the
mean over that view's response tokens of the update's mini-batch on all ranks, summed over views,

    L = Σ_views  Σ_{ranks, sequences of the view, response tokens} loss_t  /  N_tokens(view, global mini-batch).

A batch of one view (every method but the two-view ones, whose batch rows all carry view 0) is
the plain token mean over the global mini-batch. Co-rewarding-I's objective is J(q) + J(q')
(paper Eq. 6), and the official actor adds the two views' losses, each a token mean of its own
(policy_loss_ori + policy_loss_aug): here each view's mean is over its tokens on all ranks, not
per micro-batch as verl's is. FSDP2 averages gradients over ranks (it divides the summed gradient
by the world size W), so each rank backpropagates Σ_local loss_t / (N_tokens(view, global) / W);
micro-batches add their gradients up. The result is the gradient of L, whatever the number of
ranks or micro-batches.

Sharding: `fully_shard` on each decoder layer, then on the root, on every run (a world of one
included), so that one code path runs from a laptop to a cluster. Models are built on the meta
device and filled shard by shard (`load_sharded`); the weight sync streams them parameter by
parameter (`full_weights`): no rank holds a whole model on its device.
"""
import math
import os
import socket
import warnings
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


def load_sharded(model_dir, device, dtype=torch.float32, compute_dtype=torch.float32, activation_checkpointing=False):
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
    shard(model, None if compute_dtype == dtype else compute_dtype, activation_checkpointing)
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


def full_weights(model, dtype=None):
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


# --------------------------------------------------------------------------------------------
# Token log-probs from the last hidden states, one chunk of tokens at a time
#
# The naive path, logits [B, T, V] -> log_softmax, keeps vocabulary-sized fp32 tensors for every
# position of a micro-batch: at V = 151,936 and 2 x 3,584 tokens, 4.4 GB each, and autograd keeps
# several. Here the model returns its last hidden states, only the positions that predict a response
# token are kept (prompt and padding positions never reach the output layer), and the output layer
# runs over LOGIT_CHUNK of them at a time. The forward keeps hidden [n, H] and one logsumexp per
# token; the backward recomputes each chunk's logits. One [chunk, V] fp32 block is alive at a time,
# whatever the sequence length.

LOGIT_CHUNK = 1024      # tokens per pass through the output layer: 1024 x 151,936 x 4 B = 0.62 GB per fp32 block


def response_hidden(model, input_ids, mask):
    """The decoder's last hidden states where `mask` [B, T-1] marks a position that predicts a
    response token: (hidden [n, H], the predicted tokens [n], the output layer's weight [V, H]).

    The model computes the logits of the last position only (logits_to_keep=1); they are compared
    with hidden @ weight.T there, so that a model whose head is not a plain linear map (soft-capped
    or scaled logits) stops the run instead of training on wrong log-probs."""
    with warnings.catch_warnings():      # FSDP warns that the first hidden state (the embeddings) is a view;
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")  # none is written to
        out = model(input_ids=input_ids, output_hidden_states=True, logits_to_keep=1)
    hidden = out.hidden_states[-1]                                   # [B, T, H], after the final norm
    weight = model.get_output_embeddings().weight                    # [V, H]; FSDP's root keeps it gathered
    with torch.no_grad():
        mine = (hidden[:, -1] @ weight.T).float()
        if not torch.allclose(mine, out.logits[:, -1].float(), rtol=1e-2, atol=1e-2 * mine.abs().max().item()):
            raise ValueError(f"{type(model).__name__}'s logits are not its last hidden state times its output "
                             f"layer's weight (a soft cap or a logit scale?): the chunked log-probs of grpo.py "
                             f"would be wrong for it")
    keep = mask.bool()
    return hidden[:, :-1][keep], input_ids[:, 1:][keep], weight


def _chunk_logits(hidden, weight, temperature):
    """(rows, logits / temperature in fp32 [c, V]) for each chunk of LOGIT_CHUNK rows of hidden [n, H]."""
    for start in range(0, len(hidden), LOGIT_CHUNK):
        rows = slice(start, start + LOGIT_CHUNK)
        yield rows, (hidden[rows] @ weight.T).float().div_(temperature)     # in place: one [c, V] block, not two


class ChunkedLogprobs(torch.autograd.Function):
    """log p(target) = z[target] - logsumexp(z), z = hidden @ weight.T / T, chunk by chunk; with
    `entropy`, also (no grad) the entropy logsumexp(z) - Σ softmax(z) z of each distribution.
    Saved for the backward: hidden, weight, targets and the logsumexp [n]. The backward recomputes
    each chunk's z and uses d log p(target) / dz = onehot(target) - softmax(z)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, entropy):
        logp = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)         # [n]
        lse, ent = torch.empty_like(logp), torch.empty_like(logp) if entropy else logp.new_empty(0)
        for rows, z in _chunk_logits(hidden, weight, temperature):                      # z [c, V]
            lse[rows] = z.logsumexp(-1)
            logp[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
            if entropy:
                ent[rows] = lse[rows] - torch.linalg.vecdot((z - lse[rows, None]).exp_(), z)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        for rows, z in _chunk_logits(hidden, weight, ctx.temperature):
            g = grad_logp[rows, None]                                                   # [c, 1]
            dz = z.sub_(lse[rows, None]).exp_().mul_(-g)                                # -softmax(z) g, in place
            dz.scatter_add_(-1, targets[rows, None], g).div_(ctx.temperature)          # + onehot(target) g
            dz = dz.to(hidden.dtype)
            grad_hidden[rows] = dz @ weight
            grad_weight.addmm_(dz.T, hidden[rows])
        return grad_hidden, grad_weight, None, None, None


def token_logprobs(model, input_ids, mask, temperature, entropy=False):
    """log π(token_{t+1} | tokens ≤ t) at the sampling temperature where `mask` [B, T-1] is 1 (0
    elsewhere): logp [B, T-1]; with `entropy`, also (no grad) the entropy of that distribution
    [B, T-1], else None. input_ids [B, T] right-padded (causal attention needs no mask then)."""
    hidden, targets, weight = response_hidden(model, input_ids, mask)
    logp, ent = ChunkedLogprobs.apply(hidden, weight, targets, temperature, entropy)
    keep = mask.bool()
    scatter = lambda v: torch.zeros(mask.shape, dtype=v.dtype, device=v.device).masked_scatter(keep, v)
    return scatter(logp), scatter(ent) if entropy else None


@torch.no_grad()
def token_values(model, input_ids, mask, temperature, fn):
    """fn(log-probs over the vocabulary [c, V]) -> [c] at each position `mask` [B, T-1] marks, chunk
    by chunk: [B, T-1], 0 elsewhere (the answer-free rewards' per-token terms)."""
    hidden, _, weight = response_hidden(model, input_ids, mask)
    out = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
    for rows, z in _chunk_logits(hidden, weight, temperature):
        out[rows] = fn(z.log_softmax(-1))
    return torch.zeros(mask.shape, device=mask.device).masked_scatter(mask.bool(), out)


# --------------------------------------------------------------------------------------------
# Advantages and loss

def group_advantages(rewards, eps=1e-6):
    """rewards [P, G] -> advantages [P, G]; a group whose rewards are all equal gets zeros."""
    if rewards.shape[-1] < 2:
        raise ValueError(f"groups of {rewards.shape[-1]} response(s): advantages normalise within a group, which needs at least 2")
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True)                      # unbiased; G must be ≥ 2
    return (rewards - mean) / (std + eps)


VIEWS = 2                   # a batch's views: 0 the original questions, 1 their rephrasings
KL_CLAMP = 10.0             # verl's low_var_kl clamps k3 to [-10, 10]


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, kl_coef, view, normalizers):
    """GRPO loss over a micro-batch: each view's token sum divided by its normalizer, summed over
    views (see NORMALISATION). logp, old_logp, ref_logp, mask [B, T-1]; advantages, view [B];
    normalizers [VIEWS]. Returns (loss, clipped [B, T-1])."""
    ratio = torch.exp(logp - old_logp)                                             # [B, T-1]
    adv = advantages[:, None]
    policy_term = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    log_r = ref_logp - logp
    kl = (torch.exp(log_r) - log_r - 1).clamp(-KL_CLAMP, KL_CLAMP)                 # k3 ≥ 0
    per_token = (policy_term + kl_coef * kl) * mask                                # [B, T-1]
    loss = sum(per_token[view == v].sum() / normalizers[v] for v in view.unique().tolist())
    clipped = (ratio * adv > ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).float()
    return loss, clipped


def loss_normalizers(mask, view, world_size):
    """[VIEWS]: each view's response tokens in the global mini-batch / world_size (see NORMALISATION).
    mask [B, T-1] and view [B] of this rank's rows of the mini-batch."""
    n = torch.zeros(VIEWS, device=mask.device).index_add_(0, view, mask.sum(-1))
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
    view: torch.Tensor              # [N] long: the view whose token mean the sequence's loss joins

    def __len__(self):
        return len(self.input_ids)

    def lengths(self):
        """[N] tokens of each sequence, prompt and response."""
        return sequence_lengths(self.mask)

    def rows(self, idx):
        """The rows `idx`, cut to the longest of them: no micro-batch computes another's padding."""
        mask = self.mask[idx]
        width = int(sequence_lengths(mask).max()) if len(mask) else 1
        return Batch(self.input_ids[idx][:, :width], mask[:, :width - 1], self.advantages[idx],
                     self.sampler_logp[idx][:, :width - 1], self.view[idx])


def sequence_lengths(mask):
    """[N] tokens of each sequence from its response mask [N, T-1]: the last masked position + 2."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask * positions).amax(-1).long() + 1


def make_batch(samples, pad_id, device):
    """samples: [N] rollout.Sample. Advantages start at zero, and every sequence in view 0; the caller
    sets the advantages, and the views of a two-view method's batch."""
    width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), width - 1)
    slogp = torch.zeros(len(samples), width - 1)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.token_ids)
        if len(s.logprobs) != r or r == 0:
            raise ValueError(f"sample {i}: {r} response tokens and {len(s.logprobs)} log-probs (need as many, ≥ 1)")
        ids[i, :p + r] = torch.tensor(s.prompt_ids + s.token_ids)
        mask[i, p - 1:p + r - 1] = 1.0                     # logits at t predict token t+1
        slogp[i, p - 1:p + r - 1] = torch.tensor(s.logprobs)
    return Batch(ids.to(device), mask.to(device), torch.zeros(len(samples), device=device), slogp.to(device),
                 torch.zeros(len(samples), dtype=torch.long, device=device))


# --------------------------------------------------------------------------------------------
# One training step

@dataclass
class StepConfig:
    temperature: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.005
    mini_batches: int = 1           # optimizer updates per step
    micro_batch_size: int = 64      # sequences per forward/backward ...
    max_tokens_per_micro_batch: int | None = None   # ... or, when set, padded tokens per forward/backward
    max_grad_norm: float = 1.0
    defer_grad_sync: bool = False   # reduce-scatter gradients once per update, not after every micro-batch


def pack_by_tokens(lengths, max_tokens, passes=0):
    """Rows (indices into `lengths`, the rows' token counts) grouped so that rows x the group's longest
    row stays within `max_tokens`: sorted longest first, each row joins the current group while it
    fits (a row longer than the budget goes alone). Then, while there are fewer than `passes` groups,
    the costliest group of two rows or more is halved."""
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


def micro_batches(lengths, cfg):
    """Row indices [[i, ...], ...] of the sequences with token counts `lengths` [n], one list per
    forward/backward pass; `Batch.rows` pads each only to its own longest row.

    By count: runs of `cfg.micro_batch_size` rows in the given order. By token budget
    (`cfg.max_tokens_per_micro_batch`): `pack_by_tokens`. FSDP pairs its collectives pass by pass,
    so every rank must run as many passes: the largest count over ranks (every rank holds as many
    rows, and a pass at least one, so each rank can make that many)."""
    n = len(lengths)
    if cfg.max_tokens_per_micro_batch is None:
        return [list(range(i, min(i + cfg.micro_batch_size, n))) for i in range(0, n, cfg.micro_batch_size)]
    lengths = lengths.tolist()
    passes = torch.tensor(len(pack_by_tokens(lengths, cfg.max_tokens_per_micro_batch)))
    dist.all_reduce(passes, op=dist.ReduceOp.MAX)
    return pack_by_tokens(lengths, cfg.max_tokens_per_micro_batch, int(passes))


@torch.no_grad()
def score(model, batch, cfg):
    """logp [N, T-1] of a frozen model over the batch's response tokens, in micro-batches."""
    logp = torch.zeros(batch.mask.shape, device=batch.mask.device)
    for rows in micro_batches(batch.lengths(), cfg):
        part = batch.rows(rows)
        logp[rows, :part.mask.shape[1]] = token_logprobs(model, part.input_ids, part.mask, cfg.temperature)[0]
    return logp


@torch.no_grad()
def score_responses(model, batch, cfg, fn):
    """[N]: the mean over each response's tokens of fn(log-probs over the vocabulary [c, V]) -> [c],
    under the model at the sampling temperature, in micro-batches (the answer-free rewards)."""
    out = torch.zeros(len(batch), device=batch.mask.device)
    for rows in micro_batches(batch.lengths(), cfg):
        part = batch.rows(rows)
        out[rows] = token_values(model, part.input_ids, part.mask, cfg.temperature, fn).sum(-1) / part.mask.sum(-1)
    return out


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

    With `cfg.defer_grad_sync`, FSDP keeps each micro-batch's gradients unsharded and reduce-scatters
    once, after an update's last micro-batch: one reduction per update instead of one per micro-batch,
    for the memory of the full unsharded gradients (the memory account in bench/scale.py).

    Returns token sums for metrics (the caller sums them over ranks; kl and entropy are those
    of each update's forward) and grad_norm, the largest pre-clipping gradient norm among the
    step's updates."""
    if len(batch) % cfg.mini_batches:
        raise ValueError(f"{len(batch)} sequences on this rank do not split into {cfg.mini_batches} equal mini-batches")
    ref_logp = score(ref, batch, cfg)
    old_logp = score(policy, batch, cfg) if cfg.mini_batches > 1 else None
    m = batch.mask
    stats = {"tokens": m.sum().item(), "kl_sum": 0.0, "entropy_sum": 0.0, "sampler_gap_sum": 0.0,
             "clipped_sum": 0.0, "grad_norm": 0.0}
    order = torch.randperm(len(batch)) if order is None else order
    lengths = batch.lengths()
    for update, mb in enumerate(order.to(m.device).chunk(cfg.mini_batches)):
        normalizers = loss_normalizers(m[mb], batch.view[mb], world_size)
        nonfinite = torch.zeros(2, device=m.device)          # [losses, sampler gaps] that are NaN or inf
        passes = micro_batches(lengths[mb], cfg)
        for j, part_rows in enumerate(passes):
            rows = mb[part_rows]
            part = batch.rows(rows)
            width = part.mask.shape[1]
            policy.set_requires_gradient_sync(not cfg.defer_grad_sync or j == len(passes) - 1)
            logp, entropy = token_logprobs(policy, part.input_ids, part.mask, cfg.temperature, entropy=True)
            old = logp.detach() if old_logp is None else old_logp[rows, :width]
            ref_part = ref_logp[rows, :width]
            loss, clipped = grpo_loss(logp, old, ref_part, part.advantages, part.mask, cfg.clip_eps, cfg.kl_coef,
                                      part.view, normalizers)
            loss.backward()
            with torch.no_grad():
                log_r = ref_part - logp
                gap = ((part.sampler_logp - old).abs() * part.mask).sum()
                nonfinite += torch.stack([~loss.isfinite(), ~gap.isfinite()]).float()
                stats["kl_sum"] += ((torch.exp(log_r) - log_r - 1) * part.mask).sum().item()
                stats["entropy_sum"] += (entropy * part.mask).sum().item()
                stats["sampler_gap_sum"] += gap.item()
                stats["clipped_sum"] += (clipped * part.mask).sum().item()
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
