"""The GRPO maths: advantages, loss, gradients, micro-batching, and 2 ranks against 1."""
import dataclasses
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import grpo
import config
from grpo import Batch, StepConfig, group_advantages, micro_batches_for_all_ranks, sequence_lengths, train_step
from harness.sharding import pack_by_tokens
from harness.errors import NonFiniteError
from harness.logprobs import naive_logprobs, token_logprobs
from harness.sharding import gather_full_weights, shard
from conftest import ROOT



def step_config(**settings):
    """A StepConfig of the classroom preset's settings, its passes grouped by count, with `settings` changed."""
    return StepConfig.of({**config.PRESETS["classroom"], "max_tokens_per_micro_batch": 0, **settings})

def test_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    a = group_advantages(r)
    # group 0: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> ±0.866025
    assert torch.allclose(a[0], torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-5)
    # all equal: no signal
    assert torch.equal(a[1], torch.zeros(4))
    # group 2: mean 0.25, std 0.5 -> (-0.5, -0.5, -0.5, 1.5)
    assert torch.allclose(a[2], torch.tensor([-0.5, -0.5, -0.5, 1.5]), atol=1e-5)


ZERO_VIEW = torch.zeros(1, dtype=torch.long)


def grpo_loss(logp, old, ref, advantages, mask, clip_eps, kl_coef, view, normalizers, weight, correction):
    """grpo.grpo_loss of the default loss (the clip, a token mean per view, no entropy bonus) with these values, the
    views' normalisers [VIEWS] given: (loss, clipped [B, T-1], the tokens whose clip binds, below or above)."""
    n = normalizers if isinstance(normalizers, grpo.Normalizers) else \
        grpo.Normalizers(normalizers, normalizers.sum(), torch.tensor(float(len(view))), 48)
    part = Batch(None, mask, advantages, None, view, weight)
    loss, terms = grpo.grpo_loss(logp, old, ref, torch.zeros_like(logp), part, n, correction,
                                 step_config(clip_eps=clip_eps, kl_coef=kl_coef))
    return loss, terms["clipped_low"] + terms["clipped_high"]


def test_loss_by_hand():
    # one sequence, 3 tokens, the last one masked out
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    old = torch.tensor([[-1.0, -2.5, -0.5]])          # ratios 1, e^0.5 = 1.6487, 1
    ref = torch.tensor([[-1.2, -2.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0])
    loss, clipped = grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.1, view=ZERO_VIEW,
                              normalizers=torch.tensor([2.0, 0.0]), weight=torch.ones(1, 3), correction=torch.ones(1, 3))
    # token 0: ratio 1 -> -2; k3 with r = -0.2: e^-0.2 + 0.2 - 1 = 0.0187308
    # token 1: ratio 1.6487 clipped to 1.2 (A > 0) -> -2.4; k3 with r = 0 -> 0
    expected = (-2.0 + 0.1 * 0.0187308 + -2.4) / 2.0
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert clipped.tolist() == [[0.0, 1.0, 0.0]]
    # negative advantage: the ratio is clipped from below at 1 - eps only when it is below
    loss_neg, _ = grpo_loss(torch.tensor([[-1.5]]), torch.tensor([[-1.0]]), torch.tensor([[-1.5]]),
                            torch.tensor([-1.0]), torch.tensor([[1.0]]), 0.2, 0.0, ZERO_VIEW, torch.ones(2),
                            torch.ones(1, 1), torch.ones(1, 1))
    # ratio e^-0.5 = 0.6065 -> min(-0.6065 * -1 ... ) : -min(-0.6065, -0.8) = 0.8
    assert loss_neg.item() == pytest.approx(0.8, abs=1e-6)


