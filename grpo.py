"""GRPO: group-normalised advantages and the clipped policy loss, trained under FSDP2.

For each question we sample G responses o_1..o_G with rewards r_1..r_G and set every token
of response i to the advantage

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)          (std with Bessel's correction, as verl)

The policy loss of one response token, with ratio ρ = π_θ / π_old at the sampling temperature
(log-probs of logits / T), is PPO's clipped surrogate plus a KL penalty to a reference model
(the low-variance "k3" estimator, always ≥ 0):

    loss_t = -min(ρ A, clip(ρ, 1-ε, 1+ε) A) + β min(exp(r_t) - r_t - 1, 10),
    r_t = clamp(log π_ref - log π_θ, -20, 20)

(`k3`, as verl's low_var_kl and the official code compute it: r_t clamped to ±20 before the exp,
which would overflow float32 from 88.7 and give a NaN gradient, and the value clamped at 10: a
token the policy has moved far from the reference adds at most 10 β, and no KL gradient). The
logged `kl` is the same k3, clamped alike. That is the official loss, and each flag below
defaults to it.

THE LOSS FAMILY. What the field varies is one function in a table each, chosen by a flag; the
presets take the first row of each, the official code's (RECIPE.md lists each as a departure).

    --policy_loss (POLICY_LOSS_TABLE): the policy term
        clip    -min(ρ_t A, clip(ρ_t, 1-ε_low, 1+ε_high) A)                  PPO, GRPO; verl vanilla,
                                                                              TRL importance_sampling_level=token
        gspo    the same with the response's ratio s_i = exp(mean_t log ρ_t)  GSPO; verl gspo,
                on each of its tokens, clipped per response; ε 3e-4 / 4e-4   TRL importance_sampling_level=sequence
        cispo   -sg(clip(ρ_t, 1-ε_low, 1+ε_high)) A log π_θ(o_t)              CISPO (MiniMax-M1); verl cispo,
                ε_low 1 (no lower clip), ε_high 4 (a cap of 5)                TRL loss_type=cispo (epsilon_high 5)
    --clip_high ε_high, ε_low being --clip_eps (DAPO's clip-higher: 0.28); by default ε_high = ε_low
    --loss_agg (LOSS_AGG_TABLE): how the tokens' losses add up (NORMALISATION)
    --advantage_std (ADVANTAGE_STD_TABLE): the divisor of r - mean(r)
        group   the group's std + 1e-6                                        GRPO; verl norm_adv_by_std_in_grpo,
                                                                              TRL scale_rewards=group
        batch   the std of every reward of the step, on all ranks, + 1e-6    TRL scale_rewards=batch
        none    1                                                             Dr. GRPO; TRL scale_rewards=none
    --overlong (OVERLONG_TABLE): a response cut at --max_response_len L_max, between the rewards and the group
        filter
        none    as it is
        mask    loss weight 0 on its tokens                                   DAPO's overlong filtering;
                                                                              TRL mask_truncated_completions
        soft    the reward plus min(0, (L_max - N - L) / N), N the buffer     DAPO; verl overlong_buffer,
                (--overlong_buffer): 0 up to L_max - N tokens, -1 at L_max    TRL get_soft_overlong_punishment
    --entropy_coef c: the loss adds -c H_t, H_t the entropy of the token's distribution (with its
        gradient, logprobs.py), aggregated as the rest                       verl entropy_coeff, TRL entropy_coef

so that each token's loss is

    loss_t = weight_t · (c_t · policy_t + β k3_t - entropy_coef · H_t)

with weight_t its loss weight and c_t the rollout correction (both below). The clip fractions are
logged apart: below (ρ < 1 - ε_low with A < 0: the clip binds) and above (ρ > 1 + ε_high with
A > 0); for cispo, where the weight is clipped, whatever A's sign.

π_old is the policy that sampled the batch; its log-probs are recomputed by the trainer
rather than taken from the sampler, so that sampler/trainer numerical gaps never enter the
ratio. The sampler's own log-probs are compared against them, as a check that the weight sync
worked, and with --rollout_correction they weight each token (ROLLOUT CORRECTION). A step's
batch may be split into several optimizer updates (mini-batches, where clipping matters) and
each update into micro-batches (for memory), by
count or by a budget of padded tokens, each padded only to its own longest row. Log-probs come
from logprobs.py (never a [B, T, V] tensor); processes and sharding from sharding.py.

NORMALISATION (the one place it is stated): the loss of an update is an aggregation of its tokens'
losses over the update's mini-batch on all ranks, one row of LOSS_AGG_TABLE (--loss_agg). With
N_tokens(view) the response tokens of a view, N_tokens all of them, N_seq the sequences, each in the
global mini-batch, n_i the tokens of sequence i and L_max = --max_response_len:

    view_token_mean          Σ_views Σ_{view's tokens} loss_t / N_tokens(view)    the default, the official code
    token_mean               Σ loss_t / N_tokens                                 DAPO; verl token-mean, TRL dapo
    seq_mean_token_mean      Σ_i (Σ_t loss_t / n_i) / N_seq                      GRPO's paper; verl seq-mean-token-
                                                                                 mean, TRL grpo
    seq_mean_token_sum_norm  Σ loss_t / (N_seq · L_max)                          Dr. GRPO; verl seq-mean-token-
                                                                                 sum-norm, TRL dr_grpo

The default: for each view in the update, the mean over that view's response tokens of the
update's mini-batch on all ranks, summed over views,

    L = Σ_views  Σ_{ranks, sequences of the view, response tokens} loss_t  /  N_tokens(view, global mini-batch).

A batch of one view (every method but the two-view ones: all its rows carry view 0) takes
the plain token mean over the global mini-batch, as token_mean does. Co-rewarding-I's objective is
J(q) + J(q') (paper Eq. 6), and the official actor adds the two views' losses, each a token mean of
its own (policy_loss_ori + policy_loss_aug): here each view's mean is over its tokens on all ranks,
not per micro-batch as verl's is. Every normaliser is a global count (one all-reduce,
`loss_normalizers_over_ranks`: N_tokens(view), N_tokens and N_seq, each / W). FSDP2 averages
gradients over ranks (it divides the summed gradient by the world size W), so each rank
backpropagates Σ_local / (N / W) for its normaliser N (n_i is the sequence's own, on its rank);
micro-batches add their gradients up. The result is the gradient of L, whatever the number of
ranks or micro-batches, for every aggregation.

A token's loss weight (Batch.weight, 1 from make_batch) scales its whole loss_t, and N_tokens and n_i
count weights, not tokens, N_seq the sequences with any weight: L = Σ_views Σ w_t loss_t / Σ w_t over
the view's response tokens. A group the group filter drops (GROUP FILTERS), or a response
--overlong mask drops, has weight 0 on its tokens: it leaves the sums and the means of its view,
its KL term too, as if it had not been sampled. A view left with no weight contributes 0 (its
normaliser is taken as 1, never 0/0; so is an empty mini-batch's N_tokens or N_seq). With every weight 1, w_t · x = x and the
sums of weights are the token counts exactly: the loss is bit for bit the unweighted one. The
rollout correction's factor (below) is another matter: it scales the policy term only and leaves
the normaliser as it is, as TRL and verl do.

ROLLOUT CORRECTION (--rollout_correction; `none` by default and in the official preset, as the
official code has none: any other is a departure, RECIPE.md). The sampler (vLLM, in bf16 say)
and the trainer compute the policy with different kernels, so the responses come from
π_sampler, not quite π_old. TRL's GRPOTrainer (vllm_importance_sampling_correction, on by
default there) and verl (rollout_corr: rollout_is) weight each response token's policy term by
the ratio of the two, detached; here with the log-ratio clamped to ±20 before the exp, as verl's
SAFETY_BOUND:

    w_t = exp(clamp(log π_old(o_t) - log π_sampler(o_t), -20, 20))             (a token's ratio)
    W   = exp(clamp(Σ_t over the response of the same log-ratio, -20, 20))     (its response's)
    loss_t = c_t · weight_t · (-min(ρ A, clip(ρ, 1-ε, 1+ε) A))  +  β k3_t

with c_t one row of ROLLOUT_CORRECTION_TABLE and C = --rollout_correction_cap (2, verl's default
rollout_is_threshold; TRL's vllm_importance_sampling_cap defaults to 3):

    none      1                              the official code
    tis       min(w_t, C)                    TRL token_truncate; verl rollout_is="token"
    mis       w_t where w_t ≤ C, else 0      TRL token_mask (verl's masked mode also drops w_t < 1/C)
    seq_tis   min(W, C) on every token       TRL sequence_truncate; verl rollout_is="sequence"
    seq_mis   W where W ≤ C, else 0          TRL sequence_mask

A masked token keeps no weight and an unmasked one keeps w_t itself (not 1), as in both. weight_t is
the token's loss weight (Batch.weight, NORMALISATION), which scales the KL term too. As in TRL and
verl, c_t multiplies the policy term only, never the KL term, and the normaliser does not count it,
as TRL's (verl's later masking drops the masked tokens from its denominator). With `none` c_t is 1,
and x · 1 = x exactly for every float: the loss and its gradient are bit for bit the uncorrected ones.

GROUP FILTERS (--group_filter; `none` by default and in the official preset). Between the rewards
and the advantages, a filter sees a step's groups' rewards [groups, G] and keeps some: a kept
group trains as usual, a dropped one gets loss weight 0 (NORMALISATION). One row of
GROUP_FILTER_TABLE a filter:

    none            keep every group                                        the official code
    zero_variance   drop the groups whose G rewards are all equal           DAPO's dynamic sampling,
                    (all right or all wrong: zero advantages, no signal)     without its re-sampling

A zero-variance group's advantages are 0, so dropping it changes no policy term: what changes is
the token means, now over the groups with a signal, and its KL term, which leaves the loss. DAPO
then samples more questions until the batch is full again; here the step trains on what is left,
and a step with nothing left takes an update of zero gradient (AdamW's moments and weight decay
still move the weights).
"""
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from logprobs import token_logprobs, token_values
from sharding import GuardStop, all_sum, reshard


