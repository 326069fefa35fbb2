"""The chunked log-probs against their definition (logprobs.naive_logprobs): values, gradients,
entropies and the answer-free rewards' per-token terms, chunk by chunk."""
import pytest
import torch

from harness import logprobs
from grpo import score_responses
from harness.logprobs import naive_logprobs, naive_vocab_logprobs, token_logprobs
from rewards import METHODS
from test_grpo import _batch, _tiny_model, step_config


@pytest.mark.parametrize("chunk", [1024, 5])
def test_chunked_logprobs_match_the_naive_formula(monkeypatch, chunk):
    """Log-probs, their gradients and the entropy from the last hidden states, the output layer run
    chunk by chunk (5 tokens: several chunks and a short last one), against log_softmax over the whole
    [B, T-1, V] logits, to 1e-5. Positions off the mask are 0 and get no gradient."""
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK", chunk)
    b, temperature = _batch(), 0.7
    weights = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(2)) * b.mask   # any loss of logp
    model = _tiny_model()
    logp, entropy = token_logprobs(model, b.input_ids, b.mask, temperature, entropy=True)
    grads = torch.autograd.grad((weights * logp).sum(), list(model.parameters()))
    ref = _tiny_model()
    naive = naive_logprobs(ref, b.input_ids, temperature)
    ref_grads = torch.autograd.grad((weights * naive).sum(), list(ref.parameters()))
    assert torch.allclose(logp, naive * b.mask, atol=1e-5) and logp[b.mask == 0].eq(0).all()
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5), name
    assert sum(g.abs().sum() for g in grads) > 0
    with torch.no_grad():
        logp_all = naive_vocab_logprobs(ref, b.input_ids, temperature)
        naive_entropy = -(logp_all.exp() * logp_all).sum(-1)
    assert torch.allclose(entropy, naive_entropy * b.mask, atol=1e-5)
    assert entropy[b.mask == 1].min() > 0.5                      # the tiny random model is far from certain


@pytest.mark.parametrize("method", ["self_certainty", "entropy"])
def test_chunked_answer_free_rewards_match_the_naive_formula(dist_world, monkeypatch, method):
    """The answer-free rewards, chunk by chunk over response positions, against the formulas of
    rewards.py applied to the whole [B, T-1, V] log-probs: the mean over response tokens of
    KL(U || p) = -log V - mean_v log p(v), or of -H(p) = sum_v p(v) log p(v)."""
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK", 5)
    b, temperature = _batch(), 0.7
    model = _tiny_model()
    cfg = step_config(temperature=temperature, micro_batch_size=4)
    rewards = score_responses(model, b, cfg, METHODS[method].reward)
    with torch.no_grad():
        logp_all = naive_vocab_logprobs(model, b.input_ids, temperature)                # [B, T-1, V]
    per_token = -torch.log(torch.tensor(64.0)) - logp_all.mean(-1) if method == "self_certainty" \
        else (logp_all.exp() * logp_all).sum(-1)
    naive = (per_token * b.mask).sum(-1) / b.mask.sum(-1)
    assert torch.allclose(rewards, naive, atol=1e-5)
    assert rewards.std() > 0


def test_a_head_that_is_not_a_plain_linear_layer_is_refused():
    """A model whose logits are not hidden @ weight.T (here: scaled by 2) stops with a message."""
    model, b = _tiny_model(), _batch()
    model.lm_head.register_forward_hook(lambda module, args, out: 2 * out)
    with pytest.raises(ValueError, match="not its last hidden state times its output layer"):
        token_logprobs(model, b.input_ids, b.mask, 1.0)


def test_the_output_layers_gradient_in_bf16_is_summed_in_fp32(monkeypatch):
    """bf16, 512 response tokens in 64 chunks of 8: the output layer's gradient is as close to the exact one
    (float64, from the same bf16 inputs and the same bf16 dz) as the one-pass gradient, which rounds once. Summed
    in bf16 over the chunks it was 7 times further off."""
    torch.manual_seed(0)
    n, hidden_size, vocab = 512, 32, 64
    hidden = torch.randn(n, hidden_size).bfloat16().requires_grad_()
    weight = (0.3 * torch.randn(vocab, hidden_size)).bfloat16().requires_grad_()
    targets, g = torch.randint(0, vocab, (n,)), torch.randn(n)

    def weight_grad(chunk):
        monkeypatch.setattr(logprobs, "LOGIT_CHUNK", chunk)
        weight.grad = None
        logp, _ = logprobs.ChunkedLogprobs.apply(hidden, weight, targets, 1.0, False)
        (logp * g).sum().backward()
        assert weight.grad.dtype == torch.bfloat16
        return weight.grad.double()

    h, w = hidden.detach().double(), weight.detach().double()
    dz = -(h @ w.T).softmax(-1) * g[:, None].double()
    dz[torch.arange(n), targets] += g.double()
    exact = dz.bfloat16().double().T @ h
    one_pass, chunked = ((weight_grad(chunk) - exact).abs().max() for chunk in (n, 8))
    assert chunked <= 1.5 * one_pass
