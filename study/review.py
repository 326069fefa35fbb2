"""The study's statistics: each row's final evaluation question by question over its seeds, its differences with
paired bootstrap intervals, and pass@k curves.

    python study/review.py study/reviewed            # OUT/review.md and OUT/passk.png, from what the runs hold
    python study/review.py study/reviewed --evaluate_start 5     # first the start model on seeds 0-4 (OUT/start/)

The data: each run's RUN/eval/results.json (study.py --eval_k 64: its final model, 64 samples a question at the
evaluation temperature on its own seed's evaluation streams, and the greedy response), and the start model's on the
same streams, OUT/start/sSEED/results.json. A row is a run folder's name without `_sSEED` (study.py).

A row's score is avg@64 (right samples / 64, the mean over questions: pass@1 at temperature 1), its mean over seeds,
and greedy. A difference A - B is paired: over the seeds both rows ran, per seed and question. Its 95% interval is
the 2.5th to 97.5th percentile of 10,000 bootstrap draws (seeded) that resample the seeds and the questions, both with
replacement; its p-value twice the share of draws on the far side of 0 (at least 2 / 10,000). A table makes several
comparisons at once, so each p is also adjusted by Holm's step-down over that table's comparisons. A claim holds where
the interval excludes 0 and the adjusted p is below 0.05, over five seeds (fewer: pending); where only the interval
does, it holds unadjusted, and is not claimed. The seeds' spread and the questions' both enter the interval:
two rows whose seeds overlap may still differ, when they differ on the same questions seed by seed.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from eval import pass_at_k  # noqa: E402

DRAWS = 10_000
SEEDS = 5                # a difference is judged over five seeds both rows ran; fewer: pending
K = 64
PASS_KS = (1, 2, 4, 8, 16, 32, 64)
# The tables: (title, the row each is compared with, the rows, columns of the runs' metrics to show beside: each the
# mean over a run's steps, then over the row's runs).
TABLES = [
    ("Methods and controls, lr 1e-4, one update a step: each against the start model", "start",
     ["gt", "majority", "coreward1", "coreward2", "self_harmony", "random", "matched_coin", "permuted", "wrong_label"],
     ["reward"]),
    ("Which label: each method and control against Co-rewarding-I, one update a step", "coreward1",
     ["gt", "majority", "coreward2", "self_harmony", "random", "matched_coin", "permuted", "wrong_label"], ["reward"]),
    ("Updates a step: Co-rewarding-I at 4 against 1", "coreward1", ["coreward1-mb4"], ["clip_frac"]),
    ("The loss family off-policy (4 updates a step), Co-rewarding-I: each against the official loss",
     "coreward1-mb4", ["coreward1-mb4", "coreward1-mb4.cliphigh", "coreward1-mb4.gspo", "coreward1-mb4.cispo",
                       "coreward1-mb4.drgrpo", "coreward1-mb4.tokenmean"], ["clip_frac"]),
    ("DAPO, whole and each part alone on the official loss (4 updates a step): each against the official loss",
     "coreward1-mb4", ["coreward1-mb4.dapo", "coreward1-mb4.tokenmean", "coreward1-mb4.cliphigh",
                       "coreward1-mb4.soft", "coreward1-mb4.filter", "coreward1-mb4.beta0"], ["clip_frac", "rounds"]),
]
CURVES = ["start", "gt", "coreward1", "random"]


def evaluations(out):
    """{row: {seed: per-question array [Q, 2] (right of K, greedy)}}, of the runs and the start model."""
    rows = {}
    paths = glob.glob(os.path.join(out, "runs", "*_s*", "eval", "results.json")) + \
        glob.glob(os.path.join(out, "start", "s*", "results.json"))
    for path in sorted(paths):
        match = re.search(r"([^/]+)_s(\d+)/eval/results\.json$", path) or re.search(r"(start)/s(\d+)/results\.json$",
                                                                                    path)
        result = json.load(open(path))
        if result["k"] != K:
            sys.exit(f"{path}: k = {result['k']}, not {K}")
        rows.setdefault(match.group(1), {})[int(match.group(2))] = np.array(
            result["results"]["classroom"]["per_question"], dtype=float)
    return rows


def metric_mean(out, row, seeds, key):
    """The mean over a row's runs of `seeds` of the mean of `key` over their steps (metrics.jsonl; None: not logged)."""
    means = []
    for path in glob.glob(os.path.join(out, "runs", f"{row}_s*", "metrics.jsonl")):
        if int(re.search(r"_s(\d+)$", os.path.dirname(path)).group(1)) not in seeds:
            continue
        values = [r[key] for r in map(json.loads, open(path)) if key in r]
        means += [np.mean(values)] if values else []
    return float(np.mean(means)) if means else None