def test_two_views_each_take_their_own_token_mean(dist_world):
    """J(q) + J(q'): view 0 has 4 response tokens (rows of 3 and 1), view 1 has 2. At ratio 1 and
    no KL, each token's loss is -A: view 0 sums -(3 x 1 + 1 x 2) = -5, view 1 sums -(2 x -1) = 2."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    logp = torch.full((3, 3), -1.0, requires_grad=True)
    view, adv = torch.tensor([0, 0, 1]), torch.tensor([1.0, 2.0, -1.0])
    normalizers = grpo.loss_normalizers_over_ranks(mask, view, world_size=1, max_response_len=48)
    assert normalizers.view_tokens.tolist() == [4.0, 2.0]
    loss, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, 0.2, 0.0, view, normalizers, torch.ones(3, 3),
                        torch.ones(3, 3))
    assert loss.item() == pytest.approx(-5 / 4 + 2 / 2)               # one mean over all 6 would be -3 / 6
    loss.backward()                                                    # d/dlogp = -A / N_view on each token
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 4] * 3, [-2 / 4, 0, 0], [1 / 2, 1 / 2, 0]]))


def test_the_kl_term_is_clamped_at_ten_as_verl_does():
    """Token 0: log π_ref - log π_θ = 15, k3 = e^15 - 16, clamped to 10 (and no gradient); token 1:
    r = -0.2, k3 = 0.0187308, kept. Advantage 0: only the KL term counts."""
    logp = torch.tensor([[-15.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.2]])
    loss, _ = grpo_loss(logp, logp.detach(), ref, torch.zeros(1), torch.ones(1, 2), 0.2, 0.1, ZERO_VIEW,
                        torch.tensor([2.0, 0.0]), torch.ones(1, 2), torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.1 * (10 + 0.0187308) / 2, abs=1e-6)
    loss.backward()                                                    # d k3 / d logp = 1 - e^r, below the clamp
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1].item() == pytest.approx(0.1 * (1 - torch.e ** -0.2) / 2)


@pytest.mark.parametrize("log_r", [100.0, -100.0])
def test_a_token_far_from_the_reference_gives_a_finite_gradient(log_r):
    """log π_ref - log π_θ = ±100: exp(100) overflows float32, and without clamping log_r first the gradient of
    the clamped value is 0 · inf = NaN. As verl: log_r is clamped to ±20, k3 to 10, and the gradient is the
    clamped branch's, zero; token 1 (r = -0.2) keeps its gradient."""
    logp = torch.tensor([[min(0.0, -log_r), -1.0]], requires_grad=True)
    ref = torch.tensor([[min(0.0, log_r), -1.2]])
    assert (ref - logp.detach())[0, 0] == log_r
    loss, _ = grpo_loss(logp, logp.detach(), ref, torch.zeros(1), torch.ones(1, 2), 0.2, 0.1, ZERO_VIEW,
                        torch.tensor([2.0, 0.0]), torch.ones(1, 2), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(0.1 * (10 + 0.0187308) / 2, abs=1e-6)
    assert logp.grad.isfinite().all() and logp.grad[0, 0] == 0
    assert logp.grad[0, 1].item() == pytest.approx(0.1 * (1 - torch.e ** -0.2) / 2)


def test_the_logged_kl_is_the_loss_kl(dist_world):
    """A reference far from the policy (its output layer x 1000): most tokens' k3 exceeds 10. The logged kl sum is
    the clamped k3 the loss uses, not the unclamped value (which is many times larger here)."""
    batch = _batch()
    model, far = _tiny_model(), _tiny_model()
    with torch.no_grad():
        far.lm_head.weight.mul_(1000)
        logp, ref_logp = naive_logprobs(model, batch.input_ids, 1.0), naive_logprobs(far, batch.input_ids, 1.0)
    log_r = ref_logp - logp
    used = (grpo.k3(logp, ref_logp) * batch.mask).sum().item()
    unclamped = ((log_r.exp() - log_r - 1) * batch.mask).sum().item()
    assert unclamped > 2 * used and ((grpo.k3(logp, ref_logp) == 10) * batch.mask).sum() > batch.mask.sum() / 2
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=1, micro_batch_size=6,
                     max_grad_norm=1e9)
    policy = shard(model)
    stats = train_step(policy, shard(far.requires_grad_(False)), torch.optim.SGD(policy.parameters(), lr=0.0),
                       batch, cfg, 1, order=torch.arange(6))
    assert stats.kl_sum == pytest.approx(used, rel=1e-5)


def _tiny_model(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg)


