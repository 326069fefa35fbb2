"""The loss family of grpo.py, row by row: each policy loss (POLICY_LOSS_TABLE: the token clip with clip-higher, GSPO's
sequence clip, CISPO's clipped weight), each aggregation (LOSS_AGG_TABLE), each advantage scale (ADVANTAGE_STD_TABLE)
and each overlong shaping (OVERLONG_TABLE), by hand on tiny tensors and against the formulas as verl's core_algos and
TRL's GRPOTrainer write them (restated below in a few lines each, values and gradients); the entropy bonus's gradient
through the chunked log-probs against plain autograd; and two ranks against one for every aggregation and policy loss
(tests/losses_ranks_worker.py)."""
import math
import os
import subprocess
import sys

import pytest
import torch

import grpo
from grpo import Batch, group_advantages
from harness.logprobs import naive_vocab_logprobs, token_logprobs
from conftest import ROOT
from test_grpo import _batch, _tiny_model, step_config

LN = math.log


# --------------------------------------------------------------------------------------------
# The formulas as verl and TRL write them, restated


def overlong(name, rewards, lengths, truncated, max_len=48, buffer=8):
    """A row of grpo.OVERLONG_TABLE, called as grpo.update calls it."""
    return grpo.call(grpo.OVERLONGS[name], rewards=rewards, lengths=lengths, truncated=truncated, max_len=max_len,
                     buffer=buffer)

def verl_vanilla(logp, old, adv, low, high):
    """verl's vanilla PPO loss per token (no dual clip): the larger of -A ρ and -A clip(ρ, 1 - low, 1 + high); and its
    clip fraction's indicator, the tokens where the clipped loss is the larger."""
    ratio = torch.exp(logp - old)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def verl_gspo(logp, old, adv, mask, low, high):
    """verl's GSPO per token: the response's mean log-ratio (over its mask, length at least 1) stands in, detached, for
    the token's log-ratio, and the token's own log-prob carries the gradient (logp - sg(logp)); clamped above at 10,
    exponentiated, then the same max of the two PPO losses."""
    log_ratio = logp - old
    seq_mean = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = (logp - logp.detach() + seq_mean.detach()[:, None]).clamp(max=10.0)
    s = torch.exp(log_s)
    unclipped = -adv * s
    clipped = -adv * torch.clamp(s, 1 - low, 1 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def verl_cispo(logp, old, adv, low, high):
    """verl's CISPO per token: the ratio clamped to [1 - low, 1 + high], detached, weighting -A log π; a token is
    clipped where its ratio lies outside the range, whatever the sign of A."""
    ratio = torch.exp(logp - old)
    weight = torch.clamp(ratio, 1 - low, 1 + high).detach()
    return -weight * adv * logp, (ratio < 1 - low) | (ratio > 1 + high)


def trl_cispo(logp, old, adv, epsilon_high):
    """TRL's cispo per token: the ratio capped at epsilon_high (an absolute cap, not 1 + ε), detached, times
    -A log π."""
    coef_1 = torch.exp(logp - old)
    return -torch.clamp(coef_1, max=epsilon_high).detach() * adv * logp


def k3_plain(logp, ref):
    """k3 as written, for log-ratios far from verl's clamps: e^(ref - logp) - (ref - logp) - 1."""
    return torch.exp(ref - logp) - (ref - logp) - 1


def verl_token_mean(x, mask, view, max_len):
    """verl agg_loss token-mean: masked sum over the mask's count."""
    return (x * mask).sum() / mask.sum()


def verl_seq_mean_token_mean(x, mask, view, max_len):
    """verl agg_loss seq-mean-token-mean: each sequence's masked mean, averaged over the sequences with any mask."""
    count = mask.sum(-1)
    rows = count > 0
    return ((x * mask).sum(-1)[rows] / count[rows]).mean()


def trl_grpo(x, mask, view, max_len):
    """TRL loss_type="grpo": each row's token mean, averaged over the rows."""
    return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def trl_dapo(x, mask, view, max_len):
    """TRL loss_type="dapo" (and "bnpo" on one process): the masked sum over the batch's response tokens."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def trl_dr_grpo(x, mask, view, max_len):
    """TRL loss_type="dr_grpo": the masked sum over rows x max_completion_length."""
    return (x * mask).sum() / (x.shape[0] * max_len)


def official_two_views(x, mask, view, max_len):
    """The official Co-rewarding actor: policy_loss_ori + policy_loss_aug, each view's masked token mean."""
    return sum((x * mask)[view == v].sum() / mask[view == v].sum() for v in (0, 1) if (view == v).any())


# each row of LOSS_AGG_TABLE, and the restatements it must equal
AGG_RESTATEMENTS = {
    "view_token_mean":         [official_two_views],
    "token_mean":              [verl_token_mean, trl_dapo],
    "seq_mean_token_mean":     [verl_seq_mean_token_mean, trl_grpo],
    "seq_mean_token_sum_norm": [trl_dr_grpo],
}


def trl_advantages(rewards, scale_rewards, eps):
    """TRL's advantages for rewards [P, G]: r minus its group's mean, divided (unless "none") by the group's unbiased
    std ("group") or by the unbiased std of every reward ("batch"), plus eps."""
    G = rewards.shape[1]
    flat = rewards.flatten()
    mean = flat.view(-1, G).mean(1).repeat_interleave(G)
    if scale_rewards == "batch":
        std = flat.std().expand_as(flat)
    else:
        std = flat.view(-1, G).std(1).repeat_interleave(G)
    adv = flat - mean
    if scale_rewards != "none":
        adv = adv / (std + eps)
    return adv.view_as(rewards)


def dapo_overlong(length, max_len, buffer):
    """DAPO / verl's overlong buffer (penalty factor 1): min(-(L - (max_len - buffer)) / buffer, 0)."""
    expected_len = max_len - buffer
    return min(-(length - expected_len) / buffer, 0.0)


def trl_soft_overlong(length, max_len, cache):
    """TRL get_soft_overlong_punishment: 0 up to max - cache, then (max - cache - L) / cache up to max, -1 beyond."""
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return (max_len - cache - length) / cache
    return -1.0


# --------------------------------------------------------------------------------------------
# Helpers

def _loss(logp, old, adv, mask, cfg, view=None, weight=None, ref=None, entropy=None):
    """grpo.grpo_loss of these tensors under cfg, with the Normalizers loss_normalizers_over_ranks makes on one rank."""
    view = torch.zeros(len(mask), dtype=torch.long) if view is None else view
    weight = torch.ones_like(mask) if weight is None else weight
    n = grpo.loss_normalizers_over_ranks(mask * weight, view, 1, cfg.max_response_len)
    part = Batch(None, mask, adv, None, view, weight)
    ref = logp.detach() if ref is None else ref
    entropy = torch.zeros_like(logp) if entropy is None else entropy
    return grpo.grpo_loss(logp, old, ref, entropy, part, n, torch.ones_like(logp), cfg)


def _from_ratios(logp, ratios):
    """π_old's log-probs that give each token of logp its ratio."""
    return logp - torch.tensor(ratios).log()


def test_the_tables_rows_are_those_tested():
    """A new row of any table must come with its tests here: the rows are those this file checks, with the policy
    losses' default clips (GSPO's paper ranges; CISPO no lower clip, ε_high 4)."""
    assert list(grpo.POLICY_LOSSES) == ["clip", "gspo", "cispo"]
    assert {k: (v["clip_eps"], v["clip_high"], v["loss_agg"]) for k, v in grpo.POLICY_LOSS_SETTINGS.items()} == \
        {"clip": (None, None, None), "gspo": (3e-4, 4e-4, "seq_mean_token_mean"), "cispo": (1.0, 4.0, None)}
    assert list(grpo.LOSS_AGGS) == list(AGG_RESTATEMENTS)
    assert list(grpo.ADVANTAGE_STDS) == ["group", "batch", "none", "given"]
    assert list(grpo.OVERLONGS) == ["none", "mask", "soft"]


# --------------------------------------------------------------------------------------------
# 1. Each policy loss by hand

TOKEN_LOGP = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.3, -2.0, -3.0]])
TOKEN_RATIOS = [[1.25, 1.3, 0.7, 20.0], [0.75, 0.85, 1.5, 0.05]]     # the last column is padding
TOKEN_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
TOKEN_ADV = torch.tensor([2.0, -1.0])


