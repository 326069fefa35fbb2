"""The seed path's checks on one GPU, at a small scale (bench/gpu_check.sh runs it).

    python bench/gpu_check.py [--steps 4]

For coreward1 and coreward2 in turn: train.py in this process (a world of one) on the classroom
world with the official preset's memory settings in bf16 (activation checkpointing, passes of
16,384 padded tokens, vLLM at the official --gpu_memory_utilization, asleep while the trainer
trains), then from its metrics.jsonl the step times (t_rollout, t_train, t_sync), the bf16 sampler
gap of each step, the GPU's peak memory (torch's allocator, and the device's own reading), and the
weight sync's verdict: every load of the run checked (a failed one stops the run), and a load with
one tensor left out reported. The rollout engine is vLLM where it is installed, otherwise
transformers' (--backend hf). With vLLM it also prints which GPU the engine's worker is on and
vLLM's KV cache in tokens, before and after a sleep.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import train  # noqa: E402
import world  # noqa: E402
from rollout import make_engine  # noqa: E402


def has_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


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


def engine_checks(backend):
    """A load with a tensor left out is reported; with vLLM, where the engine runs and its KV cache."""
    from transformers import AutoModelForCausalLM
    engine = make_engine(backend, world.base_model_dir(), 64, 48, dtype="bfloat16", gpu_memory_utilization=0.3)
    state = AutoModelForCausalLM.from_pretrained(world.base_model_dir(), dtype=torch.bfloat16).state_dict()
    print(f"\n== the {backend} engine")
    if backend == "vllm":
        where = engine.llm.collective_rpc(lambda worker: (worker.local_rank, str(worker.device)))[0]
        cache = engine.llm.llm_engine.vllm_config.cache_config
        print(f"worker: local rank {where[0]} on {where[1]} (LOCAL_RANK {os.environ.get('LOCAL_RANK')}); KV cache "
              f"{cache.num_gpu_blocks} blocks of {cache.block_size} = "
              f"{cache.num_gpu_blocks * cache.block_size:,} tokens")
        free = torch.cuda.mem_get_info()[0]
        engine.sleep()
        print(f"asleep: {gib(torch.cuda.mem_get_info()[0] - free)} freed")
    print(f"a whole load: {engine.load_weights(state.items()) or 'verified'}")
    dropped = "model.layers.0.mlp.up_proj.weight"
    print(f"a load without {dropped}: {engine.load_weights((n, t) for n, t in state.items() if n != dropped)}")
    engine.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_check.py needs a GPU (torch.cuda.is_available() is False)")
    backend = "vllm" if has_vllm() else "hf"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), backend {backend}")
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("coreward1", "coreward2"):
            train_briefly(method, backend, args.steps, os.path.join(tmp, method))
    engine_checks(backend)
