"""The classroom training phase and its levers: seconds of one GRPO update on the default run's
batch, and the FLOP/s it reaches against a large fp32 matmul, timed in the same run.

    python bench/classroom.py              # about 3 minutes on 2 cores, on an otherwise idle machine
    python bench/classroom.py --profile    # the top operators of one update of the classroom preset
    python bench/classroom.py --profile --compile_layers      # the same, the policy's layers compiled

The batch is the default run's shape: 256 responses (16 pairs x 2 views x G=8) to classroom
prompts, each response 1-48 tokens (lengths drawn like a run's: most stop early), one update,
the reference forward included, fp32 unless said. Each lever changes one thing against "now":

- before: the output layer over every position of the batch (prompt and padding too), through a
  [B, T, V] log-softmax, with the entropy of every position (the path before logprobs.py's chunked
  log-probs);
- token budget: --max_tokens_per_micro_batch 4096, passes of rows of similar length;
- 1 thread: half the cores, to see how the phase scales;
- bf16: the policy computed in bf16 (FSDP mixed precision, fp32 master weights) on this CPU's
  AVX-512-BF16, with the largest log-prob difference to fp32;
- torch.compile: each decoder layer compiled; the first update (compilation) is reported apart,
  with the updates it takes to pay back.

--profile runs torch.profiler over one update of the classroom preset's path (token-budget passes
of 4,096 tokens, fp32) after two warm-up updates, and prints the operators with the most self CPU
time: what an update spends its time on.

FLOPs of an update = 2 N_body B T (the reference forward) + 6 N_body B T (the policy's forward and
backward) + 8 N_head R (the output layer, at the R response positions only), B x T the positions
the passes compute; attention's own products left out. Seconds are the median of --repeats updates
after one warm-up.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import grpo  # noqa: E402
from grpo import Batch, StepConfig, train_step  # noqa: E402
from config import PRESETS  # noqa: E402


def step_config(**settings):
    """A grpo.StepConfig of the classroom preset, its passes grouped by count unless given, with `settings` changed."""
    return StepConfig.of({**PRESETS["classroom"], "max_tokens_per_micro_batch": 0, **settings})
from harness.sharding import init_distributed, shard  # noqa: E402
from scale import vocab_token_logprobs  # noqa: E402  (the path before chunked log-probs)


def matmul_flops(size=2048, repeats=5):
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def classroom_batch(seed=0):
    """256 rows: real classroom prompts, responses of 1-48 random tokens (geometric-like lengths)."""
    from harness import data
    from harness import world
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(world.base_model_dir())
    encode = data.prompt_encoder(tok, True)
    pairs = data.classroom_pairs("train")[:16]
    prompts = [encode(p.original) for p in pairs] + [encode(p.rephrased) for p in pairs]
    g = torch.Generator().manual_seed(seed)
    rows = [(p, torch.randint(2, len(tok), (int(torch.randint(8, 49, (1,), generator=g)),), generator=g).tolist())
            for p in prompts for _ in range(8)]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p) - 1:len(p) + len(r) - 1] = 1
    return Batch(ids, mask, torch.randn(len(rows), generator=g), torch.zeros(len(rows), width - 1),
                 torch.zeros(len(rows), dtype=torch.long), torch.ones(len(rows), width - 1))


def build(dtype=torch.float32, compile_layers=False):
    """The policy, the reference and the optimizer, as train.py builds them on one rank;
    `compile_layers` compiles the policy's decoder layers only (train.py's flag also compiles the
    reference's)."""
    from transformers import AutoModelForCausalLM
    from harness import world
    load = lambda: AutoModelForCausalLM.from_pretrained(world.base_model_dir(), dtype=torch.float32)
    compute = None if dtype == torch.float32 else dtype
    policy = shard(load(), param_dtype=compute, compile_layers=compile_layers)
    ref = shard(load().requires_grad_(False), param_dtype=compute)
    return policy, ref, torch.optim.AdamW(policy.parameters(), lr=1e-6)


def measure(batch, repeats, dtype=torch.float32, budget=None, compile_layers=False):
    """(seconds of the first update, median seconds of the next `repeats`, log-probs of the batch)."""
    policy, ref, optimizer = build(dtype, compile_layers)
    cfg = step_config(micro_batch_size=256, max_tokens_per_micro_batch=budget, max_grad_norm=1e9)
    logp = grpo.score(policy, batch, cfg)
    seconds = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        train_step(policy, ref, optimizer, batch, cfg, 1, order=torch.arange(len(batch)))
        seconds.append(time.perf_counter() - t0)
    return seconds[0], statistics.median(seconds[1:]), logp


