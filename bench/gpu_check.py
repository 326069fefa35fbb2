"""The seed path's checks on one GPU, at a small scale (bench/gpu_check.sh runs it).

    python bench/gpu_check.py [--steps 4] [--runner v1|v2]
    python bench/gpu_check.py --child engine         # the engine's part alone; also runs on a CPU (no sleep there)

Each part runs in a child process of its own (this file with --child), as bench/scale.py runs its
measurements, so that each process starts one vLLM engine: vLLM's sleep mode allocates through a CuMem
pool that serves one engine instance per process, and an earlier engine's pool still holds its memory
after that engine is shut down. A child's output is printed as it comes; a child that fails is named at
the end, and the check then exits with status 1. The parts, in this order:

- engine: the rollout engine alone, in bf16 at --gpu_memory_utilization 0.3. With vLLM: which GPU its
  worker is on, vLLM's KV cache in tokens, which model runner vLLM took, and what the weight check reads
  back (rollout.Readback: how many of the engine's parameters, what share of the model's bytes, which
  not). Then greedy responses to 16 classroom questions with their log-probs; the engine sleeps
  (level 2: weights and KV cache freed, and how much memory that gave back); the unchanged weights are
  loaded again, which wakes it (a checked load); the same requests again must give the same tokens and
  log-probs, bit for bit. Last, a load with one tensor left out, which must be reported.
- coreward1, coreward2: train.py (a world of one) on the classroom world with the official preset's
  memory settings in bf16 (activation checkpointing, passes of 16,384 padded tokens, vLLM at the
  official --gpu_memory_utilization, asleep while the trainer trains), then from its metrics.jsonl the
  step times (t_rollout, t_train, t_sync), the bf16 sampler gap of each step, the GPU's peak memory
  (torch's allocator, and the device's own reading), and the weight sync's verdict: every load of the
  run checked (a failed one stops the run).

The rollout engine is vLLM where it is installed, otherwise transformers' (--backend hf).

The model runner: vLLM 0.32 takes Model Runner V2 on CUDA where Triton is installed, unless the
configuration asks for a feature V2 lacks (vllm/config/vllm.py, VllmConfig.use_v2_model_runner); the
environment variable VLLM_USE_V2_MODEL_RUNNER (0 or 1) decides instead where it is set. --runner sets it
for the children (v1: 0, v2: 1); without --runner they inherit this process's environment.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import train  # noqa: E402
import world  # noqa: E402
from rollout import make_engine  # noqa: E402

RUNNERS = {"v1": "0", "v2": "1"}          # --runner: VLLM_USE_V2_MODEL_RUNNER
METHODS = ("coreward1", "coreward2")


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def train_briefly(method, backend, steps, out):
    torch.cuda.reset_peak_memory_stats()
    free_before, total = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    train.main(["--method", method, "--preset", "classroom", "--backend", backend, "--dtype", "bfloat16",
                "--activation_checkpointing", "--max_tokens_per_micro_batch", "16384", "--steps", str(steps),
                "--eval_every", str(steps), "--eval_k", "0", "--save_every", "0", "--out", out])
    seconds = time.perf_counter() - t0
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps_ = [r for r in records if "reward" in r]
    med = lambda key: statistics.median(r[key] for r in steps_[1:] or steps_)
    print(f"\n== {method} ({backend}, bf16, {steps} steps, {seconds:.0f} s in all)")
    print(f"peak memory: torch allocated {gib(torch.cuda.max_memory_allocated())}, reserved "
          f"{gib(torch.cuda.max_memory_reserved())}; the device: {gib(total)} in all, "
          f"{gib(total - free_before)} in use before the run")
    print(f"per step (median of steps 2..): t_rollout {med('t_rollout'):.2f} s, t_train {med('t_train'):.2f} s, "
          f"t_sync {med('t_sync'):.3f} s; first step {steps_[0]['t_rollout']:.2f} / {steps_[0]['t_train']:.2f} / "
          f"{steps_[0]['t_sync']:.3f} s")
    print("bf16 sampler gap per step: " + ", ".join(f"{r['sampler_gap']:.4f}" for r in steps_))
    print(f"weight sync: {len(steps_) * (2 if method == 'coreward2' else 1)} checked loads, none failed "
          f"(a failed one stops the run with WeightSyncError)")
    print("eval: " + ", ".join(f"step {r['step']} greedy {r['eval_greedy']:.3f}" for r in records
                               if "eval_greedy" in r))


def _runner_of(worker):
    """Runs in the vLLM worker: the model runner's class, and whether the worker took Model Runner V2."""
    cls = type(worker.model_runner)
    return f"{cls.__module__}.{cls.__qualname__}", getattr(worker, "use_v2_model_runner", None)