def _batch(n=6, width=10, seed=1):
    """n sequences with a 3-token prompt; the first half has short responses (2-3 tokens), the
    second half long ones (6-7), so that two ranks taking a half each hold different token counts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (n, width), generator=g)
    mask = torch.zeros(n, width - 1)
    for i in range(n):
        mask[i, 2:2 + 2 + i % 2 + 4 * (i >= n // 2)] = 1.0
    adv = torch.randn(n, generator=g)
    return Batch(ids, mask, adv, torch.zeros(n, width - 1), torch.zeros(n, dtype=torch.long), torch.ones(n, width - 1))


def test_micro_batches_by_token_budget_by_hand():
    """Rows sorted longest first; a row joins while rows x the longest stays within the budget;
    more passes are made by halving the costliest micro-batch."""
    lengths = [10, 3, 7, 7, 2, 9]
    # 10+9 -> 2 x 10 = 20; 7+7 -> 14 (+3 would be 21); 3+2 -> 6
    assert pack_by_tokens(lengths, 20) == [[0, 5], [2, 3], [1, 4]]
    assert pack_by_tokens(lengths, 9) == [[0], [5], [2], [3], [1, 4]]         # a row longer than the budget goes alone
    # 4 passes: [0, 5] (cost 20) is split first
    assert pack_by_tokens(lengths, 20, passes=4) == [[2, 3], [1, 4], [0], [5]]
    assert pack_by_tokens(lengths, 20, passes=6) == [[0], [5], [2], [3], [1], [4]]


def test_micro_batches_are_padded_to_their_own_longest_row(dist_world):
    """Each pass computes only its rows' own width; the padding efficiency of the test batch's
    micro-batches by budget is higher than by count."""
    b = _batch()
    lengths = sequence_lengths(b.mask)
    assert lengths.tolist() == [5, 6, 5, 10, 9, 10]           # prompt 3 + response 2, 3, 2, 7, 6, 7
    def efficiency(cfg):
        passes = micro_batches_for_all_ranks(lengths, cfg)
        assert sorted(i for p in passes for i in p) == list(range(6))
        computed = sum(b.rows(p).input_ids.numel() for p in passes)
        return lengths.sum().item() / computed
    by_count = efficiency(step_config(micro_batch_size=2))          # [5, 6] [5, 10] [9, 10]: 12 + 20 + 20
    by_tokens = efficiency(step_config(max_tokens_per_micro_batch=20))   # [10, 10] [9, 6] [5, 5]: 20 + 18 + 10
    assert by_count == pytest.approx(45 / 52) and by_tokens == pytest.approx(45 / 48)


def test_gradient_equals_reinforce_at_ratio_one():
    model = _tiny_model()
    b = _batch()
    logp, _ = token_logprobs(model, b.input_ids, b.mask, temperature=0.7)
    n = b.mask.sum()
    loss, clipped = grpo_loss(logp, logp.detach(), logp.detach(), b.advantages, b.mask, 0.2, 0.0, b.view, n.repeat(2),
                              b.weight, b.weight)
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    assert clipped.sum() == 0
    reinforce = -(b.advantages[:, None] * logp * b.mask).sum() / n
    ref_grads = torch.autograd.grad(reinforce, list(model.parameters()))
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-7, rtol=1e-5)
    assert sum(g.abs().sum() for g in grads) > 0


def _train_once(micro_batch_size, mini_batches=1, world_size=1, activation_checkpointing=False, max_tokens=None,
                defer_grad_sync=False, compile_layers=False):
    model = shard(_tiny_model(), activation_checkpointing=activation_checkpointing, compile_layers=compile_layers)
    ref = shard(_tiny_model().requires_grad_(False), compile_layers=compile_layers)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=mini_batches,
                     micro_batch_size=micro_batch_size, max_tokens_per_micro_batch=max_tokens, max_grad_norm=1e9,
                     defer_grad_sync=defer_grad_sync)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    train_step(model, ref, opt, _batch(), cfg, world_size, order=order)
    return dict(gather_full_weights(model))


@pytest.mark.parametrize("mini_batches", [1, 2])
@pytest.mark.parametrize("split", [dict(micro_batch_size=2), dict(micro_batch_size=6, max_tokens=12),
                                   dict(micro_batch_size=2, defer_grad_sync=True)])
def test_micro_batches_match_whole_batch(dist_world, mini_batches, split):
    """Micro-batches of 2 rows, by a budget of 12 padded tokens, or of 2 rows reduced once per update:
    the same update as the whole batch in one pass."""
    whole = _train_once(micro_batch_size=6, mini_batches=mini_batches)
    micro = _train_once(mini_batches=mini_batches, **split)
    start = _tiny_model().state_dict()
    moved = 0.0
    for name in whole:
        assert torch.allclose(whole[name], micro[name], atol=1e-6), name
        moved += (whole[name] - start[name]).abs().sum().item()
    assert moved > 1e-3          # the update did something


@pytest.mark.full
def test_compiled_layers_make_the_same_update(dist_world):
    """torch.compile of each decoder layer (--compile_layers) runs compiled graphs and moves the
    weights as the plain layers do (two mini-batches, micro-batches of 2)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    plain = _train_once(micro_batch_size=2, mini_batches=2)
    compiled = _train_once(micro_batch_size=2, mini_batches=2, compile_layers=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0       # compiled code ran
    for name in plain:
        assert torch.allclose(plain[name], compiled[name], atol=1e-5), name


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_a_step_leaves_no_unit_gathered(dist_world, mini_batches):
    """FSDP keeps the root unit (the embedding, the output layer when tied) gathered after a forward, until a
    backward reshards it; the reference only runs forwards, so `score` reshards it. After a step every parameter
    of the reference and of the policy (whose no-grad pass before two updates is a `score` too) is its shard
    again: a gathered embedding is the whole vocabulary x hidden on every rank, through the rest of the step."""
    from torch.distributed.tensor import DTensor
    policy, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    cfg = step_config(micro_batch_size=2, mini_batches=mini_batches)
    train_step(policy, ref, torch.optim.SGD(policy.parameters(), lr=0.1), _batch(), cfg, 1, order=torch.arange(6))
    for model in (ref, policy):
        gathered = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
        assert gathered == [], gathered


def _saved_bytes(model, batch):
    """Bytes autograd keeps for the backward of one forward pass."""
    total = [0]

    def keep(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        token_logprobs(model, batch.input_ids, batch.mask, 1.0)
    return total[0]


def test_activation_checkpointing_keeps_the_update_and_saves_activations(dist_world):
    """Recomputing each decoder layer in the backward changes no weight (two mini-batches,
    micro-batches of 2), and the forward keeps less for the backward."""
    plain = _train_once(micro_batch_size=2, mini_batches=2)
    recomputed = _train_once(micro_batch_size=2, mini_batches=2, activation_checkpointing=True)
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6), name
    batch = _batch(n=6, width=40)
    full, checkpointed = _saved_bytes(shard(_tiny_model()), batch), \
        _saved_bytes(shard(_tiny_model(), activation_checkpointing=True), batch)
    assert checkpointed < 0.7 * full, (checkpointed, full)


@pytest.mark.full
def test_two_ranks_match_one_rank(tmp_path):
    """Same global batch: one rank holding all of it, or two ranks holding half each, with
    different token counts; one update, and two mini-batches in the same order, split into passes by
    count or by a token budget (the ranks then pack different numbers of passes), with gradients
    reduced after every pass or once per update; and two mini-batches of rows in two views, each
    view's tokens split unequally between the ranks."""
    out = {}
    for n in (1, 2):
        path = tmp_path / f"w{n}.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_port", str(29600 + n),
               os.path.join(ROOT, "tests", "ranks_worker.py"), str(path)]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        out[n] = torch.load(path, weights_only=True)
    start = _tiny_model().state_dict()
    for case in ("one_update", "two_updates", "token_budget", "deferred_sync", "two_views"):
        one, two = out[1][case], out[2][case]
        assert sorted(one) == sorted(two)
        for name in one:
            assert torch.allclose(one[name], two[name], atol=1e-6), (case, name)
        assert sum((one[k] - start[k]).abs().sum() for k in one) > 1e-3, case      # the step moved the weights
    for case in ("token_budget", "deferred_sync"):     # other passes, or one gradient reduction per update:
        for name in out[2][case]:                      # the same update
            assert torch.allclose(out[2][case][name], out[2]["two_updates"][name], atol=1e-6), (case, name)
    # the last rank's sampler log-probs held a NaN: both ranks stopped, neither moved its weights
    for outcome in out[2]["nan_on_one_rank"]:
        assert "1 non-finite sampler log-prob gap" in outcome["stopped"] and not outcome["moved"]