def bootstrap(diff, seed=0):
    """(mean, low, high, p) of a paired difference diff [S, Q], resampling seeds and questions (the docstring)."""
    rng = np.random.default_rng(seed)
    s, q = diff.shape
    seeds = rng.multinomial(s, [1 / s] * s, size=DRAWS)             # [draws, S] how often each seed is drawn
    questions = rng.multinomial(q, [1 / q] * q, size=DRAWS)         # [draws, Q]
    draws = np.einsum("bs,sq,bq->b", seeds, diff, questions) / (s * q)
    low, high = np.percentile(draws, [2.5, 97.5])
    p = max(2 * min((draws <= 0).mean(), (draws >= 0).mean()), 2 / DRAWS)
    return float(diff.mean()), float(low), float(high), float(min(p, 1.0))


def holm(ps):
    """Holm's step-down adjustment of the p-values `ps` (a list, None where no comparison): the i-th smallest of m is
    multiplied by m - i (i from 0), made non-decreasing in that order, and capped at 1."""
    order = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    adjusted, running = [None] * len(ps), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(low, high, adjusted, seeds):
    """What a difference's interval [low, high] and Holm-adjusted p say, over `seeds` seeds both rows ran."""
    if seeds < SEEDS:
        return f"pending: {seeds} of {SEEDS} seeds"
    if not (low > 0 or high < 0):
        return "not separated"
    return "holds" if adjusted < 0.05 else "holds unadjusted"


def avg(array):
    """[Q] avg@K of one run's per-question counts."""
    return array[:, 0] / K


def summary_row(name, runs, base, extra):
    """One table row's cells: the row's avg@K mean [min-max over seeds], greedy, pass@K, the cells `extra`; and its
    paired difference from the rows `base`, (mean, low, high, p, seeds), or None where there is none."""
    per_seed = [avg(runs[s]).mean() for s in sorted(runs)]
    greedy = np.mean([runs[s][:, 1].mean() for s in runs])
    reach = np.mean([np.mean([pass_at_k(K, int(c), K) for c in runs[s][:, 0]]) for s in runs])
    cells = [f"`{name}`", str(len(runs)), f"{np.mean(per_seed):.3f} [{min(per_seed):.3f}–{max(per_seed):.3f}]",
             f"{greedy:.3f}", f"{reach:.3f}"] + extra
    common = sorted(set(runs) & set(base)) if base is not None else []
    if not common:
        return cells, None
    return cells, (*bootstrap(np.stack([avg(runs[s]) - avg(base[s]) for s in common])), len(common))