def test_token_clip_by_hand_with_clip_higher(dist_world):
    """ε_low 0.2, ε_high 0.28: the range [0.8, 1.28]. Row 0, A = 2: ρ 1.25 is inside (-2.5), 1.3 is clipped above
    (-2 x 1.28 = -2.56, clipped_high), 0.7 with A > 0 is not clipped (-1.4). Row 1, A = -1: ρ 0.75 is clipped below
    (-min(-0.75, -0.8) = 0.8, clipped_low), 0.85 inside (0.85), 1.5 with A < 0 not clipped (1.5). The gradient of a
    token's term in log π is -A ρ where unclipped, 0 where the clip binds. A symmetric clip (clip_high None) clips
    1.25 too: -2.4. Through grpo_loss with token_mean the loss is the terms' sum over 6 tokens."""
    logp = TOKEN_LOGP.clone().requires_grad_(True)
    old = _from_ratios(TOKEN_LOGP, TOKEN_RATIOS)
    cfg = step_config(clip_eps=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token_mean")
    loss, terms = _loss(logp, old, TOKEN_ADV, TOKEN_MASK, cfg)
    expected = torch.tensor([[-2.5, -2.56, -1.4, 0.0], [0.8, 0.85, 1.5, 0.0]])
    assert torch.allclose(terms["policy"], expected, atol=1e-6)
    assert loss.item() == pytest.approx(expected.sum().item() / 6, abs=1e-6)
    assert (terms["clipped_high"] * TOKEN_MASK).tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]
    assert (terms["clipped_low"] * TOKEN_MASK).tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]
    loss.backward()
    assert torch.allclose(logp.grad * 6, torch.tensor([[-2.5, 0, -1.4, 0], [0, 0.85, 1.5, 0]]), atol=1e-6)
    # the row itself, and a symmetric clip through grpo_loss
    term, low, high = grpo.call(grpo.POLICY_LOSSES["clip"], logp=TOKEN_LOGP, old_logp=old, adv=TOKEN_ADV[:, None],
                                      mask=TOKEN_MASK, low=0.2, high=0.28)
    assert torch.allclose(term * TOKEN_MASK, expected, atol=1e-6)
    _, sym = _loss(TOKEN_LOGP, old, TOKEN_ADV, TOKEN_MASK, step_config(clip_eps=0.2, kl_coef=0.0))
    assert torch.allclose(sym["policy"], torch.tensor([[-2.4, -2.4, -1.4, 0.0], [0.8, 0.85, 1.5, 0.0]]), atol=1e-6)
    assert (sym["clipped_high"] * TOKEN_MASK).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]


