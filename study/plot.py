"""Figures of runs: each method's (or variant's) mean over seeds, with its min-max band, against the step.

    python study/plot.py study/default/runs/*/ --out /tmp/figures     # the runs study/study.py writes, or any others
    python study/plot.py /tmp/loss/runs/coreward1_s* /tmp/loss/runs/coreward1-gspo_s* --out /tmp/figures

Each RUN_DIR holds a run's metrics.jsonl and config.json (train.py writes both). A run's name (its row, its
line) is its folder's name without the `_sSEED` suffix: coreward1_s0 -> `coreward1`, and a variant that
`study.py --label gspo` made, coreward1-gspo_s2 -> `coreward1-gspo` (a folder without that suffix is named by
config.json's method); the seed comes from config.json. Runs of the same name are its seeds: at each step
that every one of them has logged, the figure draws their mean and shades the band from their minimum to
their maximum (a run still going limits its line to the steps it has reached).

Figures (PNG, matplotlib's Agg backend, so no display is needed):
- eval.png: avg@k (`eval_acc`), greedy and maj@k on the evaluation set;
- train.png: reward, label_acc, rollout_acc, response_len, entropy, and, where the runs logged
  them, the label-free diagnostics unanimous, distinct_answers, zero_variance, common_answer
  and truncated; each seed's values are first averaged over its last TRAIN_WINDOW (10) steps, as
  one step's numbers are too noisy to read.

`series(runs, key)` returns what a panel draws, so that tests can check the numbers, not pixels.
"""
import argparse
import io
import json
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # the loop's modules

EVAL_KEYS = (("eval_acc", "avg@k"), ("eval_greedy", "greedy"), ("eval_maj", "maj@k"))
TRAIN_KEYS = (("reward", "reward"), ("label_acc", "label accuracy"), ("rollout_acc", "rollout accuracy"),
              ("response_len", "response tokens"), ("entropy", "entropy"), ("unanimous", "unanimous groups"),
              ("distinct_answers", "distinct answers per group"), ("zero_variance", "zero-variance groups"),
              ("common_answer", "questions with the most common answer"), ("truncated", "responses cut at the limit"))
TRAIN_WINDOW = 10      # training metrics are per step (16 questions on the classroom world): each seed's line is
                       # its trailing mean over 10 steps, the window of the collapse warning (harness/watches.py)


RUN_FOLDER = re.compile(r"(?P<name>.+)_s(?P<seed>[0-9]+)")     # study.py's METHOD_sSEED, METHOD-LABEL_sSEED


def run_name(path, config):
    """A run's name: its folder's name without the `_sSEED` suffix (`coreward1-gspo_s2` -> `coreward1-gspo`),
    or config.json's method where the folder has no such suffix."""
    match = RUN_FOLDER.fullmatch(os.path.basename(os.path.normpath(path)))
    return match.group("name") if match else config["method"]


def method_order(name):
    """Sort key of a run's name: the methods in rewards.METHOD_TABLE's order, each followed by its variants
    METHOD-LABEL (by label), any other name after them all, by name."""
    from rewards import METHODS
    order = list(METHODS)
    method, dash, label = name.partition("-")
    if name in order:
        return (order.index(name), 0, "")
    if dash and method in order:
        return (order.index(method), 1, label)
    return (len(order), 0, name)


def colors(names):
    """{name: colour}, the same in every figure: each method of rewards.METHOD_TABLE keeps tab10's colour at its
    place in the table; the other names (variants METHOD-LABEL and any other) take, in method_order, the
    colours after them: the rest of tab10, then tab20b's (its five hues, darkest first), then tab20's light
    shades (then again)."""
    import matplotlib
    from rewards import METHODS
    tab = matplotlib.colormaps
    palette = ([tab["tab10"](i) for i in range(10)] + [tab["tab20b"](i + j) for j in range(4) for i in range(0, 20, 4)]
               + [tab["tab20"](i) for i in range(1, 20, 2)])
    ordered = list(METHODS) + sorted(set(names) - set(METHODS), key=method_order)
    return {name: palette[i % len(palette)] for i, name in enumerate(ordered)}


