"""GRPO: group-normalised advantages and the clipped policy loss, trained under FSDP2.

For each question we sample G responses with rewards r_1..r_G, and every token of response i gets the advantage

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)                      (std with Bessel's correction, as verl)

The loss of one response token, with ρ_t = π_θ / π_old at the sampling temperature (log-probs of logits / T),
is PPO's clipped surrogate plus a k3 KL penalty to a reference model (the frozen start, or the EMA teacher):

    loss_t = -min(ρ_t A, clip(ρ_t, 1-ε, 1+ε) A) + β min(exp(r_t) - r_t - 1, 10),
    r_t = clamp(log π_ref - log π_θ, -20, 20)

as verl's low_var_kl and the official code clamp it (exp overflows float32 from 88.7). The loss of an update is
one token mean per view, over the update's mini-batch on all ranks: Co-rewarding-I's J(q) + J(q') (paper Eq. 6;
the official actor's policy_loss_ori + policy_loss_aug). That is the official loss.

THE LOSS FAMILY. What the field varies is one function in a table each, chosen by a flag; the presets take the
official code's row of each, and RECIPE.md lists every other row as a departure. In the order a step applies them
(`update`): OVERLONG_TABLE, GROUP_FILTER_TABLE, ADVANTAGE_STD_TABLE, then POLICY_LOSS_TABLE, the rollout
correction (ROLLOUT_CORRECTION_TABLE) and the entropy bonus within each token's loss

    loss_t = weight_t · (c_t · policy_t + β k3_t - entropy_coef · H_t)

aggregated by LOSS_AGG_TABLE, which states every normaliser. Each table's notes sit beside it, with the paper
and the TRL and verl settings of each row. A row's function names what it uses; `call` hands it just that.

π_old's log-probs are the trainer's, not the sampler's, so that their numerical gap never enters the ratio: with
one update a step, the update's own forward, detached (ρ = 1); with several (--mini_batches), a no-grad pass before
the first, so that later updates clip. A step's batch splits into mini-batches (updates) and those into micro-batches
(for memory), by count or by a budget of padded tokens. Log-probs come from harness/logprobs.py, never [B, T, V].
"""
import inspect
import math
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from harness.errors import stop_if_non_finite
from harness.logprobs import token_logprobs, token_values
from harness.record import LossSums, add
from harness.sharding import all_sum, micro_batches_for_all_ranks, reshard


def call(fn, **available):
    """fn(...) with the values it names, of those available: a table's row takes only what it uses."""
    return fn(**{name: available[name] for name in inspect.signature(fn).parameters})


@dataclass
class StepConfig:
    """The settings a step's update reads, each the run's setting of its name (config.py's PRESET_TABLE)."""
    temperature: float
    clip_eps: float
    clip_high: float | None         # ε_high (None: clip_eps, a symmetric clip)
    kl_coef: float
    entropy_coef: float
    policy_loss: str                # a row of POLICY_LOSS_TABLE
    loss_agg: str                   # a row of LOSS_AGG_TABLE
    advantage_std: str              # a row of ADVANTAGE_STD_TABLE
    group_filter: str               # a row of GROUP_FILTER_TABLE
    overlong: str                   # a row of OVERLONG_TABLE
    overlong_buffer: int
    rollout_correction: str         # a row of ROLLOUT_CORRECTION_TABLE
    rollout_correction_cap: float   # its C
    max_response_len: int           # L_max (seq_mean_token_sum_norm's constant, the overlong shaping's limit)
    mini_batches: int               # optimizer updates per step
    micro_batch_size: int           # sequences per forward/backward ...
    max_tokens_per_micro_batch: int  # ... or, when not 0, padded tokens per forward/backward
    max_grad_norm: float
    defer_grad_sync: bool           # reduce-scatter gradients once per update, not after every micro-batch

    @classmethod
    def of(cls, settings):
        """The StepConfig of a run's settings (an argparse.Namespace, or a dict)."""
        get = settings.get if isinstance(settings, dict) else lambda name: getattr(settings, name)
        return cls(**{f.name: get(f.name) for f in fields(cls)})


# --------------------------------------------------------------------------------------------
# A batch of sampled responses

