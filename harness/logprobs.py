"""Token log-probs of a batch of responses, from the decoder's last hidden states.

The definition, for input_ids [B, T] and the sampling temperature T_s:

    log π(token_{t+1} | tokens ≤ t) = log_softmax(logits_t / T_s)[token_{t+1}]

`naive_logprobs` computes it as written, for the tests (its fp32 [B, T-1, V] tensors take 4.4 GB each at
V = 151,936 and 2 x 3,584 tokens). The chunked path (`ChunkedLogprobs`) runs the output layer over LOGIT_CHUNK of the
positions that predict a response token at a time; the forward keeps hidden [n, H] and one logsumexp per token, the
backward recomputes each chunk's logits: one [chunk, V] fp32 block is alive at a time, whatever the sequence length.
"""
import warnings

import torch


def naive_vocab_logprobs(model, input_ids, temperature):
    """log π(v | tokens ≤ t) for every position t < T-1 and every token v: [B, T-1, V]."""
    return (model(input_ids=input_ids).logits[:, :-1].float() / temperature).log_softmax(-1)


def naive_logprobs(model, input_ids, temperature):
    """The definition: log π(token_{t+1} | tokens ≤ t) at every position: [B, T-1]."""
    return naive_vocab_logprobs(model, input_ids, temperature).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


LOGIT_CHUNK = 1024      # tokens per pass through the output layer: 1024 x 151,936 x 4 B = 0.62 GB per fp32 block


def response_hidden(model, input_ids, mask):
    """Where `mask` [B, T-1] marks a position that predicts a response token: (hidden [n, H], the predicted tokens [n],
    the output layer's weight [V, H]). Raises ValueError unless the last position's logits equal hidden @ weight.T."""
    with warnings.catch_warnings():  # FSDP warns the first hidden state (the embeddings) is a view; none is written to
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        out = model(input_ids=input_ids, output_hidden_states=True, logits_to_keep=1)
    hidden = out.hidden_states[-1]                                   # [B, T, H], after the final norm
    weight = model.get_output_embeddings().weight                    # [V, H]; FSDP's root keeps it gathered
    with torch.no_grad():
        mine = (hidden[:, -1] @ weight.T).float()
        if not torch.allclose(mine, out.logits[:, -1].float(), rtol=1e-2, atol=1e-2 * mine.abs().max().item()):
            raise ValueError(f"{type(model).__name__}'s logits are not its last hidden state times its output "
                             f"layer's weight (a soft cap or a logit scale?): its chunked log-probs would be wrong")
    keep = mask.bool()
    return hidden[:, :-1][keep], input_ids[:, 1:][keep], weight


def _chunk_logits(hidden, weight, temperature):
    """(rows, logits / temperature in fp32 [c, V]) for each chunk of LOGIT_CHUNK rows of hidden [n, H]."""
    for start in range(0, len(hidden), LOGIT_CHUNK):
        rows = slice(start, start + LOGIT_CHUNK)
        yield rows, (hidden[rows] @ weight.T).float().div_(temperature)     # in place: one [c, V] block, not two


class ChunkedLogprobs(torch.autograd.Function):
    """log p(target) = z[target] - logsumexp(z), z = hidden @ weight.T / T, chunk by chunk; with `entropy`, also each
    distribution's entropy H = logsumexp(z) - Σ softmax(z) z (with a gradient when `entropy_grad`). The backward
    recomputes each z: d log p(target)/dz = onehot(target) - softmax(z); dH/dz = -softmax(z) (log softmax(z) + H)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, entropy, entropy_grad=False):
        logp = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)         # [n]
        lse, ent = torch.empty_like(logp), torch.empty_like(logp) if entropy else logp.new_empty(0)
        for rows, z in _chunk_logits(hidden, weight, temperature):                      # z [c, V]
            lse[rows] = z.logsumexp(-1)
            logp[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
            if entropy:
                ent[rows] = lse[rows] - torch.linalg.vecdot((z - lse[rows, None]).exp_(), z)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        # the output layer's gradient is summed over the chunks in fp32 and cast once: bf16 would round at each chunk
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight, dtype=torch.float32)
        for rows, z in _chunk_logits(hidden, weight, ctx.temperature):
            g = grad_logp[rows, None]                                                   # [c, 1]
            if ctx.entropy_grad:          # dH/dz = -softmax(z) (log softmax(z) + H): -p (g + g_H (log p + H))
                logp_all = z.sub_(lse[rows, None])
                dz = logp_all.exp() * -(g + grad_ent[rows, None] * (logp_all + ent[rows, None]))
            else:
                dz = z.sub_(lse[rows, None]).exp_().mul_(-g)                            # -softmax(z) g, in place
            dz.scatter_add_(-1, targets[rows, None], g).div_(ctx.temperature)          # + onehot(target) g
            dz = dz.to(hidden.dtype)
            grad_hidden[rows] = dz @ weight
            if dz.dtype == torch.float32:
                grad_weight.addmm_(dz.T, hidden[rows])
            else:                                                                       # the chunk's product in
                grad_weight += dz.T @ hidden[rows]                                      # bf16, summed in fp32
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None


def token_logprobs(model, input_ids, mask, temperature, entropy=False, entropy_grad=False):
    """(logp: log π(token_{t+1} | tokens ≤ t) where `mask` [B, T-1] is 1, else 0; with `entropy`, each distribution's
    entropy, with a gradient when `entropy_grad`, else None), each [B, T-1]. input_ids [B, T], right-padded."""
    hidden, targets, weight = response_hidden(model, input_ids, mask)
    logp, ent = ChunkedLogprobs.apply(hidden, weight, targets, temperature, entropy or entropy_grad, entropy_grad)
    scatter = lambda v: torch.zeros(mask.shape, dtype=v.dtype, device=v.device).masked_scatter(mask.bool(), v)
    return scatter(logp), scatter(ent) if entropy else None


@torch.no_grad()
def token_values(model, input_ids, mask, temperature, fn):
    """fn(log-probs over the vocabulary [c, V]) -> [c] at each position `mask` [B, T-1] marks: [B, T-1], 0 elsewhere."""
    hidden, _, weight = response_hidden(model, input_ids, mask)
    out = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
    for rows, z in _chunk_logits(hidden, weight, temperature):
        out[rows] = fn(z.log_softmax(-1))
    return torch.zeros(mask.shape, device=mask.device).masked_scatter(mask.bool(), out)