def tables(out, rows):
    """review.md's tables, each row with its statistics, its p adjusted over the table's comparisons."""
    lines = []
    for title, base, names, extras in TABLES:
        shown = [n for n in names if n in rows]
        if not shown:
            continue
        head = ["row", "seeds", f"avg@{K} [seeds' range]", "greedy", f"pass@{K}"] + extras + \
            [f"Δ avg@{K} vs `{base}` [95% interval]", "p", "p (Holm)", "difference"]
        lines += [f"### {title}", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        table = []
        for name in ([base] if base in rows and base not in shown else []) + shown:
            values = [metric_mean(out, name, rows[name], key) for key in extras]
            cells = ["–" if value is None else f"{value:.3f}" for value in values]
            table.append(summary_row(name, rows[name], None if name == base else rows.get(base), cells))
        adjusted = holm([None if diff is None else diff[3] for _, diff in table])
        for (cells, diff), p_holm in zip(table, adjusted):
            if diff is None:
                cells += ["–", "–", "–", "–"]
            else:
                mean, low, high, p, seeds = diff
                cells += [f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]", f"{p:.4f}", f"{p_holm:.4f}",
                          verdict(low, high, p_holm, seeds)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def pass_curves(rows):
    """{row: [pass@k for k in PASS_KS]}: the mean over seeds and questions of the unbiased estimate."""
    return {name: [np.mean([pass_at_k(K, int(c), k) for s in rows[name] for c in rows[name][s][:, 0]])
                   for k in PASS_KS] for name in CURVES if name in rows}


def reach_lines(rows, curves):
    """Whether RL narrows what the model reaches: each curve row's pass@64 against the start's, paired, its p adjusted
    over the curves' comparisons."""
    lines = [f"### pass@k, k = 1 to {K} ([passk.png](passk.png))", "",
             "| row | " + " | ".join(f"pass@{k}" for k in PASS_KS) +
             f" | Δ pass@{K} vs `start` [95% interval] | p | p (Holm) |", "|---" * (len(PASS_KS) + 4) + "|"]
    reach = lambda array: np.array([pass_at_k(K, int(c), K) for c in array[:, 0]])
    diffs = {}
    for name in curves:
        common = sorted(set(rows[name]) & set(rows.get("start", {}))) if name != "start" else []
        if common:
            diffs[name] = bootstrap(np.stack([reach(rows[name][s]) - reach(rows["start"][s]) for s in common]))
    adjusted = dict(zip(diffs, holm([p for *_, p in diffs.values()])))
    for name, values in curves.items():
        cells = [f"`{name}`"] + [f"{v:.3f}" for v in values]
        if name in diffs:
            mean, low, high, p = diffs[name]
            cells += [f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]", f"{p:.4f}", f"{adjusted[name]:.4f}"]
        else:
            cells += ["–", "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for name, values in curves.items():
        ax.plot(PASS_KS, values, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(PASS_KS, [str(k) for k in PASS_KS])
    ax.set_xlabel("k (samples a question)")
    ax.set_ylabel("pass@k, classroom test set")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def evaluate_start(out, seeds):
    """The start model on the evaluation streams of seeds 0 .. seeds-1, into OUT/start/sSEED."""
    from harness import world
    for seed in range(seeds):
        folder = os.path.join(out, "start", f"s{seed}")
        if not os.path.exists(os.path.join(folder, "results.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--model", world.base_model_dir(), "--k",
                            str(K), "--seed", str(seed), "--per_question", "--out", folder], check=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the study's folder (its runs/ and start/)")
    ap.add_argument("--evaluate_start", type=int, default=0, metavar="SEEDS",
                    help="first evaluate the start model on the evaluation streams of this many seeds")
    args = ap.parse_args(argv)
    if args.evaluate_start:
        evaluate_start(args.out, args.evaluate_start)
    rows = evaluations(args.out)
    if not rows:
        sys.exit(f"no run in {args.out} has its evaluation (RUN/eval/results.json) yet")
    curves = pass_curves(rows)
    plot(curves, os.path.join(args.out, "passk.png"))
    with open(os.path.join(args.out, "review.md"), "w") as f:
        f.write(tables(args.out, rows) + "\n" + reach_lines(rows, curves))
    print(open(os.path.join(args.out, "review.md")).read())


if __name__ == "__main__":
    main()