# --------------------------------------------------------------------------------------------
# Advantages, and what shapes the rewards before them

def keep_every_group(rewards):
    """[groups] True: every group trains (the official code)."""
    return torch.ones(rewards.shape[0], dtype=torch.bool)


def drop_zero_variance(rewards):
    """[groups] False where a group's G rewards are all equal (DAPO's filter, without its re-sampling)."""
    return ~(rewards == rewards[:, :1]).all(-1)


# One row a group filter (GROUP FILTERS): rewards [groups, G] -> keep [groups] bool.
#  --group_filter     keep
GROUP_FILTER_TABLE = [
    ("none",          keep_every_group),
    ("zero_variance", drop_zero_variance),
]
GROUP_FILTERS = dict(GROUP_FILTER_TABLE)


def no_overlong_shaping(rewards, lengths, truncated, max_len, buffer):
    """The rewards as they are, every response's weight 1 (the official code)."""
    return rewards, torch.ones_like(rewards)


def mask_truncated(rewards, lengths, truncated, max_len, buffer):
    """A response cut at the length limit gets loss weight 0 (DAPO's overlong filtering; TRL
    mask_truncated_completions)."""
    return rewards, (~truncated).float()


def soft_overlong_penalty(rewards, lengths, truncated, max_len, buffer):
    """DAPO's soft overlong punishment: the reward minus (L - (max_len - buffer)) / buffer for a response of L
    tokens in the last `buffer` of the allowed length, 0 before it (verl's overlong_buffer, penalty_factor 1; TRL
    get_soft_overlong_punishment)."""
    return rewards + ((max_len - buffer - lengths) / buffer).clamp(max=0), torch.ones_like(rewards)