def _reference_loss(logp, old, ref_logp, batch, rows, cfg, weight=1.0):
    """The loss written out: the clipped surrogate (times the tokens' weights) plus k3, each view's token mean,
    summed over views."""
    ratio, adv, mask = (logp - old).exp(), batch.advantages[rows, None], batch.mask[rows]
    log_r = ref_logp - logp
    term = -torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv) * weight \
        + cfg.kl_coef * (log_r.exp() - log_r - 1)
    view = batch.view[rows]
    return sum((term * mask)[view == v].sum() / mask[view == v].sum() for v in (0, 1) if (view == v).any())


def _plain_reference_step(batch, order, mini_batches, lr, cfg, weights_of=None):
    """The step written out on an unsharded model: π_old is the policy before the first update. weights_of(π_old's
    log-probs) [N, T-1]: each token's weight on its policy term (none: 1)."""
    model, ref = _tiny_model(), _tiny_model()
    with torch.no_grad():
        old = naive_logprobs(model, batch.input_ids, cfg.temperature)
        ref_logp = naive_logprobs(ref, batch.input_ids, cfg.temperature)
    weights = torch.ones_like(old) if weights_of is None else weights_of(old)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    norms = []
    for mb in order.chunk(mini_batches):
        logp = naive_logprobs(model, batch.input_ids[mb], cfg.temperature)
        loss = _reference_loss(logp, old[mb], ref_logp[mb], batch, mb, cfg, weights[mb])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item())
        opt.step()
        opt.zero_grad()
    return model.state_dict(), norms


