"""A training step in fp32 against the same step in bf16, phase by phase, side by side, on this machine.

    python bench/precision.py --model models/smollm2-135m           # SmolLM2-135M: 2 rounds, about 20 minutes
    python bench/precision.py                                       # the classroom model
    python bench/precision.py --rounds 3 -- --questions_per_step 8  # flags after -- go to every train.py run

Each round runs `train.py --method coreward1` twice in fresh folders, once with `--dtype float32` and once with
`--dtype bfloat16`, the order alternating between rounds so that the machine's drift falls on both alike. From each
run's metrics.jsonl it takes the median over its steps 2.. of t_rollout, t_train and t_sync, and the sampler gap;
the table gives each dtype's median over rounds and bf16's seconds over fp32's. Before the runs, a 2048 x 2048
matmul in each dtype, timed in the same process, says what the processor's bf16 arithmetic does alone.

What differs between the two runs' arithmetic: in fp32 the engine samples, and the trainer computes, in float32.
In bf16 the engine's weights and activations are bfloat16 (its own kernels), and the trainer computes its
forwards and backwards in bfloat16 under FSDP2's mixed precision (sharding.load_sharded), while its master
weights, the gradients' reduction and AdamW stay float32; the frozen reference is held in bfloat16, and the
logits are cast to float32 before the log-softmax (logprobs.py). The samples differ (other kernels, other
rounding), so the two runs' rewards and steps are not the same ones: the figures compare the cost of a step of
the same shape.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DTYPES = ("float32", "bfloat16")
PHASES = ("t_rollout", "t_train", "t_sync")
# the step: small enough for a CPU, the shape of study/smollm's runs
STEP_FLAGS = ["--preset", "classroom", "--questions_per_step", "4", "--group_size", "8", "--max_prompt_len", "160",
              "--max_response_len", "64", "--max_tokens_per_micro_batch", "1024", "--eval_every", "1000",
              "--eval_k", "0", "--eval_limit", "1", "--save_every", "0"]


def processor():
    """The processor's name, and whether it has AMX and AVX512-BF16 (bf16 matmuls in hardware)."""
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return f"{name} (amx_bf16: {'amx_bf16' in flags}, avx512_bf16: {'avx512_bf16' in flags})"


def matmul_gflops(dtype, n=2048, seconds=3.0):
    """GFLOP/s of an n x n matmul in `dtype`, repeated for about `seconds`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return 2 * n ** 3 * count / (time.perf_counter() - t0) / 1e9


def one_run(dtype, model, steps, extra):
    """{phase: median seconds over steps 2..}, and the median sampler gap, of one train.py run."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--method", "coreward1", "--dtype", dtype,
               "--steps", str(steps), "--out", out, *STEP_FLAGS, *(["--model", model] if model else []), *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps_ = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward" in r][1:]
    result = {p: statistics.median(r[p] for r in steps_) for p in PHASES}
    result["sampler_gap"] = statistics.median(r["sampler_gap"] for r in steps_)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model folder (default: the classroom base model)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="steps of each run; the first is left out of the medians")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for every train.py run")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    print(f"processor: {processor()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    flops = {d: matmul_gflops(getattr(torch, d)) for d in DTYPES}
    print(f"2048 x 2048 matmul: fp32 {flops['float32']:.0f} GFLOP/s, bf16 {flops['bfloat16']:.0f} GFLOP/s "
          f"(bf16 / fp32 {flops['bfloat16'] / flops['float32']:.2f}x)")
    runs = {d: [] for d in DTYPES}
    for r in range(args.rounds):
        for dtype in (DTYPES if r % 2 == 0 else DTYPES[::-1]):
            runs[dtype].append(one_run(dtype, args.model, args.steps, extra))
            print(f"round {r + 1}, {dtype}: " + ", ".join(f"{k} {v:.3g}" for k, v in runs[dtype][-1].items()),
                  flush=True)
    med = {d: {k: statistics.median(run[k] for run in runs[d]) for k in runs[d][0]} for d in DTYPES}
    print(f"\n{args.model or 'the classroom model'}, {args.rounds} rounds of {args.steps} steps, medians:")
    print("| per step | fp32 | bf16 | bf16 / fp32 |\n|---|---|---|---|")
    for k in (*PHASES, "step"):
        f32, b16 = ((sum(med[d][p] for p in PHASES) if k == "step" else med[d][k]) for d in DTYPES)
        print(f"| {k} (s) | {f32:.2f} | {b16:.2f} | {b16 / f32:.2f}x |")
    print(f"| sampler gap (per token) | {med['float32']['sampler_gap']:.2g} | {med['bfloat16']['sampler_gap']:.2g} | |")


if __name__ == "__main__":
    main()