# One row a shaping of overlong responses (OVERLONG): (rewards, lengths [groups, G] float, truncated [groups, G] bool,
# max_len, buffer) -> (rewards, loss weight [groups, G]).
#  --overlong  shaping
OVERLONG_TABLE = [
    ("none",   no_overlong_shaping),
    ("mask",   mask_truncated),
    ("soft",   soft_overlong_penalty),
]
OVERLONGS = dict(OVERLONG_TABLE)


def group_std(rewards, eps):
    """[groups, 1]: each group's std (Bessel's correction) + eps (GRPO; verl norm_adv_by_std_in_grpo=True, TRL
    scale_rewards="group")."""
    return rewards.std(-1, keepdim=True) + eps


def batch_std(rewards, eps):
    """[1, 1]: the std (Bessel's correction) of every reward of the step, on all ranks, + eps: a collective, all_sum
    of their count, sum and sum of squares (TRL scale_rewards="batch")."""
    t = all_sum({"n": rewards.numel(), "sum": rewards.sum().item(), "squares": (rewards ** 2).sum().item()},
                rewards.device)
    variance = (t["squares"] - t["sum"] ** 2 / t["n"]) / max(t["n"] - 1, 1)
    return rewards.new_full((1, 1), math.sqrt(max(variance, 0.0)) + eps)