def test_later_updates_take_their_ratio_against_the_sampling_policy(dist_world):
    """With two mini-batches, the second update's ratio is π_θ / π_old with π_old the policy that
    sampled (before the first update): it has moved away from 1, so it clips. The step matches
    the plain reference, and logs the largest of its updates' gradient norms."""
    batch, lr = _batch(n=8), 1.0
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=2, micro_batch_size=3,
                     max_grad_norm=1e9)
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    stats = train_step(model, ref, torch.optim.SGD(model.parameters(), lr=lr), batch, cfg, 1, order=order)
    expected, norms = _plain_reference_step(batch, order, 2, lr, cfg)
    for name, value in gather_full_weights(model):
        assert torch.allclose(value, expected[name], atol=1e-5), name
    assert stats.clipped_low_sum + stats.clipped_high_sum > 0    # the first update's ratio is exactly 1: these clipped in the second
    assert norms[0] > norms[1] and stats.grad_norm == pytest.approx(max(norms), rel=1e-5)


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_a_two_view_step_matches_the_reference(dist_world, mini_batches):
    """Rows in two views with unequal token counts, split into micro-batches of 3: the step is the
    reference's (each view's token mean over the whole mini-batch, summed), and not the step of
    one shared token mean."""
    batch, lr = _batch(n=8), 1.0
    batch.view = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0])              # view 0: 2+3+7 tokens, view 1: 3+2+6+7+6
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=mini_batches, micro_batch_size=3,
                     max_grad_norm=1e9)
    stepped = {}
    for views in ("two", "one"):
        model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
        one_view = dataclasses.replace(batch, view=torch.zeros(8, dtype=torch.long))
        train_step(model, ref, torch.optim.SGD(model.parameters(), lr=lr), batch if views == "two" else one_view,
                   cfg, 1, order=order)
        stepped[views] = dict(gather_full_weights(model))
    expected, _ = _plain_reference_step(batch, order, mini_batches, lr, cfg)
    for name, value in stepped["two"].items():
        assert torch.allclose(value, expected[name], atol=1e-5), name
    assert max((stepped["two"][k] - stepped["one"][k]).abs().max() for k in expected) > 1e-3


@pytest.mark.parametrize("where, message", [
    ("advantages", "update 1 of 1: 1 non-finite loss(es), 0 non-finite sampler"),
    ("sampler_logp", "update 1 of 1: 0 non-finite loss(es), 1 non-finite sampler"),
    ("grad_norm", "0 non-finite sampler log-prob gap(s), gradient norm inf"),
])
def test_a_non_finite_value_stops_the_step_before_the_weights_move(dist_world, monkeypatch, where, message):
    batch = _batch()
    if where == "advantages":
        batch.advantages[1] = float("nan")
    elif where == "sampler_logp":
        batch.sampler_logp[1, 2] = float("nan")
    else:
        real = torch.nn.utils.clip_grad_norm_
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                            lambda params, max_norm: real(params, max_norm) * float("inf"))
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    before = {k: v.clone() for k, v in gather_full_weights(model)}
    cfg = step_config(mini_batches=1, micro_batch_size=6)
    with pytest.raises(NonFiniteError, match=re.escape(message)):
        train_step(model, ref, torch.optim.AdamW(model.parameters(), lr=1e-2), batch, cfg, 1)
    for name, value in gather_full_weights(model):
        assert torch.equal(value, before[name]), name


def test_a_group_of_one_response_is_refused():
    with pytest.raises(ValueError, match="groups of 1 response"):
        group_advantages(torch.tensor([[1.0], [0.0]]))


