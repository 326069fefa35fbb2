"""The stability study: every method over several seeds, their figures, and a table.

    python study/study.py --out study/default                     # every method, 3 seeds, 100 steps: hours on 2 cores
    python study/study.py --out study/lr5e-4 -- --lr 5e-4         # flags after -- go to train.py
    python study/study.py --steps 300 --methods gt,majority,coreward1,coreward2 --out study/long
    python study/study.py --methods coreward1 --out /tmp/loss                 # coreward1, and two variants beside it:
    python study/study.py --methods coreward1 --out /tmp/loss --label gspo -- --policy_loss gspo
    python study/study.py --methods coreward1 --out /tmp/loss --label clip0.28 -- --loss_agg token_mean --clip_high 0.28

Each (method, seed) is one `train.py` run in OUT/runs/METHOD_sSEED, one after another; with --label LABEL
(letters, digits and dots) in OUT/runs/METHOD-LABEL_sSEED, its own row `METHOD-LABEL` of the table and
line of the figures, right after METHOD's, so that invocations with several labels (and their own
flags after --) fill one study folder. `matched_coin` replays the `coreward1` run of its seed in OUT
(`--replay`): run that first. The study can be stopped and started again at will, as the run checkpoints let it go
on where it stopped:
- a run with a final model, or with its evaluation (RUN/eval/results.json, as a study commits it), is finished:
  skipped;
- a run with a complete checkpoint is continued (`--resume`: it samples exactly what the
  uninterrupted run would have);
- any other run starts afresh (`--overwrite`).

After the runs (and with --plot-only, from whatever the runs have logged so far) it draws every run
folder of OUT/runs that has a metrics.jsonl, whichever invocation (--methods, --seeds, --label) made it,
in OUT/eval.png and OUT/train.png (study/plot.py), and writes OUT/table.md: for each row (a run's folder
name without `_sSEED`: a method, or a variant METHOD-LABEL), the first, best and last evaluation of avg@k,
greedy and maj@k, as the mean over seeds and the min-max over seeds, and the step at which each seed's
collapse warning first fired.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)                                   # the loop's modules

from harness import checkpoint  # noqa: E402
import plot  # noqa: E402
from rewards import METHODS  # noqa: E402
from harness.watches import CollapseWatch  # noqa: E402


LABEL = re.compile(r"[A-Za-z0-9.]+")     # no `-` (the METHOD-LABEL separator) and no `_` (the _sSEED suffix)


def label_arg(text):
    """--label's type: the text, if it is letters, digits and dots."""
    if not LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a label: use letters, digits and dots only "
                                         f"(e.g. gspo, clip0.28), as `-` and `_` separate the method and "
                                         f"the seed in the run's folder name METHOD-LABEL_sSEED")
    return text


def seeds_arg(text):
    """--seeds' type: N (seeds 0 to N-1), A-B (A to B) or a comma-separated list."""
    if not re.fullmatch(r"\d+(-\d+)?(,\d+)*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seeds (3), a range (5-9) or a list (0,2,4)")
    if "-" in text:
        first, last = map(int, text.split("-"))
        return range(first, last + 1)
    return range(int(text)) if "," not in text else [int(x) for x in text.split(",")]


def row_name(method, label=None):
    """METHOD, or METHOD-LABEL for a labelled variant: the run's row in the table, its line in the figures."""
    return f"{method}-{label}" if label else method


def run_dir(out, method, seed, label=None):
    """OUT/runs/METHOD_sSEED, or OUT/runs/METHOD-LABEL_sSEED for a labelled variant."""
    return os.path.join(out, "runs", f"{row_name(method, label)}_s{seed}")