def unit_scale(rewards, eps):
    """[1, 1] 1: r - mean(r), unscaled (Dr. GRPO; verl norm_adv_by_std_in_grpo=False, TRL scale_rewards="none")."""
    return rewards.new_ones(1, 1)


# One row a scale of the advantages (--advantage_std): (rewards [groups, G], eps) -> the divisor of r - mean(r).
#  --advantage_std  scale
ADVANTAGE_STD_TABLE = [
    ("group",        group_std),
    ("batch",        batch_std),
    ("none",         unit_scale),
]
ADVANTAGE_STDS = dict(ADVANTAGE_STD_TABLE)


def group_advantages(rewards, eps=1e-6, scale=group_std):
    """rewards [P, G] -> advantages [P, G]: (r - the group's mean) / scale(rewards, eps), by default the group's std
    + eps (ADVANTAGE_STD_TABLE); a group whose rewards are all equal gets zeros."""
    if rewards.shape[-1] < 2:
        raise ValueError(f"groups of {rewards.shape[-1]} response(s): advantages normalise within a group, "
                         f"which needs at least 2")
    mean = rewards.mean(-1, keepdim=True)
    return (rewards - mean) / scale(rewards, eps)


# --------------------------------------------------------------------------------------------
# The loss: a policy term, a KL term, an entropy bonus, and how the tokens' losses add up

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


def token_clip(logp, old_logp, adv, mask, low, high):
    """PPO's clip on each token's ratio ρ_t = π_θ / π_old (GRPO; DAPO's clip-higher with high > low), its log
    clamped to ±20 before the exp as verl's is (a token π_old gave e^-89 would overflow float32 into an inf loss);
    no dual clip (RECIPE.md). verl loss_mode=vanilla, clip_ratio_low/high; TRL importance_sampling_level="token",
    epsilon/epsilon_high."""
    return clipped_surrogate(torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), adv, low, high)


def sequence_clip(logp, old_logp, adv, mask, low, high):
    """GSPO (Zheng et al. 2025): the response's ratio s_i = exp(mean over its tokens of log π_θ - log π_old), the
    geometric mean of its tokens' ratios, clipped per response, on each of its tokens. Its gradient reaches every
    token through s_i: ∂s_i/∂log π_θ(o_t) = s_i / |o_i|. verl loss_mode=gspo; TRL importance_sampling_level=
    "sequence"."""
    log_s = ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)   # [B, 1]
    return clipped_surrogate(torch.exp(log_s.clamp(max=SEQ_LOG_RATIO_MAX)).expand_as(logp), adv, low, high)


def clipped_weight(logp, old_logp, adv, mask, low, high):
    """CISPO (MiniMax-M1): -sg(clip(ρ_t, 1 - low, 1 + high)) A log π_θ(o_t): the clipped ratio weights the
    REINFORCE term and is detached, so that every token keeps a gradient, a clipped one too. verl loss_mode=cispo;
    TRL loss_type="cispo"."""
    ratio = torch.exp(logp - old_logp)
    term = -ratio.clamp(1 - low, 1 + high).detach() * adv * logp
    return term, ratio < 1 - low, ratio > 1 + high