# --------------------------------------------------------------------------------------------
# Rollout correction

def trl_is_weights(old, sampler, mask, mode, cap):
    """TRL GRPOTrainer's importance sampling weights as it writes them: the log-ratio old - sampler on the mask,
    summed over the response for sequence_*, its exp; *_truncate clamps it at the cap from above, *_mask sets it
    to 0 above the cap. [B, T-1]."""
    diff = (old - sampler) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = diff.exp()
    ratio = ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(ratio > cap, 0.0)
    return ratio.expand_as(old)


TRL_MODES = {"tis": "token_truncate", "mis": "token_mask", "seq_tis": "sequence_truncate", "seq_mis": "sequence_mask"}
LN = math.log


def test_rollout_correction_weights_by_hand():
    """log π_old - log π_sampler on the response tokens (both log-probs 0 off the mask), cap 2:
    row 0: ln 3, ln 0.5, ln 1.5 (w = 3, 0.5, 1.5; W = 2.25), then a padded position;
    row 1: ln 1.2, ln 1.5 (W = 1.8);
    row 2: +100 and -100 nats: w clamped to e^20 and e^-20 (verl's bound), W = e^0 = 1."""
    old = torch.tensor([[LN(3), LN(0.5), LN(1.5), 0.0], [LN(1.2), LN(1.5), 0, 0], [100.0, -100.0, 0, 0]])
    sampler = torch.zeros(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
    e20, tiny = math.exp(20), math.exp(-20)
    expected = {
        "none":    [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]],
        "tis":     [[2, 0.5, 1.5, 1], [1.2, 1.5, 1, 1], [2, tiny, 1, 1]],
        "mis":     [[0, 0.5, 1.5, 1], [1.2, 1.5, 1, 1], [0, tiny, 1, 1]],
        "seq_tis": [[2] * 4, [1.8] * 4, [1] * 4],
        "seq_mis": [[0] * 4, [1.8] * 4, [1] * 4],
    }
    ratios = {"token": [[3, 0.5, 1.5, 1], [1.2, 1.5, 1, 1], [e20, tiny, 1, 1]], "seq": [[2.25] * 4, [1.8] * 4, [1] * 4]}
    assert list(expected) == list(grpo.ROLLOUT_CORRECTIONS)
    for name, weights in expected.items():
        w, r = grpo.rollout_correction(name, old, sampler, mask, 2.0)
        assert torch.allclose(w, torch.tensor(weights, dtype=torch.float32), rtol=1e-5, atol=0), name
        assert torch.allclose(r, torch.tensor(ratios["seq" if name.startswith("seq") else "token"], dtype=torch.float32),
                              rtol=1e-5), name
        if name != "none":                    # TRL's formula gives the same weights where no bound is reached
            assert torch.allclose(w[:2] * mask[:2], trl_is_weights(old, sampler, mask, TRL_MODES[name], 2.0)[:2] * mask[:2],
                                  rtol=1e-6), name
    # a ratio at the cap is kept whole: only a ratio above it is truncated (tis) or masked (mis), as TRL's `> cap`
    at_cap = float(math.exp(LN(1.5)))
    w_tis, _ = grpo.rollout_correction("tis", old, sampler, mask, at_cap)
    w_mis, r = grpo.rollout_correction("mis", old, sampler, mask, at_cap)
    assert r[0, 2] == torch.tensor(at_cap) and w_mis[0, 2] == w_tis[0, 2] == r[0, 2]
    assert w_mis[0, 0] == 0 and w_tis[0, 0] == r[0, 2] and w_mis[1, 0] == w_tis[1, 0] == r[1, 0]