SEQ_LOG_RATIOS = torch.tensor([[0.1, -0.05, 0.15, 5.0],     # A = 1: mean 0.2 / 3, s = 1.068939, inside
                               [0.3, 0.4, 5.0, 5.0],         # A = 1: mean 0.35, s = 1.419068, clipped above
                               [-0.4, -0.2, -0.3, 5.0],      # A = -1: mean -0.3, s = 0.740818, clipped below
                               [0.5, -0.3, 5.0, 5.0],        # A = 2: mean 0.1, s = 1.105171, inside (token 0's
                               [12.0, 12.0, 5.0, 5.0]])      # A = -1: mean 12, clamped at 10: s = e^10   ρ is 1.65)
SEQ_MASK = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
SEQ_ADV = torch.tensor([1.0, 1.0, -1.0, 2.0, -1.0])


def test_sequence_clip_gspo_by_hand(dist_world):
    """GSPO, ε_low 0.2, ε_high 0.28, log-ratios on the padding 5 (they must not count). s_i = exp(mean over the
    response of log π - log π_old), the same on each of its tokens:
      row 0, A = 1:  s = e^(0.2/3) = 1.068939, inside:       each token -1.068939
      row 1, A = 1:  s = e^0.35    = 1.419068 > 1.28:         each token -1.28, clipped_high
      row 2, A = -1: s = e^-0.3    = 0.740818 < 0.8:          each token 0.8, clipped_low
      row 3, A = 2:  s = e^0.1     = 1.105171, inside:        each token -2.210342 (token 0's own ratio 1.65 would clip)
      row 4, A = -1: mean 12 clamped to 10, s = e^10 = 22026.47 (A < 0: not clipped): each token 22026.47, no gradient.
    seq_mean_token_mean: the loss is the mean over 5 rows of these; d loss / d log π_t = -A s_i / |o_i| / 5 on an
    unclipped response (s_i / |o_i| through the mean), 0 on a clipped or clamped one, 0 on padding."""
    logp = torch.full((5, 4), -1.0, requires_grad=True)
    old = logp.detach() - SEQ_LOG_RATIOS
    s = [math.exp(0.2 / 3), math.exp(0.35), math.exp(-0.3), math.exp(0.1), math.exp(10.0)]
    per_row = [-s[0], -1.28, 0.8, -2 * s[3], s[4]]
    cfg = step_config(clip_eps=0.2, clip_high=0.28, kl_coef=0.0, policy_loss="gspo", loss_agg="seq_mean_token_mean")
    loss, terms = _loss(logp, old, SEQ_ADV, SEQ_MASK, cfg)
    expected = torch.tensor(per_row)[:, None] * SEQ_MASK
    assert torch.allclose(terms["policy"], expected, rtol=1e-6, atol=1e-6)
    assert loss.item() == pytest.approx(sum(per_row) / 5, rel=1e-6)
    assert (terms["clipped_high"] * SEQ_MASK).tolist() == [[0] * 4, [1, 1, 0, 0], [0] * 4, [0] * 4, [0] * 4]
    assert (terms["clipped_low"] * SEQ_MASK).tolist() == [[0] * 4, [0] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4]
    loss.backward()
    grad = torch.zeros(5, 4)
    grad[0, :3] = -s[0] / 3 / 5
    grad[3, :2] = -2 * s[3] / 2 / 5
    assert torch.allclose(logp.grad, grad, atol=1e-7)