# One row a policy term (--policy_loss): (logp, old_logp [B, T-1], A [B, 1], mask [B, T-1], ε_low, ε_high) ->
# (the term [B, T-1], clipped below, clipped above [B, T-1] bool); and the ε_low, ε_high it takes unless --clip_eps,
# --clip_high say otherwise (None: the preset's --clip_eps for both).
#  --policy_loss  term            ε_low   ε_high   from
POLICY_LOSS_TABLE = [
    ("clip",       token_clip,      None,   None),   # PPO/GRPO (Shao et al. 2024): the official code
    ("gspo",       sequence_clip,   3e-4,   4e-4),   # GSPO (Zheng et al. 2025), its paper's ranges
    ("cispo",      clipped_weight,  1.0,    4.0),    # CISPO (MiniMax-M1 2025): no lower clip; ε_high as ScaleRL's
]
POLICY_LOSSES = {name: term for name, term, *_ in POLICY_LOSS_TABLE}
POLICY_LOSS_CLIPS = {name: (low, high) for name, _, low, high in POLICY_LOSS_TABLE}


@dataclass
class Normalizers:
    """A mini-batch's sums over all ranks, each divided by the world size W (`loss_normalizers_over_ranks`); a
    zero sum is taken as W, so that a normaliser is never 0 (NORMALISATION)."""
    view_tokens: torch.Tensor   # [VIEWS] the weight of each view's response tokens (its token count when weights are 1)
    tokens: torch.Tensor        # [] the weight of every response token
    sequences: torch.Tensor     # [] the sequences with any weight
    max_response_len: int       # the longest response allowed (Dr. GRPO's constant)


def view_token_mean(per_token, view, weight, n):
    """Σ_views Σ_{view's tokens} loss_t / N_tokens(view): J(q) + J(q'), one token mean per view (the official code)."""
    return sum(per_token[view == v].sum() / n.view_tokens[v] for v in view.unique().tolist())


def token_mean(per_token, view, weight, n):
    """Σ loss_t / N_tokens: one token mean over the mini-batch (DAPO; verl token-mean, TRL loss_type="dapo")."""
    return per_token.sum() / n.tokens


def seq_mean_token_mean(per_token, view, weight, n):
    """Σ_seq (Σ_t loss_t / n_seq) / N_seq: each response's token mean, averaged over responses (the original GRPO;
    verl seq-mean-token-mean, TRL loss_type="grpo")."""
    return (per_token.sum(-1) / weight.sum(-1).clamp(min=1)).sum() / n.sequences


def seq_mean_token_sum_norm(per_token, view, weight, n):
    """Σ loss_t / (N_seq · L_max): token sums over a constant (Dr. GRPO; verl seq-mean-token-sum-norm, TRL
    loss_type="dr_grpo")."""
    return per_token.sum() / (n.sequences * n.max_response_len)


# One row an aggregation of the tokens' losses into the loss (--loss_agg; NORMALISATION states each):
# (per_token [B, T-1], view [B], weight [B, T-1] the mask times the loss weights, Normalizers) -> this rank's loss.
#  --loss_agg                agg
LOSS_AGG_TABLE = [
    ("view_token_mean",         view_token_mean),
    ("token_mean",              token_mean),
    ("seq_mean_token_mean",     seq_mean_token_mean),
    ("seq_mean_token_sum_norm", seq_mean_token_sum_norm),
]
LOSS_AGGS = dict(LOSS_AGG_TABLE)