def test_the_correction_scales_the_policy_term_only_and_keeps_the_normaliser():
    """The loss with a per-token rollout correction, and its gradient, against the loss as TRL writes it:
    per_token_loss = -min(ρ A, clip(ρ) A) · w + β k3 (the weight on the policy term, not on the KL term), summed on
    the mask over the mask's token count (a token of weight 0 still counts). Ratios away from 1 (some clip), β = 0.1."""
    model, b = _tiny_model(), _batch()
    g = torch.Generator().manual_seed(2)
    logp, _ = token_logprobs(model, b.input_ids, b.mask, temperature=1.0)
    old = (logp.detach() + 0.3 * torch.randn(logp.shape, generator=g)) * b.mask
    ref = (logp.detach() + 0.5 * torch.randn(logp.shape, generator=g)) * b.mask
    weight = 3 * torch.rand(logp.shape, generator=g)
    weight[0, 2] = 0.0                                                  # a masked token of row 0
    n = b.mask.sum()
    loss, clipped = grpo_loss(logp, old, ref, b.advantages, b.mask, 0.2, 0.1, b.view, n.repeat(2), b.weight, weight)
    ratio, adv = (logp - old).exp(), b.advantages[:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * weight \
        + 0.1 * (torch.exp(ref - logp) - (ref - logp) - 1)
    expected = (per_token * b.mask).sum() / b.mask.sum()
    assert (clipped * b.mask).sum() > 0 and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    ref_grads = torch.autograd.grad(expected, list(model.parameters()))
    for g_, r in zip(grads, ref_grads):
        assert torch.allclose(g_, r, atol=1e-7, rtol=1e-5)
    assert sum(g_.abs().sum() for g_ in grads) > 0


def _sampler_off_by(batch, ratios):
    """The batch with the sampler's log-probs set off the start policy's by log-ratios taken in turn from `ratios`
    along each response: log π_sampler = log π_old - ln w."""
    with torch.no_grad():
        old = naive_logprobs(_tiny_model(), batch.input_ids, 1.0)
    w = torch.ones_like(old)
    for i in range(len(batch)):
        positions = batch.mask[i].nonzero().flatten()
        w[i, positions] = torch.tensor([ratios[k % len(ratios)] for k in range(len(positions))])
    return dataclasses.replace(batch, sampler_logp=(old - w.log()) * batch.mask), w


@pytest.mark.parametrize("correction", ["tis", "mis", "seq_tis", "seq_mis"])
@pytest.mark.parametrize("mini_batches", [1, 2])
def test_a_corrected_step_matches_the_reference(dist_world, correction, mini_batches):
    """The sampler's log-probs off the trainer's by ratios 3 (above the cap 2), 0.5 and 1.5 in turn along each
    response (a response of 2 tokens has W = 1.5, of 3 W = 2.25, of 6 W = 5.06, of 7 W = 15.2). With π_old the
    update's own forward (one update) or the start policy (two): the step is the plain reference step with TRL's
    weights, and its ratio and capped sums are those of the set ratios."""
    batch, w = _sampler_off_by(_batch(n=8), [3.0, 0.5, 1.5])
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=mini_batches, micro_batch_size=3,
                     max_grad_norm=1e9, rollout_correction=correction, rollout_correction_cap=2.0)
    model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
    stats = train_step(model, ref, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg, 1, order=order)
    trl = lambda old: trl_is_weights(old, batch.sampler_logp, batch.mask, TRL_MODES[correction], 2.0)
    expected, _ = _plain_reference_step(batch, order, mini_batches, 1.0, cfg, weights_of=trl)
    uncorrected, _ = _plain_reference_step(batch, order, mini_batches, 1.0, cfg)
    for name, value in gather_full_weights(model):
        assert torch.allclose(value, expected[name], atol=1e-5), name
    assert max((expected[k] - uncorrected[k]).abs().max() for k in expected) > 1e-3      # the weights mattered
    ratio = (w.log() * batch.mask).sum(-1, keepdim=True).exp().expand_as(w) if correction.startswith("seq") else w
    assert stats.sampler_ratio_sum == pytest.approx((ratio * batch.mask).sum().item(), rel=1e-5)
    assert stats.sampler_capped_sum == ((ratio > 2.0) * batch.mask).sum().item() > 0


