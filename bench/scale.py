"""Memory and time of a training step at the real vocabulary, each saving on its own and together,
and the per-GPU memory account of the official preset.

    python bench/scale.py                       # the tables of bench/memory.md
    python bench/scale.py --account-only        # the memory and disk account of Qwen3-4B-Base on 8 x 80 GB

The model is Qwen3-shaped and randomly initialised: vocabulary 151,936 (the classroom tokenizer
padded to it: the Qwen tokenizer cannot be downloaded here), head_dim 128, tied embeddings as in
Qwen3-4B, and a small body (4 layers, width 256) so that a step takes seconds on a CPU. As at
4B, the output layer is what makes log-probs expensive. The batch is one rank's: 4 sequences of
1-2k tokens (prompts of 100-300 tokens), one update, fp32.

Each variant runs in a fresh process, and its peak memory is that process's ru_maxrss; seconds are
those of the second of two identical steps. "Before" is the training path as it was: log-probs
through a [B, T, V] log-softmax (with the entropy of every position), micro-batches of 2 rows, each
padded to the longest row on the rank, no activation checkpointing, a gradient reduce-scatter after
every micro-batch; the bench puts these back with stand-ins. Padding efficiency = response tokens
/ positions computed (rows x width of each pass). On one rank a reduce-scatter has nothing to send,
so --defer_grad_sync shows its memory here, not its time.

The weight sync is timed into a bf16 engine model (the transformers engine's load, standing in for
vLLM's): before, every parameter gathered in fp32 into one list; after, streamed one parameter at a
time in the engine's dtype. Extra peak = the highest resident memory during the sync minus that
before it. Loading runs 2 ranks (torchrun): before, each rank reads the whole fp32 policy and
reference onto its device and then shards; after, `sharding.load_sharded`.

`memory_account` is the per-GPU budget of the official preset computed from a model config; the
bench checks it against the measured peaks of the small model (minus the process's memory before
any model is built) to within 20%.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness import checkpoint  # noqa: E402
import grpo  # noqa: E402
from harness import logprobs  # noqa: E402
from harness import sharding  # noqa: E402
from grpo import Batch, StepConfig, train_step  # noqa: E402
from config import PRESETS  # noqa: E402


def step_config(**settings):
    """A grpo.StepConfig of the classroom preset, its passes grouped by count unless given, with `settings` changed."""
    return StepConfig.of({**PRESETS["classroom"], "max_tokens_per_micro_batch": 0, **settings})
from harness.logprobs import naive_vocab_logprobs  # noqa: E402
from harness.sharding import init_distributed, load_sharded, shard  # noqa: E402

VOCAB = 151_936
SMALL = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=128, tie_word_embeddings=True, max_position_embeddings=4096)
QWEN3_4B = dict(vocab_size=VOCAB, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
GiB = 2**30
CARD_BYTES = 85.0e9                 # what CUDA reports for an "80 GB" card (79.2 GiB): the share vLLM takes is of this
OFFICIAL_UTILIZATION = 0.75         # config.PRESETS["official"]["gpu_memory_utilization"]
OPENRS_PAIRS = 6_999                # data/train/openrs_pairs.parquet: 3 epochs of 6,999 // 128 = 54 steps are 162

# What each variant turns on. "before": everything as it was.
VARIANTS = {
    "before": dict(),
    "1 chunked log-probs": dict(chunked=True),
    "2 activation checkpointing": dict(checkpointing=True),
    "3 token-budget micro-batches": dict(budget=4096),
    "4 deferred gradient sync": dict(defer=True),
    "1+2+3": dict(chunked=True, checkpointing=True, budget=4096),
    "1+2+3+4": dict(chunked=True, checkpointing=True, budget=4096, defer=True),
}


# --------------------------------------------------------------------------------------------
# The memory account

def param_count(c):
    """Parameters of a Qwen3-style decoder: attention (q, k, v, o, q/k norms), MLP, two norms per
    layer; embeddings (counted once when tied), the final norm."""
    H, I, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    layer = H * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"]) + 3 * H * I + 2 * H + 2 * d
    head = 0 if c["tie_word_embeddings"] else c["vocab_size"] * H
    return c["num_hidden_layers"] * layer + c["vocab_size"] * H + head + H, layer


def memory_account(c, world_size=8, micro_tokens=16_384, compute_bytes=2, ref_bytes=2, checkpointing=True,
                   defer_grad_sync=False, gpu_bytes=CARD_BYTES, vllm_share=0.3, weight_sync=True,
                   logit_chunk=logprobs.LOGIT_CHUNK):
    """Bytes per GPU of the official preset's training, by part, from the model config `c`.

    Sharded over `world_size` ranks: fp32 parameters, fp32 gradients, AdamW's two fp32 moments, and
    the reference (`ref_bytes` per parameter: the compute dtype; the teacher methods keep fp32).
    Gathered for compute (`compute_bytes` per parameter): the root unit (embeddings, which are the
    output layer when tied) for the whole forward and backward, and two decoder layers (the one
    running and the next, prefetched), with their gradients before the reduce-scatter. With
    `defer_grad_sync`, every unit keeps its unsharded fp32 gradients between micro-batches.
    Activations of one pass of `micro_tokens` tokens: with checkpointing, each layer's input, plus
    the insides of the one layer being recomputed (norm outputs and fp32 norm statistics, q, k, v,
    the attention output, the MLP's gate, up, activation and product); without, the insides of every
    layer. The output layer: the response positions' hidden states and their gradient, and one
    chunk of `logit_chunk` positions' fp32 logits with two vocabulary-sized temporaries; in bf16 also
    its weight's gradient summed in fp32 over the chunks, and one chunk's product. vLLM takes
    `vllm_share` of the GPU; the weight sync adds one gathered parameter (the largest: the embedding)
    in the compute dtype."""
    P, layer = param_count(c)
    H, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    root = V * H + H
    inside = micro_tokens * (compute_bytes * (3 * H + q + 2 * kv + q + 4 * I) + 4 * 2 * 2)   # one layer's activations
    parts = {
        "parameters (fp32, sharded)": 4 * P / world_size,
        "gradients (fp32, sharded)": 4 * P / world_size,
        "AdamW moments (fp32, sharded)": 8 * P / world_size,
        "reference (sharded)": ref_bytes * P / world_size,
        "gathered parameters and their gradients": 2 * compute_bytes * (root + 2 * layer),
        "unsharded gradients (deferred sync)": 4 * P if defer_grad_sync else 0,
        "activations": (L * micro_tokens * H * compute_bytes + inside) if checkpointing else L * inside,
        "output layer: hidden states + one log-prob chunk":
            2 * micro_tokens * H * compute_bytes + 3 * 4 * logit_chunk * V + (compute_bytes < 4) * (4 + 2) * V * H,
        "weight sync (one gathered parameter)": compute_bytes * root if weight_sync else 0,
        "vLLM (weights + KV cache)": vllm_share * gpu_bytes,
    }
    return parts


# What the tensor account leaves out, as ranges in GB (a low and a high estimate), per GPU.
CUDA_RUNTIME = (1.0, 3.0)        # CUDA context, cuBLAS workspaces, NCCL's buffers for 8 ranks
VLLM_ASLEEP = (0.5, 2.0)         # what vLLM's sleep level 2 keeps: CUDA-graph pools, sampler buffers, its cache
VLLM_PROFILE = (1.0, 2.0)        # vLLM's profiling peak at 256 sequences and 8,192 batched tokens (rollout.py)
VLLM_GRAPHS = (0.3, 1.0)         # CUDA graphs captured for batch sizes up to 256
FRAGMENTATION = (0.05, 0.10)     # of a phase's tensors, lost to the caching allocator's fragmentation


def gpu_phases(c, world_size=8, device_bytes=CARD_BYTES, utilization=0.75, teacher=False, micro_tokens=16_384):
    """The per-GPU memory of the official preset in its four phases, as (low, high) bytes per part, and
    the KV-cache tokens per rank. vLLM sleeps (level 2) while the trainer trains, and wakes for the
    weight sync (its weights) and the rollout (its KV cache), so the phases do not add up:

    - training (the forward and backward passes): the trainer's tensors (`memory_account` without
      vLLM), the second bf16 gradient of the tied embedding (input and output layer, before they are
      summed), FSDP's fp32 reduce-scatter staging of one unit's unsharded gradient (a layer's; the
      root's at most), the recomputed layer's backward temporaries (one to two times its
      activations), what vLLM keeps asleep, and the CUDA runtime, plus fragmentation;
    - optimizer step: the sharded fp32 parameters, gradients and AdamW moments, and AdamW's temporary:
      its foreach step (torch's default on a GPU) takes the square root of every second moment at
      once (`torch._foreach_sqrt`): a new fp32 tensor the size of the second moment, 4 bytes a
      parameter over the ranks; the reference (or teacher), vLLM asleep and the CUDA runtime;
    - weight sync: the trainer's resident state, vLLM's woken weights, one gathered parameter and
      vLLM's copy of the layer it is reloading (the embedding at most);
    - rollout: the trainer's resident state and `utilization` of the device for vLLM, of which its
      weights, its profiling peak and its CUDA graphs are not KV cache.
    The trainer's resident state is what outlives a step: fp32 parameters and AdamW moments (sharded),
    the reference in bf16 (the teacher methods' teacher in fp32); gradients are freed after the update."""
    P, layer = param_count(c)
    V, H, L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
    root = V * H
    tensors = memory_account(c, world_size, micro_tokens, ref_bytes=4 if teacher else 2, vllm_share=0,
                             weight_sync=False)
    one_layer = tensors["activations"] - L * micro_tokens * H * 2          # the recomputed layer's insides
    resident = {k: tensors[k] for k in ("parameters (fp32, sharded)", "AdamW moments (fp32, sharded)",
                                        "reference (sharded)")}
    if teacher:
        resident["teacher (fp32, sharded)"] = resident.pop("reference (sharded)")
    fixed = lambda v: (v, v)
    gb = lambda r: (r[0] * 1e9, r[1] * 1e9)
    training = {**{k: fixed(v) for k, v in tensors.items() if v and k not in ("vLLM (weights + KV cache)",)},
                "the tied embedding's second bf16 gradient": fixed(2 * root),
                "fp32 reduce-scatter staging (a layer's .. the root's)": (4 * layer, 4 * (root + H)),
                "the recomputed layer's backward temporaries": (one_layer, 2 * one_layer),
                "vLLM asleep": gb(VLLM_ASLEEP), "CUDA runtime": gb(CUDA_RUNTIME)}
    if teacher:
        training["teacher (fp32, sharded)"] = training.pop("reference (sharded)")
    optimizer = {**{k: fixed(tensors[k]) for k in ("parameters (fp32, sharded)", "gradients (fp32, sharded)",
                                                   "AdamW moments (fp32, sharded)", "reference (sharded)")},
                 "AdamW's step: sqrt of the second moment (fp32)": fixed(4 * P / world_size),
                 "vLLM asleep": gb(VLLM_ASLEEP), "CUDA runtime": gb(CUDA_RUNTIME)}
    if teacher:
        optimizer["teacher (fp32, sharded)"] = optimizer.pop("reference (sharded)")
    vllm_weights = 2 * (P + (0 if c.get("tie_word_embeddings") else root))
    sync = {**{k: fixed(v) for k, v in resident.items()}, "vLLM's weights (bf16)": fixed(vllm_weights),
            "one gathered parameter + vLLM's copy of its layer": (2 * 2 * layer, 2 * 2 * root),
            "vLLM asleep": gb(VLLM_ASLEEP), "CUDA runtime": gb(CUDA_RUNTIME)}
    rollout = {**{k: fixed(v) for k, v in resident.items()},
               f"vLLM: {utilization} of the device": fixed(utilization * device_bytes),
               "CUDA runtime": gb(CUDA_RUNTIME)}
    phases = {}
    for name, parts in (("training", training), ("optimizer step", optimizer), ("weight sync", sync),
                        ("rollout", rollout)):
        tensor_sum = [sum(v[i] for k, v in parts.items() if not k.startswith(("vLLM", "CUDA"))) for i in (0, 1)]
        parts["fragmentation"] = (FRAGMENTATION[0] * tensor_sum[0], FRAGMENTATION[1] * tensor_sum[1])
        phases[name] = parts
    kv_bytes = [utilization * device_bytes - vllm_weights - 1e9 * (VLLM_PROFILE[i] + VLLM_GRAPHS[i]) for i in (1, 0)]
    per_token = 2 * L * c["num_key_value_heads"] * c["head_dim"] * 2          # K and V, bf16
    return phases, (kv_bytes[0] / per_token, kv_bytes[1] / per_token)


def print_phases(phases, kv_tokens, device_bytes, sequences, max_tokens):
    for name, parts in phases.items():
        print(f"\n{name + ' phase':<54} {'GB low':>7} {'GB high':>8}")
        for part, (low, high) in parts.items():
            print(f"  {part:<52} {low / 1e9:>7.2f} {high / 1e9:>8.2f}")
        low, high = (sum(v[i] for v in parts.values()) for i in (0, 1))
        print(f"  {'total':<52} {low / 1e9:>7.2f} {high / 1e9:>8.2f}   of {device_bytes / 1e9:.0f}: "
              f"margin {(device_bytes - high) / 1e9:.1f} to {(device_bytes - low) / 1e9:.1f}")
    print(f"\nKV cache per rank: {kv_tokens[0] / 1e3:.0f}k to {kv_tokens[1] / 1e3:.0f}k tokens; a two-view step asks "
          f"one rank for {sequences} sequences: {sequences * max_tokens / 1e3:.0f}k tokens at most, "
          f"{sequences * 1150 / 1e3:.0f}k to {sequences * 1650 / 1e3:.0f}k at 1,000-1,500 response tokens on "
          f"~150-token prompts")


def print_account(parts, gpu_bytes):
    total = sum(parts.values())
    print(f"{'part':<52} {'GB':>7}")
    for name, value in parts.items():
        print(f"{name:<52} {value / 1e9:>7.2f}")
    print(f"{'total':<52} {total / 1e9:>7.2f}   of {gpu_bytes / 1e9:.0f} GB: "
          f"margin {(gpu_bytes - total) / 1e9:.1f} GB")


def disk_account(c, steps, save_every=10, keep_last=2, teacher=False):
    """(one checkpoint's bytes, final/'s, the most the run's folder holds at once) for a model config `c`, as
    checkpoint.checkpoint_bytes and checkpoint.run_disk_bytes count them for a run: the fp32 policy under every
    name (a tied embedding twice), AdamW's two fp32 moments, and the fp32 teacher (the teacher methods)."""
    P = param_count(c)[0]
    every_name = P + (c["vocab_size"] * c["hidden_size"] if c["tie_word_embeddings"] else 0)
    one = 4 * (every_name + 2 * P + (every_name if teacher else 0))
    final = 4 * P
    return one, final, checkpoint.run_disk_bytes(one, final, keep_last, -(-steps // save_every))


def print_disk(c, steps):
    print(f"\nDisk: the official preset's run of {steps} steps (3 epochs of OpenRS at 128 questions), a checkpoint "
          f"every 10 steps, --keep_last 2, then final/ (the fp32 model)")
    for method, teacher in (("coreward1", False), ("coreward2 (teacher in the checkpoint)", True)):
        one, final, most = disk_account(c, steps, teacher=teacher)
        print(f"  {method:<40} a checkpoint {one / 1e9:>6.1f} GB, final/ {final / 1e9:>5.1f} GB, the run's folder "
              f"at most {most / 1e9:>6.1f} GB")


# --------------------------------------------------------------------------------------------
# The small model and its batch

def save_small_model(path):
    """The Qwen3-shaped model at the real vocabulary, random-init, with the classroom tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from harness import world
    tok = world.build_tokenizer()
    if len(tok) > VOCAB:
        raise ValueError("the classroom tokenizer is larger than Qwen3's vocabulary")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SMALL)).save_pretrained(path)
    tok.save_pretrained(path)


def make_step_batch(n=4, seed=0):
    """n sequences of 1-2k tokens: prompts of 100-300 tokens, responses filling the rest."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1000, 2001, (n,), generator=g).tolist()
    prompts = torch.randint(100, 301, (n,), generator=g).tolist()
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (n, width), generator=g)
    mask = torch.zeros(n, width - 1)
    for i, (length, p) in enumerate(zip(lengths, prompts)):
        ids[i, length:] = 0
        mask[i, p - 1:length - 1] = 1.0
    return Batch(ids, mask, torch.randn(n, generator=g), torch.zeros(n, width - 1), torch.zeros(n, dtype=torch.long),
                 torch.ones(n, width - 1))


# --------------------------------------------------------------------------------------------
# Stand-ins for the path as it was

def vocab_token_logprobs(model, input_ids, mask, temperature, entropy=False):
    """Before: log-softmax over the vocabulary at every position, and the entropy of every position."""
    logp_all = naive_vocab_logprobs(model, input_ids, temperature)                                   # [B, T-1, V]
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1) * mask
    with torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def rows_padded_to_the_batch(self, idx):
    """Before: every micro-batch at the width of the rank's longest row."""
    return Batch(self.input_ids[idx], self.mask[idx], self.advantages[idx], self.sampler_logp[idx], self.view[idx],
                 self.weight[idx])


class PeakRSS:
    """The highest resident memory of this process while in the block, polled every 2 ms, minus
    that on entry: the extra memory a call needs, even after a higher peak earlier in the process."""
    def __enter__(self):
        self.start = self.now()
        self.peak, self.running = self.start, True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    @staticmethod
    def now():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _poll(self):
        while self.running:
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.now())
        self.extra = self.peak - self.start


# --------------------------------------------------------------------------------------------
# Children: one measurement each, in a fresh process

def child_step(model_dir, variant):
    """Two identical training steps of one variant; the second is timed."""
    from transformers import AutoModelForCausalLM
    v = VARIANTS[variant]
    if not v.get("chunked"):
        grpo.token_logprobs = vocab_token_logprobs
    if not (v.get("budget")):
        Batch.rows = rows_padded_to_the_batch
    init_distributed()
    base = PeakRSS.now()
    policy = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                   activation_checkpointing=v.get("checkpointing", False))
    ref = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).requires_grad_(False))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    batch = make_step_batch()
    cfg = step_config(temperature=1.0, kl_coef=0.005, mini_batches=1, micro_batch_size=2,
                     max_tokens_per_micro_batch=v.get("budget"), defer_grad_sync=v.get("defer", False))
    passes = grpo.micro_batches_for_all_ranks(grpo.sequence_lengths(batch.mask), cfg)
    computed = sum(batch.rows(p).input_ids.shape[1] * len(p) for p in passes)
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        train_step(policy, ref, optimizer, batch, cfg, 1, order=torch.arange(len(batch)))
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds[-1], "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base,
            "efficiency": batch.mask.sum().item() / computed, "tokens": int(batch.mask.sum()),
            "micro_tokens": max(batch.rows(p).input_ids.numel() for p in passes)}


