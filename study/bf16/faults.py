"""A bf16 classroom run whose weight sync fails without a word, to see what the sampler gap shows.

    python study/bf16/faults.py --fault skip --lr 1e-3 --steps 12 --out study/bf16/faults/skip-lr1e-3
    python study/bf16/faults.py --fault partial --lr 3e-6 --steps 100 --out study/bf16/faults/partial-lr3e-6

coreward1 on the classroom in bf16 with transformers' engine (--backend hf, whose weights can be read here), the
watch's ceiling off (--max_sampler_gap 1e9) so that the whole curve is logged, no evaluation beyond greedy on 8
questions at the start. The engine's load is replaced by a faulty one that reports success:
- skip: it takes nothing: the engine stays on the start weights;
- partial: it takes every tensor but layer 0's.
After each sync, OUT/drift.jsonl gets how far the engine's layer 0 is from the trainer's bf16 cast of it: the
elements that differ (of all of layer 0's) and the largest difference. OUT/metrics.jsonl is the run's own.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the loop's modules

import torch  # noqa: E402

from harness import sharding  # noqa: E402
import train  # noqa: E402

LAYER = "model.layers.0."


def faulty(engine, fault):
    """The engine, its load_weights replaced by one that leaves out what `fault` says and reports success."""
    def load(named_tensors):
        params = dict(engine.model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if fault == "partial" and not name.startswith(LAYER):
                    params[name].copy_(tensor)
    engine.load_weights = load
    return engine


def drift(engine, policy):
    """{differ, of, largest}: layer 0 of the engine against the trainer's cast of it (a collective: the gather)."""
    engine_params = dict(engine.model.named_parameters(remove_duplicate=False))
    differ = total = 0
    largest = 0.0
    for name, tensor in sharding.gather_full_weights(policy, engine.dtype):
        if name.startswith(LAYER):
            d = (engine_params[name].float() - tensor.float()).abs()
            differ, total, largest = differ + int((d > 0).sum()), total + d.numel(), max(largest, float(d.max()))
    return {"differ": differ, "of": total, "largest": largest}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fault", choices=("skip", "partial"), required=True)
    ap.add_argument("--lr", required=True)
    ap.add_argument("--steps", default="12")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    real_engine, real_sync = train.make_engine, train.sync_engine_weights
    drifts = []

    def sync_and_measure(engine, model):            # the run's folder is ready by the first sync
        real_sync(engine, model)
        drifts.append(drift(engine, model))
        with open(os.path.join(args.out, "drift.jsonl"), "w") as log:
            log.writelines(json.dumps(d) + "\n" for d in drifts)
    train.make_engine = lambda *a, **k: faulty(real_engine(*a, **k), args.fault)
    train.sync_engine_weights = sync_and_measure
    train.main(["--method", "coreward1", "--dtype", "bfloat16", "--lr", args.lr, "--steps", args.steps,
                "--backend", "hf", "--eval_every", "1000", "--eval_k", "0", "--eval_limit", "8", "--save_every", "0",
                "--max_sampler_gap", "1e9", "--sampler_gap_factor", "1e9", "--out", args.out, "--overwrite"])


if __name__ == "__main__":
    main()
