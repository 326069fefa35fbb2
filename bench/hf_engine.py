"""Peak memory of the transformers engine's generate at the real vocabulary, before and after its KV budget, and
the official preset's rollout on an H200 by the same formulas.

    python bench/hf_engine.py                   # about 5 minutes on 2 cores
    python bench/hf_engine.py --account-only    # the official preset's rollout on an H200, no measurement

The model is bench/scale.py's Qwen3-shaped one (vocabulary 151,936, 4 layers, width 256, one KV head of 128: 4 KiB
of fp32 KV cache a token), randomly initialised, so that its responses seldom end before max_tokens: every row
grows its cache to the end. The request: 16 prompts of 200-300 tokens x G=8, 128 new tokens at temperature 1.0.

Each variant is a process of its own: the engine is built, then one generate is measured; its peak is the
process's ru_maxrss minus its resident memory before the call.
- before: the engine as it was, every position's logits of the prompts' forward ([P, width, V]: transformers'
  logits_to_keep=0) and every row in one batch (a budget nothing exceeds);
- last logits: rollout.HFEngine, the prompts' forward keeping its last GEMM_ROWS (harness/hf_batches.py) positions'
  logits, in one batch;
- budget B MiB: the same in chunks of whole prompts whose KV caches fit B.
Each variant's tokens and log-probs are compared with the first's: in one thread (OMP_NUM_THREADS=1) they are the
same bit for bit; in several, the CPU's attention and sgemm share a batch out among the threads by its size, and
a random model's nearly flat distributions at this vocabulary turn the last bits into another token now and then
(harness/hf_batches.py).

The account: the KV cache of one rank's step at the official preset (Qwen3-4B-Base in bf16, 147,456 bytes a
token: 36 layers x 8 KV heads x 128 x 2 x 2; a two-view step's 256 rows of 512 + 3,072 tokens), against what
hf_batches.kv_budget derives on an H200 once the trainer's resident state (bench/scale.py's account), the
engine's own bf16 weights and the CUDA runtime are there.
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                      # scale.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # rollout.py, not bench's

import rollout  # noqa: E402
from harness import hf_batches  # noqa: E402
import scale  # noqa: E402

PROMPTS, G, NEW_TOKENS = 16, 8, 128
H200_BYTES = 139 * 2**30             # what the H200 these runs are lent reports
OFFICIAL = dict(rows=128 // 8 * 2 * 8, prompt=512, response=3072)      # one of 8 ranks: 16 questions x 2 views x G


def request(vocab):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(200, 301, (PROMPTS,), generator=g).tolist()
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]
    return prompts, [rollout.request_seed(0, "policy", 1, i) for i in range(PROMPTS)]


def child(model_dir, variant, budget_mib):
    """One generate of `variant`; (peak bytes over the resident before it, seconds, samples)."""
    if variant == "before":
        hf_batches.GEMM_ROWS = 0                   # logits_to_keep=0: every position's
    engine = rollout.HFEngine(model_dir, 512, "float32", kv_budget_gib=budget_mib / 1024 if budget_mib else 1e6)
    prompts, seeds = request(len(engine.tokenizer))
    base = scale.PeakRSS.now()
    t0 = time.perf_counter()
    groups = engine.generate(prompts, G, 1.0, NEW_TOKENS, seeds=seeds)
    seconds = time.perf_counter() - t0
    chunk = hf_batches.prompts_per_chunk(G, max(map(len, prompts)), NEW_TOKENS, engine.token_bytes,
                                         engine.kv_budget_gib, engine.device)
    return {"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base, "seconds": seconds,
            "chunks": math.ceil(PROMPTS / chunk), "tokens": [s.token_ids for g in groups for s in g],
            "logprobs": [s.logprobs for g in groups for s in g]}


def official_account():
    """The official preset's rollout on one H200 rank, by the formulas of HFEngine: (lines to print)."""
    from transformers import Qwen3Config
    c = scale.QWEN3_4B
    token = hf_batches.kv_bytes_per_token(Qwen3Config(**c), torch.bfloat16)
    length = OFFICIAL["prompt"] + OFFICIAL["response"]
    whole, one_prompt = OFFICIAL["rows"] * length * token, G * length * token
    account = scale.memory_account(c, vllm_share=0, weight_sync=False)
    resident = sum(account[k] for k in ("parameters (fp32, sharded)", "AdamW moments (fp32, sharded)",
                                        "reference (sharded)"))
    weights = 2 * scale.param_count(c)[0]
    runtime = 1e9 * scale.CUDA_RUNTIME[1]
    budget = hf_batches.HF_KV_SHARE * (H200_BYTES - resident - weights - runtime)
    prompts_per_chunk = int(budget // one_prompt)
    chunks = math.ceil(OFFICIAL["rows"] // G / prompts_per_chunk)
    rows = prompts_per_chunk * G
    V = c["vocab_size"]
    step_logits = rows * V * (4 + 4 + 8 + 8)       # a decode step's fp32 logits and log-probs, fp64 CDF and its input
    return [f"Official preset, one rank of 8 on an H200 ({H200_BYTES / 2**30:.0f} GiB), Qwen3-4B-Base in bf16: "
            f"{token:,} bytes of KV cache a token",
            f"  a step's {OFFICIAL['rows']} rows x {length:,} tokens in one batch: {whole / 1e9:.1f} GB of KV cache "
            f"(the engine as it was)",
            f"  resident: the trainer's {resident / 1e9:.1f} GB, the engine's weights {weights / 1e9:.1f} GB, the CUDA "
            f"runtime {runtime / 1e9:.1f} GB; the KV budget, {hf_batches.HF_KV_SHARE} of the rest: "
            f"{budget / 1e9:.1f} GB",
            f"  one prompt's {G} rows: {one_prompt / 1e9:.2f} GB; {prompts_per_chunk} prompts a chunk "
            f"({prompts_per_chunk * one_prompt / 1e9:.1f} GB), {chunks} chunks a step",
            f"  beside a chunk's cache, a decode step's logits and CDF take {step_logits / 1e9:.2f} GB, and "
            f"{(H200_BYTES - resident - weights - runtime - prompts_per_chunk * one_prompt) / 1e9:.1f}"
            f" GB are left; fits: {prompts_per_chunk >= 1}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--account-only", action="store_true")
    ap.add_argument("--budgets", default="64,16", help="the chunked variants' KV budgets, MiB")
    ap.add_argument("--model_dir", help="(child) the saved model")
    ap.add_argument("--variant", help="(child) before, or after")
    ap.add_argument("--budget", type=float, default=0, help="(child) MiB, 0: no chunks")
    ap.add_argument("--result", help="(child) where to write the measurement")
    args = ap.parse_args()
    if args.result:
        with open(args.result, "w") as f:
            json.dump(child(args.model_dir, args.variant, args.budget), f)
        return
    print("\n".join(official_account()))
    if args.account_only:
        return
    variants = [("before", "before", 0), ("last logits", "after", 0)] + \
        [(f"budget {b} MiB", "after", float(b)) for b in args.budgets.split(",")]
    print(f"\nHFEngine.generate, bench/scale.py's Qwen3-shaped model (vocabulary {scale.VOCAB:,}), fp32, "
          f"{torch.get_num_threads()} threads: {PROMPTS} prompts of 200-300 tokens x G={G} x {NEW_TOKENS} new tokens")
    print(f"{'variant':<16} {'chunks':>7} {'peak MiB':>9} {'x before':>9} {'seconds':>8} {'tokens':>8} "
          f"{'log-probs':>10}")
    from transformers.utils import logging as transformers_logging
    transformers_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        scale.save_small_model(tmp)
        first = None
        for name, variant, budget in variants:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [sys.executable, os.path.abspath(__file__), "--model_dir", tmp, "--variant", variant,
                       "--budget", str(budget), "--result", f.name]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode:
                    raise RuntimeError(f"{name} failed:\n{res.stderr[-3000:]}")
                r = json.load(open(f.name))
            first = first or r
            same = "same" if r["tokens"] == first["tokens"] else "differ"
            gap = max(abs(a - b) for x, y in zip(r["logprobs"], first["logprobs"]) for a, b in zip(x, y))
            print(f"{name:<16} {r['chunks']:>7} {r['peak'] / 2**20:>9.0f} {first['peak'] / r['peak']:>8.1f}x "
                  f"{r['seconds']:>8.1f} {same:>8} {gap:>10.1e}")


if __name__ == "__main__":
    main()