def child_sync(model_dir, streamed):
    """Under torchrun: one weight sync into a bf16 engine model; this rank's seconds and extra peak memory."""
    from transformers import AutoModelForCausalLM
    from rollout import HFEngine
    rank, _, _ = init_distributed()
    policy = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    engine = HFEngine(model_dir, 8, dtype="bfloat16", kv_budget_gib=0.0)
    weights = lambda: sharding.gather_full_weights(policy, engine.dtype) if streamed else \
        [(name, t.full_tensor()) for name, t in policy.state_dict().items()]
    engine.load_weights(weights())                   # warm
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        engine.load_weights(weights())
        seconds = time.perf_counter() - t0
    return {"rank": rank, "seconds": seconds, "extra": mem.extra}


def child_head(naive, tokens=8192, hidden_size=SMALL["hidden_size"]):
    """The path from the last hidden states to the loss and back, for `tokens` response positions at
    the real vocabulary: extra peak memory, and the log-probs and gradients (to compare the two paths)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=g).requires_grad_()
    weight = (0.02 * torch.randn(VOCAB, hidden_size, generator=g)).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,), generator=g)
    advantages = torch.randn(tokens, generator=g)
    with PeakRSS() as mem:
        if naive:
            logp = (hidden @ weight.T / 0.7).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
        else:
            logp, _ = logprobs.ChunkedLogprobs.apply(hidden, weight, targets, 0.7, False)
        (advantages * logp).sum().backward()
    return {"extra": mem.extra, "tokens": tokens, "logp": logp.tolist(),
            "grad_weight_norm": weight.grad.norm().item(), "grad_hidden_norm": hidden.grad.norm().item()}


def child_load(model_dir, sharded):
    """Under torchrun: the policy (fp32) and reference (bf16 compute) as train.py builds them; this rank's peak."""
    from transformers import AutoModelForCausalLM
    rank, _, device = init_distributed()
    base = PeakRSS.now()
    if sharded:
        policy = load_sharded(model_dir, device, torch.float32, torch.bfloat16)
        ref = load_sharded(model_dir, device, torch.bfloat16, torch.bfloat16)
    else:
        policy = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device),
                       param_dtype=torch.bfloat16)
        ref = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device),
                    param_dtype=torch.bfloat16)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    held = PeakRSS.now() - base
    del policy, ref
    return {"rank": rank, "peak": peak, "held": held}