def test_clipped_weight_cispo_by_hand():
    """CISPO: -sg(clip(ρ, 1 - low, 1 + high)) A log π. The table's clips (1.0, 4.0), A = 2, log π (-1, -2, -0.5),
    ρ (0.5, 3, 6): weights 0.5, 3, 5 (6 capped), terms 1, 12, 5; clipped_high on the third; the gradient -w A =
    -1, -6, -10: the clipped token keeps a gradient, the detached weight contributes none (with it, token 0's would be
    -A ρ (1 + log π) = 0). With (0.2, 0.28), A = -1, log π (-1, -0.5, -2), ρ (0.5, 1, 2): weights 0.8, 1, 1.28,
    terms w log π = -0.8, -0.5, -2.56, clipped_low on the first and clipped_high on the third (whatever A's sign),
    gradient w."""
    low, high = (grpo.POLICY_LOSS_SETTINGS["cispo"][k] for k in ("clip_eps", "clip_high"))
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = _from_ratios(logp.detach(), [[0.5, 3.0, 6.0]])
    term, below, above = grpo.call(grpo.POLICY_LOSSES["cispo"], logp=logp, old_logp=old, adv=torch.tensor([[2.0]]),
                                    mask=torch.ones(1, 3), low=low, high=high)
    assert torch.allclose(term, torch.tensor([[1.0, 12.0, 5.0]]), atol=1e-5)
    assert below.tolist() == [[False] * 3] and above.tolist() == [[False, False, True]]
    term.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -6.0, -10.0]]), atol=1e-5)

    logp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    old = _from_ratios(logp.detach(), [[0.5, 1.0, 2.0]])
    term, below, above = grpo.call(grpo.POLICY_LOSSES["cispo"], logp=logp, old_logp=old, adv=torch.tensor([[-1.0]]),
                                    mask=torch.ones(1, 3), low=0.2, high=0.28)
    assert torch.allclose(term, torch.tensor([[-0.8, -0.5, -2.56]]), atol=1e-6)
    assert below.tolist() == [[True, False, False]] and above.tolist() == [[False, False, True]]
    term.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.8, 1.0, 1.28]]), atol=1e-6)


# --------------------------------------------------------------------------------------------
# 2. Against verl and TRL

def _random_batch(seed=0, spread=0.3):
    """6 responses of 2, 7, 4, 1, 5 and 3 tokens (right-padded to 8), in views 0 1 0 1 1 0, advantages of both signs,
    log-ratios log π - log π_old ~ N(0, spread), π_ref near π_θ, entropies in (0, 3); padding holds junk."""
    g = torch.Generator().manual_seed(seed)
    lengths = [2, 7, 4, 1, 5, 3]
    mask = torch.zeros(6, 8)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    logp = -3 * torch.rand(6, 8, generator=g) - 0.05
    old = logp + spread * torch.randn(6, 8, generator=g)
    ref = logp + 0.2 * torch.randn(6, 8, generator=g)
    adv = torch.tensor([1.3, -0.7, 0.4, -1.5, 0.9, -0.2])
    entropy = 3 * torch.rand(6, 8, generator=g)
    view = torch.tensor([0, 1, 0, 1, 1, 0])
    return logp, old, ref, adv, mask, entropy, view