@dataclass
class Batch:
    input_ids: torch.Tensor         # [N, T] prompt + response, right-padded
    mask: torch.Tensor              # [N, T-1] 1 where position t predicts a response token
    advantages: torch.Tensor        # [N]
    sampler_logp: torch.Tensor      # [N, T-1] the sampler's log-probs (0 off the mask)
    view: torch.Tensor              # [N] long: the view whose token mean the sequence's loss joins
    weight: torch.Tensor            # [N, T-1] each token's loss weight (LOSS_AGG_TABLE; ones from make_batch)
    truncated: torch.Tensor | None = None   # [N] bool: the response was cut at the length limit

    def __len__(self):
        return len(self.input_ids)

    def rows(self, idx):
        """The rows `idx`, cut to the longest of them: no micro-batch computes another's padding."""
        mask = self.mask[idx]
        width = int(sequence_lengths(mask).max()) if len(mask) else 1
        return Batch(self.input_ids[idx][:, :width], mask[:, :width - 1], self.advantages[idx],
                     self.sampler_logp[idx][:, :width - 1], self.view[idx], self.weight[idx][:, :width - 1])


def sequence_lengths(mask):
    """[N] tokens of each sequence from its response mask [N, T-1]: the last masked position + 2."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask * positions).amax(-1).long() + 1


def make_batch(samples, pad_id, device):
    """samples: [N] rollout.Sample. Advantages start at zero, every sequence in view 0 and every token's weight at 1;
    the caller sets the views of a two-view method's batch, and `update` the advantages and weights."""
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
                 torch.zeros(len(samples), dtype=torch.long, device=device), torch.ones(mask.shape, device=device),
                 torch.tensor([not s.finished for s in samples]))


# --------------------------------------------------------------------------------------------
# Between the rewards and the loss: overlong responses, the groups that train, the advantages

def no_overlong_shaping(rewards):
    return rewards, torch.ones_like(rewards)


def mask_truncated(rewards, truncated):
    return rewards, (~truncated).float()


def soft_overlong_penalty(rewards, lengths, max_len, buffer):
    """DAPO's soft overlong punishment: the reward minus (L - (max_len - buffer)) / buffer for a response of L tokens
    in the last `buffer` of the allowed length, 0 before it: -1 at max_len."""
    return rewards + ((max_len - buffer - lengths) / buffer).clamp(max=0), torch.ones_like(rewards)


# --overlong: a response cut at --max_response_len L_max. (rewards [groups, G], lengths [groups, G] float, truncated
# [groups, G] bool, max_len, buffer: --overlong_buffer) -> (rewards, loss weight [groups, G]).
#  --overlong  shaping                   from                    verl                  TRL
OVERLONG_TABLE = [
    ("none",   no_overlong_shaping),   # the official code
    ("mask",   mask_truncated),        # DAPO's overlong filtering                          mask_truncated_completions
    ("soft",   soft_overlong_penalty),  # DAPO                    overlong_buffer      get_soft_overlong_punishment
]
OVERLONGS = dict(OVERLONG_TABLE)


def zero_variance(rewards):
    """[groups] bool: the group's G rewards are all equal (zero advantages: no learning signal)."""
    return (rewards == rewards[:, :1]).all(-1)


def keep_every_group(rewards):
    return torch.ones(rewards.shape[0], dtype=torch.bool)


def drop_zero_variance(rewards):
    return ~zero_variance(rewards)


# --group_filter: which groups train. rewards [groups, G] -> keep [groups] bool. A dropped group gets loss weight 0
# (LOSS_AGG_TABLE): its advantages were 0 already, so what changes is the token means, now over the groups with a
# signal, and its KL term, which leaves the loss. Then, as DAPO, the step samples more questions until each rank
# holds its share with a kept group, up to --refill_rounds more rounds (train.py, `training_step`); where they run
# out, the step trains on what it has, and a step with nothing left takes an update of zero gradient.
#  --group_filter     keep
GROUP_FILTER_TABLE = [
    ("none",          keep_every_group),      # the official code
    ("zero_variance", drop_zero_variance),    # DAPO's dynamic sampling (verl filter_groups, metric "acc")
]
GROUP_FILTERS = dict(GROUP_FILTER_TABLE)


def group_std(rewards, eps):
    """[groups, 1]: each group's std (Bessel's correction) + eps."""
    return rewards.std(-1, keepdim=True) + eps