def grpo_loss(logp, old_logp, ref_logp, entropy, part, n, correction, cfg):
    """The loss of a micro-batch `part` (a Batch: its advantages, mask, view and weight) under `cfg` (StepConfig: the
    policy loss, aggregation, clips, β and entropy coefficient): the aggregation (NORMALISATION) of each token's

        loss_t = weight_t · (c_t · policy_t + β k3_t - entropy_coef · H_t)

    logp, old_logp, ref_logp, entropy (H), correction (c) [B, T-1]; n: Normalizers. Returns (loss, terms): terms are
    each token's parts as they enter the loss, weighted and detached [B, T-1], "policy", "kl" and "entropy" (the bonus,
    with its minus sign), and the clip's "clipped_low" and "clipped_high" (0/1), for the step's metrics."""
    low, high = cfg.clip_eps, cfg.clip_eps if cfg.clip_high is None else cfg.clip_high
    policy, below, above = POLICY_LOSSES[cfg.policy_loss](logp, old_logp, part.advantages[:, None], part.mask, low,
                                                          high)
    policy, kl, bonus = policy * correction, cfg.kl_coef * k3(logp, ref_logp), cfg.entropy_coef * entropy
    per_token = (policy + kl - bonus) * part.mask * part.weight                                  # [B, T-1]
    weight = part.mask * part.weight
    loss = LOSS_AGGS[cfg.loss_agg](per_token, part.view, weight, n)
    terms = {"policy": policy.detach() * weight, "kl": kl.detach() * weight, "entropy": -bonus.detach() * weight,
             "clipped_low": below.float(), "clipped_high": above.float()}
    return loss, terms


def loss_normalizers_over_ranks(weight, view, world_size, max_response_len):
    """Normalizers of a mini-batch (one all-reduce): each view's weight over its response tokens, every token's, and
    the sequences with any weight, in the global mini-batch, / world_size; W for a sum of 0 (NORMALISATION).
    weight [B, T-1] (the mask times the loss weights) and view [B] of this rank's rows of the mini-batch."""
    n = torch.zeros(VIEWS + 2, device=weight.device)
    n[:VIEWS].index_add_(0, view, weight.sum(-1))
    n[VIEWS], n[VIEWS + 1] = weight.sum(), (weight.sum(-1) > 0).sum()
    dist.all_reduce(n)
    n = torch.where(n > 0, n, world_size) / world_size
    return Normalizers(n[:VIEWS], n[VIEWS], n[VIEWS + 1], max_response_len)


# --------------------------------------------------------------------------------------------
# Rollout correction: each token's weight from π_old / π_sampler (ROLLOUT CORRECTION)

def token_ratios(log_ratio, mask):
    """w_t [B, T-1]: each response token's own ratio π_old / π_sampler, from log_ratio [B, T-1]."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def sequence_ratios(log_ratio, mask):
    """W [B, T-1]: the response's ratio, the product of its tokens' ratios, on each of its positions."""
    return token_ratios((log_ratio * mask).sum(-1, keepdim=True), mask).expand_as(log_ratio)


def unweighted(ratio, cap):
    """No correction: 1."""
    return torch.ones_like(ratio)


def truncated(ratio, cap):
    """TIS: min(w, C)."""
    return ratio.clamp(max=cap)


def masked(ratio, cap):
    """MIS: w where w ≤ C, 0 above."""
    return torch.where(ratio > cap, torch.zeros_like(ratio), ratio)


# One row a correction: the ratio it weights by, and what it makes of the ratio at the cap C.
#  --rollout_correction   ratio            weight
ROLLOUT_CORRECTION_TABLE = [
    ("none",              token_ratios,    unweighted),
    ("tis",               token_ratios,    truncated),
    ("mis",               token_ratios,    masked),
    ("seq_tis",           sequence_ratios, truncated),
    ("seq_mis",           sequence_ratios, masked),
]
ROLLOUT_CORRECTIONS = {name: (ratio, weight) for name, ratio, weight in ROLLOUT_CORRECTION_TABLE}


def rollout_correction(name, old_logp, sampler_logp, mask, cap):
    """(weights, ratios) [B, T-1] of correction `name` with cap C, both detached: the weight of each
    token's policy term, and the ratio it was made of (w_t, or W of the token's response), before the cap.
    old_logp, sampler_logp, mask [B, T-1] (both log-probs 0 off the mask)."""
    ratio_of, weight_of = ROLLOUT_CORRECTIONS[name]
    ratios = ratio_of((old_logp - sampler_logp).detach(), mask)
    return weight_of(ratios, cap), ratios


# --------------------------------------------------------------------------------------------
# A batch of sampled responses

@dataclass
class Batch:
    input_ids: torch.Tensor         # [N, T] prompt + response, right-padded
    mask: torch.Tensor              # [N, T-1] 1 where position t predicts a response token
    advantages: torch.Tensor        # [N]
    sampler_logp: torch.Tensor      # [N, T-1] the sampler's log-probs (0 off the mask)
    view: torch.Tensor              # [N] long: the view whose token mean the sequence's loss joins
    weight: torch.Tensor            # [N, T-1] each token's loss weight (ones from make_batch; 0 on a group the group
                                    # filter drops): it scales the token's loss and its count (NORMALISATION)

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
                     self.sampler_logp[idx][:, :width - 1], self.view[idx], self.weight[idx][:, :width - 1])


def sequence_lengths(mask):
    """[N] tokens of each sequence from its response mask [N, T-1]: the last masked position + 2."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask * positions).amax(-1).long() + 1