def test_token_clip_equals_verls_vanilla_loss(dist_world):
    """Random log-ratios (spread 0.3: tokens clip on both sides), clip-higher (0.2, 0.28): grpo_loss with token_mean
    equals verl's token-mean of max(-A ρ, -A clip(ρ)), in value and in gradient wrt log π; the clip flags
    (low | high) are verl's pg_clipfrac indicator, clipped > unclipped, on every response token."""
    logp, old, _, adv, mask, _, _ = _random_batch()
    logp.requires_grad_(True)
    cfg = step_config(clip_eps=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token_mean")
    loss, terms = _loss(logp, old, adv, mask, cfg)
    verl, verl_clipped = verl_vanilla(logp, old, adv[:, None], 0.2, 0.28)
    expected = verl_token_mean(verl, mask, None, None)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    flags = terms["clipped_low"] + terms["clipped_high"]
    assert torch.equal(flags * mask, verl_clipped.float() * mask)
    assert (terms["clipped_low"] * mask).sum() > 0 and (terms["clipped_high"] * mask).sum() > 0
    ours, = torch.autograd.grad(loss, logp, retain_graph=True)
    theirs, = torch.autograd.grad(expected, logp)
    assert torch.allclose(ours, theirs, atol=1e-7)


def test_sequence_clip_equals_verls_gspo(dist_world):
    """GSPO (0.2, 0.28) with seq_mean_token_mean: the same loss value and the same gradient wrt log π as verl's
    token-level stop-gradient formulation aggregated by seq-mean-token-mean; the gradient is -A s_i / |o_i| / N_seq on
    each token of an unclipped response and 0 on a clipped one (both occur); verl's clip indicator is our flags on
    every response token. Each response's log-ratios are an offset (0.35, -0.05, -0.3, 0.1, 0.05, -0.4; A of signs
    + - + - + -) plus noise of 0.1, so that responses clip above, below and not at all; then the same x 2e-3 at the
    table's own ranges (3e-4, 4e-4): the same again."""
    logp, old, _, adv, mask, _, _ = _random_batch(seed=1, spread=0.1)
    offset = torch.tensor([0.35, -0.05, -0.3, 0.1, 0.05, -0.4])[:, None]
    for low, high, scale in ((0.2, 0.28, 1.0), (3e-4, 4e-4, 2e-3)):
        old_s = logp - scale * (offset + logp - old)
        x = logp.clone().requires_grad_(True)
        cfg = step_config(clip_eps=low, clip_high=high, kl_coef=0.0, policy_loss="gspo", loss_agg="seq_mean_token_mean")
        loss, terms = _loss(x, old_s, adv, mask, cfg)
        verl, verl_clipped = verl_gspo(x, old_s, adv[:, None], mask, low, high)
        expected = verl_seq_mean_token_mean(verl, mask, None, None)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
        flags = (terms["clipped_low"] + terms["clipped_high"]) * mask
        assert torch.equal(flags, verl_clipped.float() * mask)
        ours, = torch.autograd.grad(loss, x)
        theirs, = torch.autograd.grad(expected, x)
        assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
        # by hand: -A s_i / |o_i| / N_seq, or 0
        count = mask.sum(-1)
        s = torch.exp(((logp - old_s) * mask).sum(-1) / count)
        clipped = flags.amax(-1) > 0
        by_hand = torch.where(clipped, 0.0, -adv * s / count / len(mask))[:, None] * mask
        assert torch.allclose(ours, by_hand, atol=1e-7, rtol=1e-6)
        assert clipped.any() and not clipped.all()


def test_clipped_weight_equals_verls_and_trls_cispo(dist_world):
    """CISPO at the table's (1.0, 4.0), log-ratios ~ N(0, 1) (ratios above 5 occur): per token, value and gradient,
    our term equals verl's cispo (clip_ratio_low 1, clip_ratio_high 4) and TRL's (epsilon_high 5, an absolute cap);
    our flags are verl's is_clipped. Through grpo_loss with token_mean, the loss is TRL's dapo mean of its terms."""
    logp, old, _, adv, mask, _, _ = _random_batch(seed=2, spread=1.0)
    low, high = (grpo.POLICY_LOSS_SETTINGS["cispo"][k] for k in ("clip_eps", "clip_high"))
    x = logp.clone().requires_grad_(True)
    term, below, above = grpo.call(grpo.POLICY_LOSSES["cispo"], logp=x, old_logp=old, adv=adv[:, None], mask=mask, low=low,
                                    high=high)
    verl, verl_clipped = verl_cispo(x, old, adv[:, None], low, high)
    trl = trl_cispo(x, old, adv[:, None], high + 1)
    assert ((torch.exp(logp - old) > 5) * mask).sum() > 0
    assert torch.allclose(term * mask, verl * mask, atol=1e-6) and torch.allclose(term * mask, trl * mask, atol=1e-6)
    assert torch.equal((below | above) & mask.bool(), verl_clipped & mask.bool())
    ours, = torch.autograd.grad((term * mask).sum(), x)
    for other in (verl, trl):
        theirs, = torch.autograd.grad((other * mask).sum(), x)
        assert torch.allclose(ours, theirs, atol=1e-6)
    cfg = step_config(clip_eps=low, clip_high=high, kl_coef=0.0, policy_loss="cispo", loss_agg="token_mean")
    loss, _ = _loss(x, old, adv, mask, cfg)
    assert loss.item() == pytest.approx(trl_dapo(trl, mask, None, None).item(), rel=1e-6)


def _per_token_reference(logp, old, ref, adv, mask, entropy, low, high, beta, coef):
    """The token loss restated: verl's vanilla term + β k3 - coef H."""
    return verl_vanilla(logp, old, adv[:, None], low, high)[0] + beta * k3_plain(logp, ref) - coef * entropy


@pytest.mark.parametrize("agg", list(AGG_RESTATEMENTS))
def test_each_aggregation_equals_verl_and_trl(dist_world, agg):
    """A random batch of 6 rows of 2, 7, 4, 1, 5, 3 tokens in two views; the token loss is the clip-higher term, β k3
    (β 0.05) and an entropy bonus (coefficient 0.01), every weight 1. grpo_loss with the row (Normalizers from
    loss_normalizers_over_ranks, one rank) equals each restatement of it, value and gradient wrt log π:
    view_token_mean the official code's two views' means summed; token_mean verl token-mean and TRL dapo;
    seq_mean_token_mean verl seq-mean-token-mean and TRL grpo; seq_mean_token_sum_norm TRL dr_grpo with
    max_completion_length 48 (StepConfig.max_response_len)."""
    logp, old, ref, adv, mask, entropy, view = _random_batch(seed=3)
    logp.requires_grad_(True)
    cfg = step_config(clip_eps=0.2, clip_high=0.28, kl_coef=0.05, entropy_coef=0.01, loss_agg=agg)
    loss, terms = _loss(logp, old, adv, mask, cfg, view=view, ref=ref, entropy=entropy)
    per_token = _per_token_reference(logp, old, ref, adv, mask, entropy, 0.2, 0.28, 0.05, 0.01)
    assert torch.allclose(terms["policy"] + terms["kl"] + terms["entropy"], per_token.detach() * mask, atol=1e-6)
    ours, = torch.autograd.grad(loss, logp, retain_graph=True)
    values = set()
    for restate in AGG_RESTATEMENTS[agg]:
        expected = restate(per_token, mask, view, 48)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6), restate.__name__
        theirs, = torch.autograd.grad(expected, logp, retain_graph=True)
        assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-5), restate.__name__
        values.add(round(expected.item(), 6))
    others = {round(r(per_token, mask, view, 48).item(), 6) for a, rs in AGG_RESTATEMENTS.items() if a != agg
              for r in rs}
    assert not values & others                         # the rows differ on this batch: each test tells them apart