def batch_std(rewards, eps):
    """[1, 1]: the std (Bessel's correction) of every reward of the step, on all ranks, + eps: a collective, all_sum
    of their count, sum and sum of squares, in float64."""
    r = rewards.double()                                # float32 sums lose the spread of rewards far from 0
    t = all_sum({"n": r.numel(), "sum": r.sum().item(), "squares": (r ** 2).sum().item()}, rewards.device)
    variance = (t["squares"] - t["sum"] ** 2 / t["n"]) / max(t["n"] - 1, 1)
    return rewards.new_full((1, 1), math.sqrt(max(variance, 0.0)) + eps)


def unit_scale(rewards):
    return rewards.new_ones(1, 1)


# --advantage_std: the divisor of r - mean(r). (rewards [groups, G], eps) -> [groups or 1, 1].
#  --advantage_std  scale        from         verl                           TRL
ADVANTAGE_STD_TABLE = [
    ("group",        group_std),   # GRPO       norm_adv_by_std_in_grpo=True   scale_rewards="group"
    ("batch",        batch_std),   #                                           scale_rewards="batch"
    ("none",         unit_scale),  # Dr. GRPO   norm_adv_by_std_in_grpo=False  scale_rewards="none"
    ("given",        None),        # RESTRAIN: the method's rewards are its advantages (rewards.restrain)
]
ADVANTAGE_STDS = dict(ADVANTAGE_STD_TABLE)


def group_advantages(rewards, eps=1e-6, scale=group_std):
    """rewards [P, G] -> advantages [P, G]: (r - the group's mean) / scale (ADVANTAGE_STD_TABLE), by default the
    group's std + eps. A group whose rewards are all equal gets zeros, exactly: tested for, not computed, as the
    float32 mean of equal non-dyadic rewards can miss them by a rounding, which eps alone would blow up to |A| ~ 2."""
    if scale is None:                       # --advantage_std given: the method computed them
        return rewards
    if rewards.shape[-1] < 2:
        raise ValueError(f"groups of {rewards.shape[-1]} response(s): advantages normalise within a group of ≥ 2")
    mean = rewards.mean(-1, keepdim=True)
    return torch.where(zero_variance(rewards)[:, None], 0.0, (rewards - mean) / call(scale, rewards=rewards, eps=eps))


# --------------------------------------------------------------------------------------------
# The policy term, the KL term and how the tokens' losses add up

VIEWS = 2                   # a batch's views: 0 the original questions, 1 their rephrasings
KL_CLAMP = 10.0             # verl's low_var_kl clamps k3 to [-10, 10] ...
LOG_RATIO_CLAMP = 20.0      # ... and log π_ref - log π_θ to [-20, 20] before the exp
SEQ_LOG_RATIO_MAX = 10.0    # GSPO's log s_i is clamped above at 10 before the exp, as verl's


