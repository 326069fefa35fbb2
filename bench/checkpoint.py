"""What a checkpoint costs: its size, the seconds to save and to load it, and the save's share of
training time at the preset's --save_every.

    python bench/checkpoint.py                                  # the classroom model
    python bench/checkpoint.py --model models/smollm2-135m      # SmolLM2-135M (GPUS.md: A real model on a CPU)

For each model, a short `train.py` run (no checkpoints) gives the seconds per training step, from
metrics.jsonl (rollout, train and sync; evaluations and engine start left out). Then the policy after
an AdamW step, with its optimizer state, and an EMA teacher (coreward2/3 save one; the other methods
do not) are saved with `checkpoint.save` and loaded into fresh models with `checkpoint.load`,
`--repeats` times each; the best time counts. Overhead = save seconds / (save_every x step seconds).
One rank; with more, each rank writes and reads its shard in parallel.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness import checkpoint  # noqa: E402
import config  # noqa: E402
from harness.sharding import init_distributed, shard  # noqa: E402


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def step_seconds(model, flags, tmp):
    """Seconds per training step of a short train.py run (in a process of its own)."""
    out = os.path.join(tmp, "run")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train.py"),
           "--method", "coreward1", "--out", out, "--save_every", "0", *flags, *(["--model", model] if model else [])]
    subprocess.run(cmd, check=True, capture_output=True)
    steps = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"reward"' in x]
    return sum(r["t_rollout"] + r["t_train"] + r["t_sync"] for r in steps[1:]) / len(steps[1:])   # the first warms up


def models(model_dir, with_teacher):
    from transformers import AutoModelForCausalLM
    policy = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    teacher = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).requires_grad_(False)) \
        if with_teacher else None
    return policy, optimizer, teacher


def measure(model_dir, with_teacher, repeats, tmp, tokenizer, config):
    policy, optimizer, teacher = models(model_dir, with_teacher)
    for p in policy.parameters():                       # one AdamW step, so that its state exists
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    state = {"scheduler": {}, "order": list(range(1000)), "cursor": 0, "shuffle": torch.Generator().get_state()}
    out = os.path.join(tmp, f"ckpt-{with_teacher}")
    saves, loads = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        path = checkpoint.save(out, i + 1, policy, optimizer, teacher, state, config, tokenizer, keep_last=1)
        saves.append(time.perf_counter() - t0)
        fresh = models(model_dir, with_teacher)
        t0 = time.perf_counter()
        checkpoint.load(path, *fresh)
        loads.append(time.perf_counter() - t0)
    return folder_bytes(path), min(saves), min(loads)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a Hugging Face model folder (default: the classroom base model)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from harness import world
    from transformers import AutoTokenizer
    model_dir = args.model or world.base_model_dir()
    # the classroom preset's step, or GPUS.md's CPU step of a real model
    flags = ["--steps", "4", "--eval_limit", "8", "--eval_every", "100"] if args.model is None else \
        ["--steps", "3", "--data", "openrs", "--questions_per_step", "4", "--group_size", "4",
         "--max_response_len", "128", "--eval_limit", "4", "--eval_every", "100", "--dtype", "float32"]
    save_every = config.PRESETS["classroom" if args.model is None else "official"]["save_every"]
    with tempfile.TemporaryDirectory() as tmp:
        per_step = step_seconds(args.model, flags, tmp)
        init_distributed()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        settings = config.config_of(config.parse_args(["--method", "coreward1",
                                                       *(["--model", args.model] if args.model else [])]))
        n_params = sum(p.numel() for p in models(model_dir, False)[0].parameters())
        print(f"{model_dir}: {n_params / 1e6:.1f}M parameters; a training step takes {per_step:.2f} s "
              f"({' '.join(flags)}); --save_every {save_every}")
        print("| checkpoint | size | save s | load s | save / (save_every x step) |")
        print("|---|---|---|---|---|")
        for with_teacher in (False, True):
            size, save_s, load_s = measure(model_dir, with_teacher, args.repeats, tmp, tokenizer, settings)
            what = "policy + AdamW + teacher (coreward2/3)" if with_teacher else "policy + AdamW"
            print(f"| {what} | {size / 2**20:.1f} MiB | {save_s:.2f} | {load_s:.2f} | "
                  f"{100 * save_s / (save_every * per_step):.2f}% |")


if __name__ == "__main__":
    main()