@pytest.mark.parametrize("agg", list(AGG_RESTATEMENTS))
def test_a_dropped_row_leaves_every_denominator(dist_world, agg):
    """Rows 1 (7 tokens, view 1) and 2 (4 tokens, view 0) get weight 0 (a dropped group): the Normalizers count 4
    sequences and 2 + 1 + 5 + 3 = 11 tokens, 5 of view 0 and 6 of view 1, and each aggregation of the whole batch equals
    its restatements over the 4 kept rows alone (their tokens, their sequences: TRL's B is 4), value and gradient; the
    dropped rows get no gradient."""
    logp, old, ref, adv, mask, entropy, view = _random_batch(seed=4)
    logp.requires_grad_(True)
    keep = torch.tensor([True, False, False, True, True, True])
    weight = keep[:, None].float().expand_as(mask).clone()
    n = grpo.loss_normalizers_over_ranks(mask * weight, view, 1, 48)
    assert n.sequences.item() == 4 and n.tokens.item() == 11 and n.view_tokens.tolist() == [5.0, 6.0]
    cfg = step_config(clip_eps=0.2, clip_high=0.28, kl_coef=0.05, entropy_coef=0.01, loss_agg=agg)
    loss, _ = _loss(logp, old, adv, mask, cfg, view=view, weight=weight, ref=ref, entropy=entropy)
    ours, = torch.autograd.grad(loss, logp)
    assert ours[~keep].abs().sum() == 0 and ours[keep].abs().sum() > 0
    for restate in AGG_RESTATEMENTS[agg]:
        kept = logp[keep].detach().requires_grad_(True)
        per_token = _per_token_reference(kept, old[keep], ref[keep], adv[keep], mask[keep], entropy[keep], 0.2, 0.28,
                                         0.05, 0.01)
        expected = restate(per_token, mask[keep], view[keep], 48)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6), restate.__name__
        theirs, = torch.autograd.grad(expected, kept)
        assert torch.allclose(ours[keep], theirs, atol=1e-7, rtol=1e-5), restate.__name__


# --------------------------------------------------------------------------------------------
# Advantages and overlong shaping