def k3(logp, ref_logp):
    """The k3 estimate of KL(π_θ ‖ π_ref) per token (≥ 0), clamped as verl's low_var_kl clamps it."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_r) - log_r - 1).clamp(-KL_CLAMP, KL_CLAMP)


def clipped_surrogate(ratio, adv, low, high):
    """-min(ρ A, clip(ρ, 1 - low, 1 + high) A) [B, T-1], and the tokens whose clip binds: below (ρ < 1 - low, A < 0)
    and above (ρ > 1 + high, A > 0)."""
    term = -torch.minimum(ratio * adv, ratio.clamp(1 - low, 1 + high) * adv)
    return term, (ratio < 1 - low) & (adv < 0), (ratio > 1 + high) & (adv > 0)


def token_clip(logp, old_logp, adv, low, high):
    """PPO's clip on each token's ratio ρ_t = π_θ / π_old, its log clamped to ±20 (verl); no dual clip (RECIPE.md)."""
    return clipped_surrogate(torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), adv, low, high)


def sequence_clip(logp, old_logp, adv, mask, low, high):
    """GSPO: the response's ratio s_i = exp(mean over its tokens of log π_θ - log π_old), clipped per response, on
    each of its tokens; its gradient reaches every token through s_i (∂s_i/∂log π_θ(o_t) = s_i / |o_i|)."""
    log_s = ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)   # [B, 1]
    return clipped_surrogate(torch.exp(log_s.clamp(max=SEQ_LOG_RATIO_MAX)).expand_as(logp), adv, low, high)


def clipped_weight(logp, old_logp, adv, low, high):
    """CISPO: -sg(clip(ρ_t, 1 - low, 1 + high)) A log π_θ(o_t): the clipped ratio weights the REINFORCE term and is
    detached, so that every token keeps a gradient, a clipped one too."""
    ratio = torch.exp(logp - old_logp)
    term = -ratio.clamp(1 - low, 1 + high).detach() * adv * logp
    return term, ratio < 1 - low, ratio > 1 + high


# --policy_loss: the policy term. (logp, old_logp [B, T-1], adv [B, 1], mask [B, T-1], low, high: ε_low, ε_high) ->
# (the term [B, T-1], clipped below, clipped above [B, T-1] bool). A row that brings its paper's ε_low, ε_high (and
# its aggregation) sets them unless --clip_eps and --clip_high (--loss_agg) are given; one clip flag without the other
# is refused (config.py), as it would leave the other at the row's (GSPO's 4e-4 beside a 0.2). None: the preset's.
# --clip_high above --clip_eps is DAPO's clip-higher (0.28). The clip fractions are logged apart; for cispo, where
# the weight is clipped, whatever A's sign. From: clip, PPO and GRPO (the official code; verl vanilla, TRL
# importance_sampling_level="token"); gspo, GSPO (Zheng et al. 2025; verl gspo, TRL importance_sampling_level=
# "sequence"): its paper's ranges, and its mean over responses, as verl's gspo always takes; cispo, CISPO (MiniMax-M1
# 2025; verl cispo, TRL loss_type="cispo" with epsilon_high 5): no lower clip, a cap of 5.
#  --policy_loss  term            ε_low   ε_high  --loss_agg
POLICY_LOSS_TABLE = [
    ("clip",       token_clip,      None,   None,   None),
    ("gspo",       sequence_clip,   3e-4,   4e-4,   "seq_mean_token_mean"),
    ("cispo",      clipped_weight,  1.0,    4.0,    None),
]
POLICY_LOSSES = {name: term for name, term, *_ in POLICY_LOSS_TABLE}
POLICY_LOSS_SETTINGS = {name: {"clip_eps": low, "clip_high": high, "loss_agg": agg}
                        for name, _, low, high, agg in POLICY_LOSS_TABLE}


@dataclass
class Normalizers:
    """A mini-batch's sums over all ranks / the world size W; a zero sum is taken as W: a normaliser is never 0."""
    view_tokens: torch.Tensor   # [VIEWS] the weight of each view's response tokens (its token count when weights are 1)
    tokens: torch.Tensor        # [] the weight of every response token
    sequences: torch.Tensor     # [] the sequences with any weight
    max_response_len: int       # L_max (Dr. GRPO's constant)


def view_token_mean(per_token, view, n):
    """Σ_views Σ_{view's tokens} loss_t / N_tokens(view): J(q) + J(q'), one token mean per view."""
    return sum(per_token[view == v].sum() / n.view_tokens[v] for v in view.unique().tolist())


def token_mean(per_token, n):
    """Σ loss_t / N_tokens: one token mean over the mini-batch."""
    return per_token.sum() / n.tokens


def seq_mean_token_mean(per_token, weight, n):
    """Σ_seq (Σ_t loss_t / n_seq) / N_seq: each response's token mean, averaged over responses."""
    return (per_token.sum(-1) / weight.sum(-1).clamp(min=1)).sum() / n.sequences


def seq_mean_token_sum_norm(per_token, n):
    """Σ loss_t / (N_seq · L_max): token sums over a constant."""
    return per_token.sum() / (n.sequences * n.max_response_len)