def make_batch(samples, pad_id, device):
    """samples: [N] rollout.Sample. Advantages start at zero, every sequence in view 0 and every token's
    weight at 1; the caller sets the advantages, and the views of a two-view method's batch."""
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
                 torch.zeros(len(samples), dtype=torch.long, device=device), torch.ones(mask.shape, device=device))


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
    rollout_correction: str = "none"        # a row of ROLLOUT_CORRECTION_TABLE
    rollout_correction_cap: float = 2.0     # its C
    policy_loss: str = "clip"               # a row of POLICY_LOSS_TABLE
    loss_agg: str = "view_token_mean"       # a row of LOSS_AGG_TABLE
    clip_high: float | None = None          # ε_high (None: clip_eps, a symmetric clip)
    entropy_coef: float = 0.0               # the entropy bonus's coefficient
    max_response_len: int = 48              # the longest response allowed (seq_mean_token_sum_norm's constant)


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


def micro_batches_for_all_ranks(lengths, cfg):
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
    for rows in micro_batches_for_all_ranks(batch.lengths(), cfg):
        part = batch.rows(rows)
        logp[rows, :part.mask.shape[1]] = token_logprobs(model, part.input_ids, part.mask, cfg.temperature)[0]
    reshard(model)             # FSDP keeps the root unit (the embedding) gathered after a forward; no backward frees it
    return logp


@torch.no_grad()
def score_responses(model, batch, cfg, fn):
    """[N]: the mean over each response's tokens of fn(log-probs over the vocabulary [c, V]) -> [c],
    under the model at the sampling temperature, in micro-batches (the answer-free rewards)."""
    out = torch.zeros(len(batch), device=batch.mask.device)
    for rows in micro_batches_for_all_ranks(batch.lengths(), cfg):
        part = batch.rows(rows)
        out[rows] = token_values(model, part.input_ids, part.mask, cfg.temperature, fn).sum(-1) / part.mask.sum(-1)
    return out


class NonFiniteError(GuardStop, FloatingPointError):
    """A loss, sampler log-prob gap or gradient norm that is NaN or infinite: the step stops
    before the optimizer touches the weights."""