def engine_checks(backend):
    """The engine part (the module's docstring). Returns what failed, in words ([] when nothing did)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    on_gpu = torch.cuda.is_available()
    dtype = "bfloat16" if on_gpu else "float32"
    model_dir = world.base_model_dir()
    engine = make_engine(backend, model_dir, 64, 48, dtype=dtype, gpu_memory_utilization=0.3)
    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).state_dict()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:16]]
    failed, sleeps = [], getattr(engine, "sleeps", False)        # vLLM's sleep mode: on a GPU
    print(f"\n== the {backend} engine ({dtype}, {'sleeps' if sleeps else 'no sleep'})")
    if backend == "vllm":
        where = engine.llm.collective_rpc(lambda worker: (worker.local_rank, str(worker.device)))[0]
        cache = engine.llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks or 0
        print(f"worker: local rank {where[0]} on {where[1]} (LOCAL_RANK {os.environ.get('LOCAL_RANK')}); KV cache "
              f"{blocks} blocks of {cache.block_size} = {blocks * cache.block_size:,} tokens")
        runner, v2 = engine.llm.collective_rpc(_runner_of)[0]
        print(f"model runner: {runner} (Model Runner V2: {v2}; VLLM_USE_V2_MODEL_RUNNER "
              f"{os.environ.get('VLLM_USE_V2_MODEL_RUNNER', 'unset')})")
        print(engine.readback.report())
    greedy = lambda: [(s.token_ids, s.logprobs) for group in engine.generate(prompts, n=1, temperature=0.0,
                                                                             max_tokens=48) for s in group]
    before = greedy()
    free = torch.cuda.mem_get_info()[0] if on_gpu else None
    engine.sleep()
    if sleeps:
        print(f"asleep (level 2): {gib(torch.cuda.mem_get_info()[0] - free)} freed")
    whole = engine.load_weights(state.items())
    print(f"the unchanged weights loaded again{', which woke the engine' if sleeps else ''}: {whole or 'verified'}")
    after = greedy()
    same = after == before
    tokens = sum(len(ids) for ids, _ in before)
    print(f"greedy before {'the sleep and after the' if sleeps else 'and after the'} reload: {len(before)} responses, "
          f"{tokens} tokens: "
          + ("tokens and log-probs identical" if same else
             f"{sum(a != b for a, b in zip(before, after))} responses differ"))
    dropped = "model.layers.0.mlp.up_proj.weight"
    partial = engine.load_weights((n, t) for n, t in state.items() if n != dropped)
    print(f"a load without {dropped}: {partial}")
    engine.close()
    failed += [f"the whole load: {whole}"] * bool(whole)
    failed += ["greedy responses changed over sleep, wake-up and reload"] * (not same)
    failed += [f"the load without {dropped} was not reported"] * (not (partial and dropped in partial))
    return failed


def run_child(part, args, out=None):
    """This file with --child PART in a process of its own, its output printed as it comes; its exit status."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", part, "--steps", str(args.steps)]
    cmd += ["--out", out] if out else []
    env = dict(os.environ)
    if args.runner:
        env["VLLM_USE_V2_MODEL_RUNNER"] = RUNNERS[args.runner]
    sys.stdout.flush()
    return subprocess.run(cmd, env=env).returncode


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="training steps of each method")
    ap.add_argument("--runner", choices=sorted(RUNNERS),
                    help="vLLM's model runner for the children (VLLM_USE_V2_MODEL_RUNNER); default: vLLM's choice")
    ap.add_argument("--child", choices=("engine",) + METHODS, help="(a child) run this part here")
    ap.add_argument("--out", help="(a training child) the run's folder")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import config
    backend, _ = config.choose_backend("auto")          # vLLM where it is installed, as train.py's default
    if args.child == "engine":
        failed = engine_checks(backend)
        if failed:
            raise SystemExit("the engine check failed: " + "; ".join(failed))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_check.py needs a GPU (torch.cuda.is_available() is False)")
    if args.child:
        train_briefly(args.child, backend, args.steps, args.out)
        return
    runner = args.runner or "vLLM's choice"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), backend {backend}, "
          f"model runner: {runner}")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("engine",) + METHODS:
            status = run_child(part, args, None if part == "engine" else os.path.join(tmp, part))
            failed += [f"{part} (exit status {status})"] * bool(status)
    if failed:
        raise SystemExit("failed: " + ", ".join(failed))
    print("\nevery part passed")


if __name__ == "__main__":
    main()