# --loss_agg: how an update's tokens' losses add up, the one place each normaliser is stated. (per_token [B, T-1],
# view [B], weight [B, T-1]: the mask times the loss weights, n: Normalizers) -> this rank's part of the loss.
# N_tokens(view), N_tokens and N_seq sum loss weights, not tokens, over the update's mini-batch on ALL ranks: a
# token's weight (Batch.weight, 0 where a group filter or --overlong mask drops it) scales its loss and its count, so
# a dropped response leaves the sums and the means, its KL term too; with every weight 1 the loss is bit for bit the
# unweighted one. FSDP2 averages gradients over the W ranks, so each rank backpropagates Σ_local / (N / W), and
# micro-batches add up: the gradient of the loss, whatever the number of ranks or micro-batches. A view with no weight
# contributes 0; a one-view batch's view_token_mean is token_mean. Each view's mean is over its tokens on all ranks,
# not per micro-batch as verl's. Each row equals the peers its verl and TRL columns name, on the same tokens and
# weights (tests/test_losses.py restates theirs), but seq_mean_token_sum_norm is N_seq / W times verl's (verl divides
# by L_max alone). Where a peer differs (N_seq counting masked responses; TRL's token mean of the entropy), RECIPE.md.
#  --loss_agg                agg                         from          verl                      TRL
LOSS_AGG_TABLE = [
    ("view_token_mean",         view_token_mean),          # the official code
    ("token_mean",              token_mean),               # DAPO        token-mean                dapo
    ("seq_mean_token_mean",     seq_mean_token_mean),      # GRPO, GSPO  seq-mean-token-mean       grpo
    ("seq_mean_token_sum_norm", seq_mean_token_sum_norm),  # Dr. GRPO    (seq-mean-token-sum-norm) dr_grpo
]
LOSS_AGGS = dict(LOSS_AGG_TABLE)


def grpo_loss(logp, old_logp, ref_logp, entropy, part, n, correction, cfg):
    """The loss of a micro-batch `part` (a Batch) under `cfg`: LOSS_AGG_TABLE's aggregation of each token's loss_t
    (the module docstring). logp, old_logp, ref_logp, entropy (H), correction (c) [B, T-1]; n: Normalizers. Returns
    (loss, terms): terms are each token's parts as they enter the loss, weighted and detached [B, T-1], "policy", "kl"
    and "entropy" (the bonus, with its minus sign), and the clip's "clipped_low" and "clipped_high" (0/1)."""
    low, high = cfg.clip_eps, cfg.clip_eps if cfg.clip_high is None else cfg.clip_high
    policy, below, above = call(POLICY_LOSSES[cfg.policy_loss], logp=logp, old_logp=old_logp,
                                adv=part.advantages[:, None], mask=part.mask, low=low, high=high)
    policy, kl, bonus = policy * correction, cfg.kl_coef * k3(logp, ref_logp), cfg.entropy_coef * entropy
    per_token = (policy + kl - bonus) * part.mask * part.weight                                  # [B, T-1]
    weight = part.mask * part.weight
    loss = call(LOSS_AGGS[cfg.loss_agg], per_token=per_token, view=part.view, weight=weight, n=n)
    terms = {"policy": policy.detach() * weight, "kl": kl.detach() * weight, "entropy": -bonus.detach() * weight,
             "clipped_low": below.float(), "clipped_high": above.float()}
    return loss, terms


def loss_normalizers_over_ranks(weight, view, world_size, max_response_len):
    """A mini-batch's Normalizers: one all-reduce of this rank's weight [B, T-1] (mask x loss weights) by view [B]."""
    n = torch.zeros(VIEWS + 2, device=weight.device)
    n[:VIEWS].index_add_(0, view, weight.sum(-1))
    n[VIEWS], n[VIEWS + 1] = weight.sum(), (weight.sum(-1) > 0).sum()
    dist.all_reduce(n)
    n = torch.where(n > 0, n, world_size) / world_size
    return Normalizers(n[:VIEWS], n[VIEWS], n[VIEWS + 1], max_response_len)


# --------------------------------------------------------------------------------------------
# Rollout correction: each token's weight from π_old / π_sampler