def train_step(policy, ref, optimizer, batch, cfg, world_size, order=None):
    """Reference log-probs, then `cfg.mini_batches` clipped-GRPO updates.

    π_old is the policy that sampled the batch. With one update per step it is the policy
    being updated, so its log-probs are the update's own forward, detached; with several
    updates they come from one no-grad pass before the first, so that later updates take
    their ratio against the sampling policy and can clip. `order` (a permutation of the rows,
    default random) says which rows each update takes: update k takes its k-th chunk.

    Each token's loss is weighted by `batch.weight`, and each view's normaliser is the sum of those
    weights (NORMALISATION); its policy term is also weighted by the rollout correction
    `cfg.rollout_correction` (ROLLOUT CORRECTION: from π_old's log-probs over the sampler's, capped at
    `cfg.rollout_correction_cap`), its KL term and the normaliser not. With correction `none` and a
    batch of weights 1 the update is bit for bit the unweighted one.

    Every rank must hold the same number of sequences, divisible by `cfg.mini_batches` (FSDP's
    collectives pair up per forward and backward). Before each optimizer step the ranks agree
    that every loss, sampler gap and the gradient norm is finite; otherwise all of them raise
    NonFiniteError and the weights stay as they were.

    With `cfg.defer_grad_sync`, FSDP keeps each micro-batch's gradients unsharded and reduce-scatters
    once, after an update's last micro-batch: one reduction per update instead of one per micro-batch,
    for the memory of the full unsharded gradients (the memory account in bench/scale.py).

    Returns token sums for metrics (the caller sums them over ranks; kl and entropy are those
    of each update's forward; sampler_ratio_sum that of the correction's ratio before the cap, w_t or
    W, and sampler_capped_sum the tokens whose ratio is above the cap: truncated by tis, masked by
    mis, and with none those a cap would act on) and grad_norm, the largest pre-clipping gradient
    norm among the step's updates."""
    if len(batch) % cfg.mini_batches:
        raise ValueError(f"{len(batch)} sequences on this rank do not split into {cfg.mini_batches} equal "
                         f"mini-batches")
    ref_logp = score(ref, batch, cfg)
    old_logp = score(policy, batch, cfg) if cfg.mini_batches > 1 else None
    m = batch.mask
    stats = {"grad_norm": 0.0, "updates": cfg.mini_batches}
    order = torch.randperm(len(batch)) if order is None else order
    lengths = batch.lengths()
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
        stats["grad_norm"] = max(stats["grad_norm"], norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stats


def stop_if_non_finite(nonfinite, norm, update, updates):
    """Raise NonFiniteError, before the optimizer steps, when any rank's losses or sampler gaps (`nonfinite`, summed
    over ranks) or the gradient norm is NaN or infinite."""
    if nonfinite.any() or not math.isfinite(norm):
        raise NonFiniteError(
            f"update {update + 1} of {updates}: {int(nonfinite[0])} non-finite loss(es), {int(nonfinite[1])} "
            f"non-finite sampler log-prob gap(s), gradient norm {norm}. The update was not applied: the weights are "
            f"those before it. Look for NaN or infinite rewards or advantages, a rollout engine returning NaN "
            f"log-probs (its weights), or a learning rate too high for the dtype.")


def tally(stats, part, n, cfg, **values):
    """Add a micro-batch's sums to the step's `stats` (train_step's record): token sums over the masked positions,
    and the loss and its parts as this rank's share of each update's loss, whole and for each view (the rows of
    that view alone, under the same aggregation: the views' parts add up to the whole)."""
    mask, agg = part.mask, LOSS_AGGS[cfg.loss_agg]
    weight = mask * part.weight
    sums = {"tokens": mask.sum(), "kl_sum": values["kl"] * mask, "entropy_sum": values["entropy"] * mask,
            "sampler_gap_sum": values["gap"], "sampler_ratio_sum": values["ratios"] * mask,
            "sampler_capped_sum": (values["ratios"] > cfg.rollout_correction_cap) * mask,
            "clipped_low_sum": values["terms"]["clipped_low"] * mask,
            "clipped_high_sum": values["terms"]["clipped_high"] * mask, "loss_sum": values["loss"]}
    for v in range(VIEWS):
        in_view = (part.view == v)[:, None].float()
        for term in ("policy", "kl", "entropy"):
            sums[f"loss_{term}_sum/{v}"] = agg(values["terms"][term] * in_view, part.view, weight, n)
        sums[f"clipped_sum/{v}"] = (values["terms"]["clipped_low"] + values["terms"]["clipped_high"]) * mask * in_view
        sums[f"tokens/{v}"] = mask * in_view
    for key, value in sums.items():
        stats[key] = stats.get(key, 0.0) + value.sum().item()
