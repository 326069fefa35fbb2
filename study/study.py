"""The stability study: every method over several seeds, their figures, and a table.

    python study/study.py --out study/default                     # every method, 3 seeds, 100 steps: hours on 2 cores
    python study/study.py --out study/lr5e-4 -- --lr 5e-4         # flags after -- go to train.py
    python study/study.py --steps 300 --methods gt,majority,coreward1,coreward2 --out study/long

Each (method, seed) is one `train.py` run in OUT/runs/METHOD_sSEED, one after another. The study
can be stopped and started again at will, as the run checkpoints let it go on where it stopped:
- a run with a final model is finished: skipped;
- a run with a complete checkpoint is continued (`--resume`: it samples exactly what the
  uninterrupted run would have);
- any other run starts afresh (`--overwrite`).

After the runs (and with --plot-only, from whatever the runs have logged so far) it draws
OUT/eval.png and OUT/train.png (study/plot.py) and writes OUT/table.md: for each method, the first,
best and last evaluation of avg@k, greedy and maj@k, as the mean over seeds and the min-max over
seeds, and the step at which each seed's collapse warning first fired.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)                                   # the loop's modules

import checkpoint  # noqa: E402
import plot  # noqa: E402
from rewards import METHODS  # noqa: E402
from run import CollapseWatch  # noqa: E402


def run_dir(out, method, seed):
    return os.path.join(out, "runs", f"{method}_s{seed}")


def plan(path):
    """What to do with the run in `path`: 'skip' (finished), 'resume' (has a checkpoint) or 'start'."""
    if os.path.exists(os.path.join(path, "final", "config.json")):
        return "skip"
    if checkpoint.latest(path) is not None:
        return "resume"
    return "start"


def command(path, method, seed, steps, extra):
    """The train.py command for a run, by its plan (None: nothing to do)."""
    action = plan(path)
    if action == "skip":
        return None
    base = [sys.executable, os.path.join(ROOT, "train.py"), "--out", path]
    if action == "resume":
        return base + ["--resume"]
    return base + ["--method", method, "--seed", str(seed), "--steps", str(steps), "--overwrite", *extra]


def first_warning(records):
    """The step at which the collapse warning (run.py) first fired in a run (replayed from its
    metrics, so runs logged before a rule existed are judged by today's rules), or None."""
    watch = CollapseWatch()
    return next((r["step"] for r in records if "unanimous" in r and watch.update(r)), None)


def table(runs):
    """Markdown: per method, the first, best and last evaluation of each metric, mean over seeds
    (min-max in brackets when there are several), and the step of each seed's first collapse
    warning (– where none fired)."""
    metrics = [key for key, _ in plot.EVAL_KEYS]
    labels = [label for _, label in plot.EVAL_KEYS]
    lines = ["| method | seeds | step (last) | " + " | ".join(f"{m} first / best / last" for m in labels)
             + " | collapse warning at step |", "|---|---|---|" + "---|" * (len(metrics) + 1)]
    seeds = {}
    for method, seed, _ in runs:
        seeds.setdefault(method, set()).add(seed)
    for method in sorted(seeds, key=plot.method_order):
        cells, last_step = [], None
        for key in metrics:
            steps, mean, low, high = plot.series(runs, key).get(method, ([], [], [], []))
            if not steps:
                cells.append("–")
                continue
            last_step = steps[-1]
            best = max(range(len(mean)), key=lambda i: mean[i])
            spread = lambda i: f" ({low[i]:.3f}–{high[i]:.3f})" if len(seeds[method]) > 1 else ""
            cells.append(" / ".join(f"{mean[i]:.3f}{spread(i)}" for i in (0, best, len(mean) - 1)))
        warned = [first_warning(records) for m, _, records in sorted(runs, key=lambda r: r[1]) if m == method]
        cells.append(", ".join("–" if step is None else str(step) for step in warned))
        lines.append(f"| `{method}` | {len(seeds[method])} | {last_step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the study's folder (runs/, figures, table.md)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated (default: all of them)")
    ap.add_argument("--plot-only", action="store_true",
                    help="draw and tabulate what the runs have logged; run nothing")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for every train.py run")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    paths = [(m, s, run_dir(args.out, m, s)) for s in range(args.seeds) for m in methods]
    if not args.plot_only:
        for method, seed, path in paths:
            cmd = command(path, method, seed, args.steps, extra)
            if cmd is None:
                print(f"{method} seed {seed}: finished, skipped")
                continue
            print(f"{method} seed {seed}: {plan(path)} -> {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
    logged = [path for _, _, path in paths if os.path.exists(os.path.join(path, "metrics.jsonl"))]
    if not logged:
        sys.exit(f"no run in {args.out} has logged anything yet")
    runs = [plot.read_run(path) for path in logged]
    plot.main([*logged, "--out", args.out])
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(runs))
    print(open(os.path.join(args.out, "table.md")).read())


if __name__ == "__main__":
    main()