def token_ratios(log_ratio):
    """w_t [B, T-1]: each response token's own ratio π_old / π_sampler, from log_ratio [B, T-1]."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def sequence_ratios(log_ratio, mask):
    """W [B, T-1]: the response's ratio, the product of its tokens' ratios, on each of its positions."""
    return token_ratios((log_ratio * mask).sum(-1, keepdim=True)).expand_as(log_ratio)


def unweighted(ratio):
    return torch.ones_like(ratio)


def truncated(ratio, cap):
    return ratio.clamp(max=cap)


def masked(ratio, cap):
    return torch.where(ratio > cap, torch.zeros_like(ratio), ratio)


# --rollout_correction: the sampler (vLLM, in bf16 say) and the trainer compute the policy with different kernels,
# so the responses come from π_sampler, not quite π_old. A correction weights each token's policy term by c_t, made
# of the detached ratio π_old / π_sampler (its log clamped to ±20, verl's SAFETY_BOUND) and the cap C
# (--rollout_correction_cap: verl's rollout_is_threshold 2; TRL's vllm_importance_sampling_cap is 3). As in TRL and
# verl, c_t scales the policy term only, never the KL term, and the normaliser does not count it. With `none`,
# x · 1 = x exactly: the loss and its gradient are bit for bit the uncorrected ones.
#  --rollout_correction   ratio            weight      c_t                    TRL                 verl
ROLLOUT_CORRECTION_TABLE = [
    ("none",              token_ratios,    unweighted),  # 1: the official code
    ("tis",               token_ratios,    truncated),   # min(w_t, C)          token_truncate      rollout_is="token"
    ("mis",               token_ratios,    masked),      # w_t if ≤ C, else 0   token_mask          (also drops < 1/C)
    ("seq_tis",           sequence_ratios, truncated),   # min(W, C)            sequence_truncate   rollout_is="sequence"
    ("seq_mis",           sequence_ratios, masked),      # W if ≤ C, else 0     sequence_mask
]
ROLLOUT_CORRECTIONS = {name: (ratio, weight) for name, ratio, weight in ROLLOUT_CORRECTION_TABLE}


def rollout_correction(name, old_logp, sampler_logp, mask, cap):
    """(weights, ratios) [B, T-1] of correction `name` with cap C, both detached: the weight of each token's policy
    term, and the ratio it was made of (w_t, or W of the token's response), before the cap."""
    ratio_of, weight_of = ROLLOUT_CORRECTIONS[name]
    ratios = call(ratio_of, log_ratio=(old_logp - sampler_logp).detach(), mask=mask)
    return call(weight_of, ratio=ratios, cap=cap), ratios


# --------------------------------------------------------------------------------------------
# The step's update

def shape_and_filter(rewards, lengths, truncated, cfg):
    """The rewards shaped (--overlong), each response's loss weight [groups, G], and the groups kept (--group_filter)
    [groups] bool, of rewards, response lengths (float) and truncation [groups, G]. Once a step (train.py)."""
    shaped, weight = call(OVERLONGS[cfg.overlong], rewards=rewards, lengths=lengths, truncated=truncated,
                          max_len=cfg.max_response_len, buffer=cfg.overlong_buffer)
    return shaped, weight, call(GROUP_FILTERS[cfg.group_filter], rewards=shaped)


def update(policy, ref, optimizer, batch, shaped, weight, keep, cfg, world_size):
    """The step's update from `shape_and_filter`'s shaped rewards and loss weights [groups, G] and kept groups
    [groups] (the batch's rows, group by group): the tokens' loss weights, the advantages, then `train_step`."""
    device = batch.mask.device
    batch.weight *= (keep[:, None] * weight).flatten()[:, None].to(device)
    batch.advantages = group_advantages(shaped, scale=ADVANTAGE_STDS[cfg.advantage_std]).flatten().to(device)
    return train_step(policy, ref, optimizer, batch, cfg, world_size)


@torch.no_grad()
def score(model, batch, cfg):
    """logp [N, T-1] of a frozen model over the batch's response tokens, in micro-batches."""
    logp = torch.zeros(batch.mask.shape, device=batch.mask.device)
    for rows in micro_batches_for_all_ranks(sequence_lengths(batch.mask), cfg):
        part = batch.rows(rows)
        logp[rows, :part.mask.shape[1]] = token_logprobs(model, part.input_ids, part.mask, cfg.temperature)[0]
    reshard(model)             # FSDP keeps the root unit (the embedding) gathered after a forward; no backward frees it
    return logp


@torch.no_grad()
def score_responses(model, batch, cfg, fn):
    """[N]: the mean over each response's tokens of fn(log-probs over the vocabulary [c, V]) -> [c], under the model
    at the sampling temperature, in micro-batches (the answer-free rewards)."""
    out = torch.zeros(len(batch.mask), device=batch.mask.device)
    for rows in micro_batches_for_all_ranks(sequence_lengths(batch.mask), cfg):
        part = batch.rows(rows)
        out[rows] = token_values(model, part.input_ids, part.mask, cfg.temperature, fn).sum(-1) / part.mask.sum(-1)
    return out


def train_step(policy, ref, optimizer, batch, cfg, world_size, order=None):
    """The reference's log-probs, then `cfg.mini_batches` updates, mini-batch k taking the k-th chunk of `order` (a
    permutation of the rows, default random; every rank holds as many rows). Before each optimizer step the ranks
    agree that every loss, sampler gap and the gradient norm is finite, or all raise NonFiniteError with the weights as
    they were. Returns this rank's LossSums (harness/record.py), grad_norm the largest pre-clipping norm of the step."""
    if len(batch.mask) % cfg.mini_batches:
        raise ValueError(f"{len(batch.mask)} sequences on this rank do not split into {cfg.mini_batches} mini-batches")
    ref_logp = score(ref, batch, cfg)
    old_logp = score(policy, batch, cfg) if cfg.mini_batches > 1 else None
    m = batch.mask
    stats = LossSums(updates=cfg.mini_batches)
    order = torch.randperm(len(batch.mask)) if order is None else order
    lengths = sequence_lengths(batch.mask)
    for update, mb in enumerate(order.to(m.device).chunk(cfg.mini_batches)):
        n = loss_normalizers_over_ranks(m[mb] * batch.weight[mb], batch.view[mb], world_size, cfg.max_response_len)
        nonfinite = torch.zeros(2, device=m.device)          # [losses, sampler gaps] that are NaN or inf
        passes = micro_batches_for_all_ranks(lengths[mb], cfg)
        for j, part_rows in enumerate(passes):
            rows = mb[part_rows]
            part = batch.rows(rows)
            width = part.mask.shape[1]
            policy.set_requires_gradient_sync(not cfg.defer_grad_sync or j == len(passes) - 1)
            logp, entropy = token_logprobs(policy, part.input_ids, part.mask, cfg.temperature, entropy=True,
                                           entropy_grad=cfg.entropy_coef != 0)
            old = logp.detach() if old_logp is None else old_logp[rows, :width]
            ref_part = ref_logp[rows, :width]
            correction, ratios = rollout_correction(cfg.rollout_correction, old, part.sampler_logp, part.mask,
                                                    cfg.rollout_correction_cap)
            loss, terms = grpo_loss(logp, old, ref_part, entropy, part, n, correction, cfg)
            loss.backward()
            with torch.no_grad():
                gap = ((part.sampler_logp - old).abs() * part.mask).sum()
                nonfinite += torch.stack([~loss.isfinite(), ~gap.isfinite()]).float()
                tally(stats, part, n, cfg, loss=loss, terms=terms, kl=k3(logp, ref_part), entropy=entropy, gap=gap,
                      ratios=ratios)
        dist.all_reduce(nonfinite)                    # a loss is rank-local: every rank must stop together
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        stop_if_non_finite(nonfinite, norm, update, cfg.mini_batches)
        stats.grad_norm = max(stats.grad_norm, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stats


def tally(stats, part, n, cfg, loss, terms, kl, entropy, gap, ratios):
    """Add a micro-batch's sums to the step's `stats` (LossSums): token sums, and the loss and its parts as this rank's
    share of each update's loss, whole and per view (stats.views[v], under the same aggregation: the parts add up)."""
    mask, weight = part.mask, part.mask * part.weight
    add(stats, tokens=mask, kl_sum=kl * mask, entropy_sum=entropy * mask, sampler_gap_sum=gap,
        sampler_ratio_sum=ratios * mask, sampler_capped_sum=(ratios > cfg.rollout_correction_cap) * mask,
        clipped_low_sum=terms["clipped_low"] * mask, clipped_high_sum=terms["clipped_high"] * mask, loss_sum=loss)
    for v, sums in enumerate(stats.views):
        in_view = (part.view == v)[:, None].float()
        share = {term: call(LOSS_AGGS[cfg.loss_agg], per_token=terms[term] * in_view, view=part.view, weight=weight,
                            n=n) for term in ("policy", "kl", "entropy")}
        add(sums, loss_policy=share["policy"], loss_kl=share["kl"], loss_entropy=share["entropy"],
            clipped=(terms["clipped_low"] + terms["clipped_high"]) * mask * in_view, tokens=mask * in_view)