def read_run(path):
    """(name, seed, records) of a run folder: its name as run_name gives it, its seed from config.json."""
    config_path, metrics_path = os.path.join(path, "config.json"), os.path.join(path, "metrics.jsonl")
    for p in (config_path, metrics_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{path} is not a run folder: no {os.path.basename(p)} (train.py writes it)")
    config = json.load(open(config_path))
    records = []
    lines = open(metrics_path).read().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not line.endswith("\n"):     # a run still writing it, or killed mid-write
                print(f"{metrics_path}: its last line is unfinished (a run still writing, or killed mid-write): "
                      f"drawn without it")
                break
            raise ValueError(f"{metrics_path} line {i + 1} is not JSON: {line[:80]!r}; repair or remove it") from None
    return run_name(path, config), config["seed"], records


def smooth(points, window):
    """{step: value} -> {step: mean of the value at this step and the window - 1 logged before it}
    (fewer at the start); window 1 leaves the points as they are."""
    steps = sorted(points)
    return {step: sum(points[s] for s in steps[max(0, i + 1 - window):i + 1]) / min(window, i + 1)
            for i, step in enumerate(steps)}


def series(runs, key, window=1):
    """{name: (steps, mean, low, high)} of `key` over the runs [(name, seed, records)]: at each
    step every seed of the name (a method, or a variant METHOD-LABEL) logged `key` (not None), the mean,
    minimum and maximum over seeds, each seed first smoothed by a trailing mean over `window` logged steps.
    Names that never logged it are left out."""
    by_method = defaultdict(list)                  # method -> [{step: value}] one per seed
    for method, _, records in runs:
        by_method[method].append(smooth({r["step"]: r[key] for r in records if r.get(key) is not None}, window))
    out = {}
    for method, seeds in by_method.items():
        steps = sorted(set.intersection(*(set(s) for s in seeds)))
        if steps:
            values = [[s[step] for s in seeds] for step in steps]
            out[method] = (steps, [sum(v) / len(v) for v in values], [min(v) for v in values],
                           [max(v) for v in values])
    return out


LEGEND_INSIDE = 10        # up to this many lines, the legend sits in the first panel; more, beneath the panels
LEGEND_COLUMNS = 4


def figure(runs, keys, path, title, window=1):
    """One panel per key that some run logged; one line and band per run name (`series` with `window`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(key, label, s) for key, label in keys if (s := series(runs, key, window))]
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    color = colors(name for name, _, _ in runs)       # one colour and place per name in every figure
    seeds = defaultdict(set)
    for method, seed, _ in runs:
        seeds[method].add(seed)
    for ax, (key, label, s) in zip(axes.flat, panels):
        for method, (steps, mean, low, high) in sorted(s.items(), key=lambda item: method_order(item[0])):
            ax.plot(steps, mean, color=color[method], label=f"{method} ({len(seeds[method])} seed(s))", lw=1.5)
            ax.fill_between(steps, low, high, color=color[method], alpha=0.2, lw=0)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    if len(seeds) <= LEGEND_INSIDE:
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
    else:                                             # more lines than a panel holds: a legend of its own beneath
        lines = {}
        for ax in axes.flat:
            lines.update(zip(*reversed(ax.get_legend_handles_labels())))
        legend_rows = -(-len(lines) // LEGEND_COLUMNS)
        width, height = fig.get_size_inches()
        below = 0.17 * legend_rows + 0.1                 # inches
        fig.set_size_inches(width, height + below)
        fig.legend(list(lines.values()), list(lines), loc="lower center", ncol=LEGEND_COLUMNS, fontsize=7,
                   frameon=False)
        fig.tight_layout(rect=(0, below / (height + below), 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=90)
    plt.close(fig)
    from PIL import Image          # matplotlib's own dependency: a 256-colour palette makes the PNG ~3x smaller
    Image.open(buffer).convert("RGB").quantize(256).save(path, optimize=True)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (metrics.jsonl and config.json)")
    ap.add_argument("--out", required=True, help="folder for eval.png and train.png")
    args = ap.parse_args(argv)
    runs = [read_run(path) for path in args.runs]
    os.makedirs(args.out, exist_ok=True)
    written = [figure(runs, EVAL_KEYS, os.path.join(args.out, "eval.png"),
                      "evaluation (mean over seeds, min-max band)"),
               figure(runs, TRAIN_KEYS, os.path.join(args.out, "train.png"),
                      f"training (each seed's mean over {TRAIN_WINDOW} steps; mean over seeds, min-max band)",
                      TRAIN_WINDOW)]
    for path in filter(None, written):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