def profile(batch, compile_layers=False, top=15):
    """A table of the `top` operators by self CPU time in one update of the classroom preset's path."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    policy, ref, optimizer = build(compile_layers=compile_layers)
    cfg = step_config(micro_batch_size=256, max_tokens_per_micro_batch=4096, max_grad_norm=1e9)
    update = lambda: train_step(policy, ref, optimizer, batch, cfg, 1, order=torch.arange(len(batch)))
    for _ in range(2):
        update()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        update()
        seconds = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"one update, {seconds:.2f} s under the profiler ({total / 1e6:.2f} s of self CPU time over "
          f"{len(events)} operators); the top {top}:")
    print("| operator | calls | self CPU s | share |")
    print("|---|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        share = 100 * e.self_cpu_time_total / total
        print(f"| `{e.key}` | {e.count} | {e.self_cpu_time_total / 1e6:.3f} | {share:.1f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="the top operators of one update, and nothing else")
    ap.add_argument("--compile_layers", action="store_true",
                    help="with --profile: the policy's decoder layers compiled")
    args = ap.parse_args()
    init_distributed()
    torch.set_num_threads(os.cpu_count())
    if args.profile:
        return profile(classroom_batch(), args.compile_layers)
    from transformers import AutoConfig
    from harness import world
    config = AutoConfig.from_pretrained(world.base_model_dir())
    n_head = config.vocab_size * config.hidden_size
    model = __import__("transformers").AutoModelForCausalLM.from_config(config)
    n_body = sum(p.numel() for p in model.parameters()) - n_head
    batch = classroom_batch()
    B, T = batch.input_ids.shape
    R = int(batch.mask.sum())
    peak = matmul_flops()
    print(f"classroom model: {n_body / 1e3:.0f}K body + {n_head / 1e3:.0f}K output-layer parameters; batch {B} x {T} "
          f"positions, {R} response tokens; fp32 matmul {peak / 1e9:.0f} GFLOP/s on {torch.get_num_threads()} "
          f"threads\n")

    def flops(positions, head_rows):
        return 8 * n_body * positions + 8 * n_head * head_rows

    rows = []
    original = grpo.token_logprobs
    grpo.token_logprobs = vocab_token_logprobs
    _, s, _ = measure(batch, args.repeats)
    grpo.token_logprobs = original
    rows.append(("before (output layer at every position)", s, flops(B * T, B * (T - 1)), ""))
    _, now, logp32 = measure(batch, args.repeats)
    rows.append(("now", now, flops(B * T, R), ""))
    lengths = grpo.sequence_lengths(batch.mask)
    passes = grpo.micro_batches_for_all_ranks(lengths, step_config(max_tokens_per_micro_batch=4096))
    computed = sum(len(p) * int(lengths[p].max()) for p in passes)
    _, s, _ = measure(batch, args.repeats, budget=4096)
    rows.append((f"token budget 4096 ({len(passes)} passes)", s, flops(computed, R), ""))
    torch.set_num_threads(max(1, os.cpu_count() // 2))
    _, s, _ = measure(batch, args.repeats)
    rows.append((f"{torch.get_num_threads()} thread(s)", s, flops(B * T, R), ""))
    torch.set_num_threads(os.cpu_count())
    _, s, logp16 = measure(batch, args.repeats, dtype=torch.bfloat16)
    diff = ((logp16 - logp32).abs() * batch.mask).max().item()
    rows.append(("bf16 compute", s, flops(B * T, R), f"log-probs differ from fp32 by up to {diff:.3f}"))
    first, s, _ = measure(batch, args.repeats, compile_layers=True)
    payback = (first - now) / max(now - s, 1e-9)
    rows.append(("torch.compile (decoder layers)", s, flops(B * T, R),
                 f"first update {first:.1f} s: pays back after {payback:.0f} updates" if s < now else
                 f"first update {first:.1f} s: never pays back"))

    print(f"{'train phase, one update':<42} {'seconds':>8} {'x now':>6} {'GFLOP/s':>8} {'% of matmul':>12}  note")
    for name, s, f, note in rows:
        print(f"{name:<42} {s:>8.3f} {now / s:>6.2f} {f / s / 1e9:>8.1f} {100 * f / s / peak:>11.0f}%  {note}")


if __name__ == "__main__":
    main()
