"""The transformers engine's batches (rollout.HFEngine): a request's rows go through in chunks of whole prompts whose
caches, grown to the longest response, fit a KV budget (`prompts_per_chunk`), each sampling what the whole request
would. Each row draws from its own stream and every chunk is padded to the longest prompt, so only a batch's size
differs from the unchunked request's. On a CPU that changes last bits below GEMM_ROWS rows, so a chunk keeps riders
up to GEMM_ROWS (`staying`): in one thread a row's tokens and log-probs are the unchunked request's bit for bit, until
fewer than GEMM_ROWS rows of the whole request still sample. In several threads the kernels split a batch by its size:
log-probs move in their last bits with the batch, and a nearly flat distribution (a random model at the real
vocabulary: bench/hf_engine.py) may give another token; on a GPU too. Checked in tests/test_rollout.py at one and two
CPU threads."""
import torch

# kv_budget's defaults (--hf_kv_budget_gib 0); a CPU's is fixed, so that a CPU run chunks alike on any machine.
HF_KV_SHARE = 0.8
HF_CPU_KV_BUDGET_GIB = 4.0
# MKL's sgemm sums a row alike in any product of GEMM_ROWS or more rows in one thread, and of a multiple of GEMM_ROWS
# in 1-16 threads (measured: tests/test_rollout.py); so the prompts' forward keeps its last GEMM_ROWS positions' logits.
GEMM_ROWS = 4


def kv_bytes_per_token(config, dtype):
    """K and V of one token in every layer: layers x KV heads x head_dim x 2 x the dtype's bytes."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers * heads * head_dim * 2 * dtype.itemsize


def kv_budget(budget_gib, device):
    """Bytes of KV cache a chunk may take: `budget_gib` (--hf_kv_budget_gib), else its defaults (above)."""
    if budget_gib or torch.device(device).type != "cuda":
        return (budget_gib or HF_CPU_KV_BUDGET_GIB) * 2**30
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return HF_KV_SHARE * (free + cached)


def prompts_per_chunk(n, width, max_tokens, token_bytes, budget_gib, device):
    """How many prompts' n rows, at `width` prompt tokens and `max_tokens` response tokens each (`token_bytes` a
    token), fit the KV budget (`kv_budget`); a request one prompt of which does not fit is refused."""
    one = n * (width + max_tokens) * token_bytes
    budget = kv_budget(budget_gib, device)
    if one > budget:
        raise ValueError(f"one prompt's {n} responses need {one / 2**30:.2f} GiB of KV cache ({n} x {width} + "
                         f"{max_tokens} tokens x {token_bytes / 1024:.0f} KiB), over the transformers "
                         f"engine's budget of {budget / 2**30:.2f} GiB: raise --hf_kv_budget_gib if the memory "
                         f"is there, or lower --group_size, --max_prompt_len or --max_response_len")
    return int(budget // one)


def staying(sampling, floor):
    """The rows that stay in a decoding batch, by their places in it (None: all): those still `sampling` [batch], and
    the first ended ones as riders, up to `floor` rows in all."""
    keep = sampling.clone()
    riders = min(floor, len(keep)) - int(sampling.sum())
    if riders > 0:
        keep[(~sampling).nonzero().squeeze(-1)[:riders]] = True
    return None if keep.all() else keep.nonzero().squeeze(-1)