def test_advantage_scales_by_hand(dist_world):
    """Rewards [[1, 0, 0, 1], [1, 1, 1, 1]]: group means 0.5 and 1.
      group: group 0's unbiased std sqrt(1/3) = 0.57735 -> ±0.866025; group 1 0
      batch: the unbiased std of all 8 rewards (six 1s, two 0s; mean 0.75): sqrt((6 x 0.0625 + 2 x 0.5625) / 7) =
             sqrt(1.5 / 7) = 0.462910 -> ±0.5 / 0.462910 = ±1.080123; group 1 0 (a biased std, sqrt(1.5 / 8), would
             give ±1.154701)
      none:  r - mean: ±0.5; group 1 0.
      given: the rewards as they are (a method's own advantages: RESTRAIN's)."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(group_advantages(r, scale=grpo.ADVANTAGE_STDS["given"]), r)
    expected = {"group": 0.866025, "batch": 0.5 / math.sqrt(1.5 / 7), "none": 0.5}
    for name, a in expected.items():
        adv = group_advantages(r, scale=grpo.ADVANTAGE_STDS[name])
        assert torch.allclose(adv, torch.tensor([[a, -a, -a, a], [0.0] * 4]), atol=1e-5), name
    assert expected["batch"] == pytest.approx(1.080123, abs=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trls(dist_world, scale):
    """Rewards of 5 groups of 6 (continuous, binary, and one constant group), TRL's scale_rewards formula with its eps
    1e-4, passed as ours: equal to 1e-6; with our default eps 1e-6 within 1e-3 (the eps's effect on a std of ~0.5)."""
    g = torch.Generator().manual_seed(5)
    r = torch.cat([torch.rand(2, 6, generator=g), (torch.rand(2, 6, generator=g) > 0.5).float(), torch.ones(1, 6)])
    ours = group_advantages(r, eps=1e-4, scale=grpo.ADVANTAGE_STDS[scale])
    trl = trl_advantages(r, scale, 1e-4)
    assert torch.allclose(ours, trl, atol=1e-6)
    assert torch.allclose(group_advantages(r, scale=grpo.ADVANTAGE_STDS[scale]), trl, atol=1e-3)
    assert torch.equal(ours[-1], torch.zeros(6))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_float_rewards_give_zero_advantages_exactly(dist_world, scale):
    """200 groups of 8 equal non-dyadic float32 rewards (the answer-free rewards of identical responses): the float32
    mean misses many of them by a rounding, which the group std + 1e-6 (exactly 0 + 1e-6 or a rounding) blew up to
    |A| near 2. Every advantage is 0, exactly, under each scale; a group that differs in one reward keeps its
    advantages, TRL's formula's."""
    g = torch.Generator().manual_seed(6)
    r = torch.rand(200, 1, generator=g).expand(200, 8).contiguous()
    assert ((r.mean(-1, keepdim=True) - r) != 0).any()                     # the roundings the test is about
    assert torch.equal(group_advantages(r, scale=grpo.ADVANTAGE_STDS[scale]), torch.zeros(200, 8))
    r[0, 3] += 0.25
    adv = group_advantages(r, scale=grpo.ADVANTAGE_STDS[scale])
    assert torch.allclose(adv[0], trl_advantages(r, scale, 1e-6)[0], atol=1e-5) and adv[0].abs().max() > 0.1
    assert torch.equal(adv[1:], torch.zeros(199, 8))


def test_the_batch_std_of_rewards_far_from_zero(dist_world):
    """Continuous rewards near a collapse, mean 12 and spread 0.01 over 16 groups of 8: the batch scale is the float64
    std of all of them + 1e-6 to 1e-6 relative (float32 sums of squares put it 14% off)."""
    g = torch.Generator().manual_seed(7)
    r = 12 + 0.01 * torch.randn(16, 8, generator=g)
    scale = grpo.batch_std(r, 1e-6).item()
    assert scale == pytest.approx(r.double().std().item() + 1e-6, rel=1e-6)


def test_seq_mean_token_sum_norm_is_verls_over_n_seq(dist_world):
    """verl's seq-mean-token-sum-norm divides each rank's token sums by L_max alone (a listed departure): on one rank,
    ours times N_seq (4 responses of weight) is verl's, value and gradient; TRL's dr_grpo is ours (the table's test)."""
    logp, old, ref, adv, mask, entropy, view = _random_batch(seed=8)
    logp.requires_grad_(True)
    keep = torch.tensor([True, False, True, True, False, True])
    weight = keep[:, None].float().expand_as(mask).clone()
    cfg = step_config(kl_coef=0.05, loss_agg="seq_mean_token_sum_norm")
    loss, _ = _loss(logp, old, adv, mask, cfg, view=view, weight=weight, ref=ref)
    per_token = _per_token_reference(logp, old, ref, adv, mask, torch.zeros_like(mask), 0.2, 0.2, 0.05, 0.0)
    verl = (per_token * mask * weight).sum() / 48
    assert (4 * loss).item() == pytest.approx(verl.item(), rel=1e-6)
    ours, = torch.autograd.grad(4 * loss, logp, retain_graph=True)
    theirs, = torch.autograd.grad(verl, logp)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-5)


def test_soft_overlong_by_hand_and_against_dapo_and_trl():
    """max_len 48, buffer 8: no penalty up to L = 40, then (40 - L) / 8: L 41 -> -0.125, 44 -> -0.5, 48 -> -1; the
    reward plus the penalty, every weight 1. Every L from 1 to 48 equals DAPO/verl's min(-(L - 40) / 8, 0) and TRL's
    soft punishment."""
    lengths = torch.tensor([[10.0, 40.0, 41.0], [44.0, 47.0, 48.0]])
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.5, 1.0, 0.0]])
    truncated = lengths == 48
    shaped, weight = overlong("soft", rewards, lengths, truncated)
    assert torch.allclose(shaped, rewards + torch.tensor([[0.0, 0.0, -0.125], [-0.5, -0.875, -1.0]]), atol=1e-7)
    assert torch.equal(weight, torch.ones(2, 3))
    every = torch.arange(1, 49, dtype=torch.float32)[None]
    penalty, _ = overlong("soft", torch.zeros_like(every), every, every == 48)
    for L, p in zip(range(1, 49), penalty[0].tolist()):
        assert p == pytest.approx(dapo_overlong(L, 48, 8), abs=1e-7) == pytest.approx(trl_soft_overlong(L, 48, 8)), L


def test_mask_and_none_overlong_by_hand():
    """mask: the responses cut at the limit (truncated) get weight 0, the others 1, the rewards unchanged; none:
    rewards unchanged, weights 1."""
    lengths = torch.tensor([[48.0, 12.0, 48.0], [30.0, 48.0, 47.0]])
    truncated = torch.tensor([[True, False, True], [False, True, False]])
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 1.0]])
    shaped, weight = overlong("mask", rewards, lengths, truncated)
    assert torch.equal(shaped, rewards) and weight.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    shaped, weight = overlong("none", rewards, lengths, truncated)
    assert torch.equal(shaped, rewards) and torch.equal(weight, torch.ones(2, 3))