def logged_runs(out):
    """The folders of OUT/runs that have a metrics.jsonl, every one of them (any method, seed or label),
    sorted by row (plot.method_order), then seed."""
    paths = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(out, "runs", "*", "metrics.jsonl")))
    found = sorted(((plot.read_run(path), path) for path in paths),
                   key=lambda item: (plot.method_order(item[0][0]), item[0][1], item[1]))
    seen = {}
    for (name, seed, _), path in found:
        if (name, seed) in seen:
            sys.exit(f"{seen[name, seed]} and {path} are both seed {seed} of `{name}`: move one out of {out}/runs")
        seen[name, seed] = path
    return [path for _, path in found], [run for run, _ in found]


def plan(path):
    """What to do with the run in `path`: 'skip' (finished: its final model, or its evaluation as committed), 'resume'
    (has a checkpoint) or 'start'."""
    if any(os.path.exists(os.path.join(path, *f)) for f in (("final", "config.json"), ("eval", "results.json"))):
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
    replay = ["--replay", run_dir(os.path.dirname(os.path.dirname(path)), "coreward1", seed)] \
        if method == "matched_coin" and "--replay" not in extra else []      # coreward1's run of its seed, here
    return base + ["--method", method, "--seed", str(seed), "--steps", str(steps), "--overwrite", *replay, *extra]


def evaluation(path, seed, k):
    """The eval.py command that evaluates a finished run's final model with k samples a question (its own seed's
    evaluation streams), each question's counts into RUN/eval/results.json (study/review.py reads them); None when
    there is nothing to do."""
    if not os.path.exists(os.path.join(path, "final", "config.json")) or \
            os.path.exists(os.path.join(path, "eval", "results.json")):
        return None
    return [sys.executable, os.path.join(ROOT, "eval.py"), "--model", os.path.join(path, "final"), "--k", str(k),
            "--seed", str(seed), "--per_question", "--out", os.path.join(path, "eval")]


def first_warning(records):
    """The step at which the collapse warning (harness/watches.py) first fired in a run (replayed from its
    metrics, so runs logged before a rule existed are judged by today's rules), or None."""
    watch = CollapseWatch()
    return next((r["step"] for r in records if "unanimous" in r and watch.update(r)), None)


def table(runs):
    """Markdown: per row (a method, or a variant METHOD-LABEL: runs [(name, seed, records)]), the first,
    best and last evaluation of each metric, mean over seeds (min-max in brackets when there are several),
    and the step of each seed's first collapse warning (– where none fired)."""
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
    ap.add_argument("--seeds", type=seeds_arg, default=range(3),
                    help="how many seeds (N: 0 to N-1), or which (A-B, or a comma-separated list)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated (default: all of them)")
    ap.add_argument("--label", type=label_arg, default=None,
                    help="runs go to OUT/runs/METHOD-LABEL_sSEED: a variant of each method (its own row and line), "
                         "made with the flags after --; letters, digits and dots")
    ap.add_argument("--eval_k", type=int, default=0,
                    help="after each run, evaluate its final model with this many samples a question, each "
                         "question's counts kept (RUN/eval/results.json, for study/review.py); 0: none")
    ap.add_argument("--plot-only", action="store_true",
                    help="draw and tabulate what every run in OUT/runs has logged; run nothing")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for every train.py run")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if not args.plot_only:
        for seed in args.seeds:
            for method in methods:
                path, name = run_dir(args.out, method, seed, args.label), row_name(method, args.label)
                cmd = command(path, method, seed, args.steps, extra)
                if cmd is None:
                    print(f"{name} seed {seed}: finished, skipped")
                else:
                    print(f"{name} seed {seed}: {plan(path)} -> {' '.join(cmd[1:])}", flush=True)
                    subprocess.run(cmd, check=True)
                if args.eval_k and evaluation(path, seed, args.eval_k):
                    subprocess.run(evaluation(path, seed, args.eval_k), check=True)
    logged, runs = logged_runs(args.out)
    if not logged:
        sys.exit(f"no run in {args.out} has logged anything yet")
    plot.main([*logged, "--out", args.out])
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(runs))
    print(open(os.path.join(args.out, "table.md")).read())


if __name__ == "__main__":
    main()