def run_child(args, *extra, ranks=1):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        launcher = [sys.executable] if ranks == 1 else \
            [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--nnodes=1",
             "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0"]
        cmd = launcher + [os.path.abspath(__file__), "--model_dir", args.model_dir, "--result", f.name, *extra]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks))}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode:
            raise RuntimeError(f"{' '.join(extra)} failed:\n{res.stderr[-3000:]}")
        return [json.loads(line) for line in open(f.name)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--account-only", action="store_true")
    ap.add_argument("--model_dir", help="(children) the saved small model")
    ap.add_argument("--result", help="(children) where to append the measurement")
    ap.add_argument("--step", help="(child) a variant of VARIANTS")
    ap.add_argument("--sync", choices=["list", "streamed"])
    ap.add_argument("--head", choices=["naive", "chunked"])
    ap.add_argument("--parts", default="account,step,head,sync,load", help="which tables to print")
    ap.add_argument("--load", choices=["full", "sharded"])
    args = ap.parse_args()

    if args.result:                                   # a child
        if args.step:
            out = child_step(args.model_dir, args.step)
        elif args.sync:
            out = child_sync(args.model_dir, args.sync == "streamed")
        elif args.head:
            out = child_head(args.head == "naive")
        else:
            out = child_load(args.model_dir, args.load == "sharded")
        with open(args.result, "a") as f:
            f.write(json.dumps(out) + "\n")
        return

    parts = args.parts.split(",")
    if "account" in parts or args.account_only:
        print(f"Memory per GPU: Qwen3-4B-Base, official preset, 8 x 80 GB ({CARD_BYTES / 1e9:.1f}e9 bytes each, as "
              f"CUDA reports them), micro-batches of 16,384 tokens, vLLM at --gpu_memory_utilization "
              f"{OFFICIAL_UTILIZATION} while it samples, asleep while the trainer trains")
        for method, teacher in (("coreward1", False), ("coreward2 (teacher in fp32)", True)):
            print(f"\n== {method}")
            phases, kv = gpu_phases(QWEN3_4B, utilization=OFFICIAL_UTILIZATION, teacher=teacher)
            print_phases(phases, kv, CARD_BYTES, sequences=(2 if not teacher else 1) * 128 // 8 * 8,
                         max_tokens=512 + 3072)
        print_disk(QWEN3_4B, steps=3 * (OPENRS_PAIRS // 128))
    if args.account_only:
        return

    with tempfile.TemporaryDirectory() as tmp:
        args.model_dir = tmp
        save_small_model(tmp)
        print(f"\nQwen3-shaped model: {param_count(SMALL)[0] / 1e6:.1f}M parameters, vocabulary {VOCAB:,}, "
              f"{SMALL['num_hidden_layers']} layers, width {SMALL['hidden_size']}; 4 sequences of 1-2k tokens, fp32\n")
        if "head" in parts:
            head = {mode: run_child(args, "--head", mode)[0] for mode in ("naive", "chunked")}
            n, c = head["naive"], head["chunked"]
            diff = max(abs(a - b) for a, b in zip(n["logp"], c["logp"]))
            grads = max(abs(n[k] - c[k]) / n[k] for k in ("grad_hidden_norm", "grad_weight_norm"))
            print(f"{'hidden states -> loss -> backward':<36} {'extra peak MiB':>15} {'KiB per token':>14}")
            for mode in ("naive", "chunked"):
                r = head[mode]
                print(f"{mode:<36} {r['extra'] / 2**20:>15.0f} {r['extra'] / r['tokens'] / 1024:>14.0f}")
            print(f"{n['tokens']} tokens, V={VOCAB:,}: {n['extra'] / c['extra']:.1f}x less memory per token; "
                  f"log-probs differ by at most {diff:.1e}, gradient norms by {grads:.1e} (relative)\n")
        if "step" not in parts:
            results = {}
        else:
            results = {name: run_child(args, "--step", name)[0] for name in VARIANTS}
        if results:
            before = results["before"]
            print(f"{'training step':<30} {'peak GiB':>9} {'x before':>9} {'seconds':>8} {'x before':>9} "
                  f"{'padding eff.':>13} {'account GiB':>12}")
        for name, r in results.items():
            v = VARIANTS[name]
            account = None                        # the account describes the chunked path
            if v.get("chunked"):
                account = sum(memory_account(
                    SMALL, world_size=1, micro_tokens=r["micro_tokens"], compute_bytes=4, ref_bytes=4,
                    checkpointing=v.get("checkpointing", False), defer_grad_sync=v.get("defer", False),
                    vllm_share=0, weight_sync=False).values())
            account_text = f"{account / GiB:>12.2f}" if account else f"{'-':>12}"
            print(f"{name:<30} {r['peak'] / GiB:>9.2f} {before['peak'] / r['peak']:>8.2f}x {r['seconds']:>8.2f} "
                  f"{before['seconds'] / r['seconds']:>8.2f}x {r['efficiency']:>13.2f} {account_text}")
            if account and abs(account - r["peak"]) / r["peak"] > 0.2:
                off = 100 * abs(account - r['peak']) / r['peak']
                print(f"    the account is {off:.0f}% off the measured peak (> 20%)")

        if "sync" in parts:
            print(f"\n{'weight sync, 2 ranks, into bf16':<32} {'seconds':>8} {'extra peak MiB (rank 1)':>24}")
            for mode, label in (("list", "before: fp32, all at once"), ("streamed", "after: streamed, bf16")):
                r = max(run_child(args, "--sync", mode, ranks=2), key=lambda r: r["rank"])
                print(f"{label:<32} {r['seconds']:>8.3f} {r['extra'] / 2**20:>24.0f}")

        if "load" in parts:
            print(f"\n{'loading policy + reference, 2 ranks':<36} {'rank 0 peak MiB':>16} {'rank 1 peak MiB':>16} "
                  f"{'held per rank MiB':>18}")
            for mode, label in (("full", "before: whole model on each rank"), ("sharded", "after: meta, shard, fill")):
                r = sorted(run_child(args, "--load", mode, ranks=2), key=lambda r: r["rank"])
                print(f"{label:<36} {r[0]['peak'] / 2**20:>16.0f} {r[1]['peak'] / 2**20:>16.0f} "
                      f"{r[1]['held'] / 2**20:>18.0f}")


if __name__ == "__main__":
    main()