def test_no_correction_is_bit_for_bit_the_unweighted_step(dist_world, monkeypatch):
    """--rollout_correction none (the default), the sampler far off the trainer: two updates (the second clips)
    leave the weights bit for bit where the loss without any weight leaves them."""
    batch = dataclasses.replace(_batch(n=8), sampler_logp=_batch(n=8).mask * -6.0)

    def unweighted_loss(logp, old_logp, ref_logp, entropy, part, n, correction, cfg):
        ratio = torch.exp(logp - old_logp)
        adv, mask, view, eps = part.advantages[:, None], part.mask, part.view, cfg.clip_eps
        policy_term = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        per_token = (policy_term + cfg.kl_coef * grpo.k3(logp, ref_logp)) * mask
        loss = sum(per_token[view == v].sum() / n.view_tokens[v] for v in view.unique().tolist())
        clipped = (ratio * adv > ratio.clamp(1 - eps, 1 + eps) * adv).float()
        zeros = torch.zeros_like(logp)
        return loss, {"policy": zeros, "kl": zeros, "entropy": zeros, "clipped_low": clipped, "clipped_high": zeros}

    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=2, micro_batch_size=3)
    stepped = []
    for loss in (grpo.grpo_loss, unweighted_loss):
        monkeypatch.setattr(grpo, "grpo_loss", loss)
        model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
        stats = train_step(model, ref, torch.optim.AdamW(model.parameters(), lr=1e-1), batch, cfg, 1,
                           order=torch.randperm(8, generator=torch.Generator().manual_seed(0)))
        stepped.append(dict(gather_full_weights(model)))
    assert stats.clipped_low_sum + stats.clipped_high_sum > 0 and stats.sampler_capped_sum > 0      # a cap would have acted
    for name in stepped[0]:
        assert torch.equal(stepped[0][name], stepped[1][name]), name


def test_group_filters_by_hand():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.0]])
    assert grpo.call(grpo.GROUP_FILTERS["none"], rewards=rewards).tolist() == [True, True, True, True]
    assert grpo.call(grpo.GROUP_FILTERS["zero_variance"], rewards=rewards).tolist() == [False, True, False, True]


def test_a_dropped_group_leaves_its_views_token_mean_and_its_kl_term():
    """View 0 holds rows 0 (2 tokens, A = 1) and 1 (3 tokens, A = 0, dropped: weight 0); view 1 row 2 (1 token,
    A = -1). At ratio 1 with β = 0.1 and k3 = 0.0187308 on every token (log π_ref - log π_θ = -0.2): view 0's mean is
    over row 0's 2 tokens alone, (-1 + 0.1 k3) x 2 / 2, and view 1's (1 + 0.1 k3) / 1. Without the drop, row 1's
    3 tokens of KL would join view 0's sum and its count (5 tokens)."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    weight = torch.tensor([[1.0] * 3, [0.0] * 3, [1.0] * 3])
    logp = torch.full((3, 3), -1.0)
    view, adv = torch.tensor([0, 0, 1]), torch.tensor([1.0, 0.0, -1.0])
    k3 = 0.0187308
    normalizers = grpo.loss_normalizers_over_ranks(mask * weight, view, world_size=1, max_response_len=48)
    assert normalizers.view_tokens.tolist() == [2.0, 1.0]
    loss, _ = grpo_loss(logp, logp, logp - 0.2, adv, mask, 0.2, 0.1, view, normalizers, weight, torch.ones(3, 3))
    assert loss.item() == pytest.approx((-1 + 0.1 * k3) + (1 + 0.1 * k3), abs=1e-6)
    kept = grpo_loss(logp, logp, logp - 0.2, adv, mask, 0.2, 0.1, view,
                     grpo.loss_normalizers_over_ranks(mask, view, world_size=1, max_response_len=48), torch.ones(3, 3),
                     torch.ones(3, 3))[0]
    assert kept.item() == pytest.approx((2 * (-1 + 0.1 * k3) + 3 * 0.1 * k3) / 5 + (1 + 0.1 * k3), abs=1e-6)


def test_a_view_with_every_group_dropped_adds_zero_not_nan(dist_world):
    """Every row of view 1 dropped: its normaliser is 1, not 0, its sum 0; the step is finite and moves the weights
    as the step on view 0's rows alone does."""
    batch = _batch(n=6)
    batch.view = torch.tensor([0, 0, 0, 1, 1, 1])
    dropped = dataclasses.replace(batch, weight=batch.weight * (batch.view == 0)[:, None])
    assert grpo.loss_normalizers_over_ranks(dropped.mask * dropped.weight, dropped.view, 1, 48).view_tokens[1] == 1
    cfg = step_config(temperature=1.0, clip_eps=0.2, kl_coef=0.05, mini_batches=1, micro_batch_size=6)
    stepped = []
    for b in (dropped, batch.rows(torch.arange(3))):
        model, ref = shard(_tiny_model()), shard(_tiny_model().requires_grad_(False))
        stats = train_step(model, ref, torch.optim.SGD(model.parameters(), lr=1e-1), b, cfg, 1)
        assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
        stepped.append(dict(gather_full_weights(model)))
    for name in stepped[0]:
        assert torch.allclose(stepped[0][name], stepped[1][name], atol=1e-7), name