# --------------------------------------------------------------------------------------------
# 3. The entropy bonus

def test_entropy_bonus_gradient_matches_plain_autograd(dist_world):
    """On the tiny model (its output layer x 8: at temperature 0.7 the mean entropy is 3.46 nats, ln 64 = 4.16 at most),
    ratios away from 1 (some clip), β 0.05, entropy coefficient 0.1, token_mean: the gradient wrt every parameter of
    grpo_loss through the chunked log-probs with entropy_grad=True equals plain autograd of the loss written on
    naive_vocab_logprobs with H = -Σ_v p log p (to 1e-5); the entropies and the loss agree too. With entropy_grad=False
    the loss value is the same but its gradient is that of the loss with H detached, which differs from the first."""
    model, b = _tiny_model(), _batch()
    with torch.no_grad():                  # sharper distributions: a random model's are near uniform, where dH/dz ~ 0
        model.lm_head.weight.mul_(8)
    temperature, beta, coef = 0.7, 0.05, 0.1
    g = torch.Generator().manual_seed(6)
    cfg = step_config(temperature=temperature, clip_eps=0.2, clip_high=0.28, kl_coef=beta, entropy_coef=coef,
                     loss_agg="token_mean")
    params = list(model.parameters())

    vocab = naive_vocab_logprobs(model, b.input_ids, temperature)
    logp_ref = vocab.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    entropy_ref = -(vocab.exp() * vocab).sum(-1)
    old = (logp_ref.detach() + 0.3 * torch.randn(logp_ref.shape, generator=g)) * b.mask
    ref = (logp_ref.detach() + 0.2 * torch.randn(logp_ref.shape, generator=g)) * b.mask
    expected = {}
    for grad in (True, False):
        h = entropy_ref if grad else entropy_ref.detach()
        per_token = _per_token_reference(logp_ref, old, ref, b.advantages, b.mask, h, 0.2, 0.28, beta, coef)
        expected[grad] = (per_token * b.mask).sum() / b.mask.sum()
    expected_grads = {k: torch.autograd.grad(v, params, retain_graph=True) for k, v in expected.items()}

    grads = {}
    for grad in (True, False):
        logp, entropy = token_logprobs(model, b.input_ids, b.mask, temperature, entropy=True, entropy_grad=grad)
        assert torch.allclose(entropy, entropy_ref.detach() * b.mask, atol=1e-5)
        loss, terms = _loss(logp, old, b.advantages, b.mask, cfg, ref=ref, entropy=entropy)
        assert loss.item() == pytest.approx(expected[grad].item(), rel=1e-5)
        assert torch.allclose(terms["entropy"], -coef * entropy_ref.detach() * b.mask, atol=1e-6)
        assert (terms["clipped_low"] + terms["clipped_high"]).mul(b.mask).sum() > 0
        grads[grad] = torch.autograd.grad(loss, params)
        for p, ours, theirs in zip(model.named_parameters(), grads[grad], expected_grads[grad]):
            assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (grad, p[0])
    assert max((a - b_).abs().max() for a, b_ in zip(grads[True], grads[False])) > 1e-2   # the bonus's gradient counts


# --------------------------------------------------------------------------------------------
# 4. Two ranks against one

RANK_CASES = ("view_token_mean", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm",
              "seq_mean_token_mean/dropped", "seq_mean_token_sum_norm/dropped", "clip_higher", "gspo", "gspo/wide",
              "cispo", "entropy")


@pytest.mark.full
def test_two_ranks_match_one_rank_for_every_loss(tmp_path):
    """The global batch of tests/losses_ranks_worker.py (8 rows in two views, the ranks' token counts unequal), one
    step of two mini-batches (the second's ratios away from 1, so the clips act), plain SGD, no clipping: for every
    aggregation (and two with a dropped row on each rank), clip-higher (0.1, 0.3), GSPO (its ranges, and 0.2 / 0.28),
    CISPO and an entropy bonus, one rank holding all of it and two ranks holding half each move the weights alike
    (1e-6), and the step moved them."""
    out = {}
    for n in (1, 2):
        path = tmp_path / f"w{n}.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_port", str(29610 + n),
               os.path.join(ROOT, "tests", "losses_ranks_worker.py"), str(path)]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        out[n] = torch.load(path, weights_only=True)
    start = _tiny_model().state_dict()
    assert sorted(out[1]) == sorted(out[2]) == sorted(RANK_CASES)
    for case in RANK_CASES:
        one, two = out[1][case], out[2][case]
        assert sorted(one) == sorted(two) == sorted(start)
        for name in one:
            assert torch.allclose(one[name], two[name], atol=1e-6), (case, name)
        assert sum((one[k] - start[k]).abs().sum() for k in one) > 1e-3, case      # the step moved the weights
    # the cases differ from one another: each tests its own row
    for a in RANK_CASES:
        for b in RANK_CASES:
            if a < b:
                assert max((out[1][a][k] - out[1][b][k]).abs().max() for k in start) > 1e-6, (a, b)
