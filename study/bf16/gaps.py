"""The sampler gap of the bf16 runs, step by step: a table and the curves.

    python study/bf16/gaps.py            # reads the runs below; writes gaps.md and gaps.png here

The sampler gap (`sampler_gap` in metrics.jsonl) is the mean over a step's response tokens of |the engine's
log-prob - the trainer's| for the engine's own samples. For each run the table gives its precision and engine
(from its config.json), its learning rate, the steps it logged, the mean of its first 3 steps (the baseline of
watches.SamplerGapWatch), its median and largest gap with the largest's step and ratio to the baseline, and what the
watch does with the run's gaps, replayed: the warnings it prints (above --sampler_gap_factor times the baseline)
and whether it stops the run (above the ceiling of the run's precision, watches.SAMPLER_GAP_CEILING). The runs
themselves ran with the watch off (--max_sampler_gap 1e9), to measure the whole curve.

The runs: the healthy ones, study/bf16/*/runs/* (study/study.py's layout), and the faulty ones,
study/bf16/faults/* (study/bf16/faults.py: an engine that skips its loads or leaves layer 0 out), whose row
adds how far the engine's layer 0 had drifted from the trainer's bf16 cast at the last step, where measured.
"""
import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))                # the loop's modules

import matplotlib  # noqa: E402
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.watches import SAMPLER_GAP_CEILING, SamplerGapWatch  # noqa: E402

FACTOR = 5.0                                                      # --sampler_gap_factor's default


def runs(pattern):
    """[(name, config, [step records], drift or None)] of every run folder matching `pattern` under this folder."""
    found = []
    for path in sorted(glob.glob(os.path.join(HERE, pattern, "metrics.jsonl"))):
        run = os.path.dirname(path)
        config = json.load(open(os.path.join(run, "config.json")))
        steps = [r for r in map(json.loads, open(path)) if "sampler_gap" in r]
        drift = os.path.join(run, "drift.jsonl")
        drift = [json.loads(line) for line in open(drift)][-1] if os.path.exists(drift) else None
        found.append((os.path.relpath(run, HERE).replace(os.sep + "runs" + os.sep, "/"), config, steps, drift))
    return found


def replay(config, steps):
    """(warnings, the step the watch stops at or None) of the watch at the run's precision over its gaps."""
    watch, warnings = SamplerGapWatch(SAMPLER_GAP_CEILING[config["dtype"]], FACTOR), 0
    for r in steps:
        try:
            warnings += watch.check(r["step"], r) is not None
        except RuntimeError:
            return warnings, r["step"]
    return warnings, None


def table(found):
    lines = ["| run | precision | engine | lr | steps | first 3 | median | largest (step, x first 3) | "
             "watch: warnings, stop | layer 0 drift at the end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, config, steps, drift in found:
        gaps = [r["sampler_gap"] for r in steps]
        first = sum(gaps[:3]) / 3
        top = max(range(len(gaps)), key=gaps.__getitem__)
        warnings, stop = replay(config, steps)
        lines.append(f"| {name} | {config['dtype']} | {config['backend']} | {config['lr']:g} | {len(gaps)} | "
                     f"{first:.2g} | {statistics.median(gaps):.2g} | {gaps[top]:.2g} ({steps[top]['step']}, "
                     f"{gaps[top] / first:.1f}x) | {warnings}, {'step ' + str(stop) if stop else 'none'} | "
                     + (f"{drift['differ'] / drift['of']:.0%} of elements, up to {drift['largest']:.2g} |" if drift
                        else "– |"))
    return "\n".join(lines) + "\n"


def figure(found, path):
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for name, config, steps, _ in found:
        faulty = name.startswith("faults")
        ax.plot([r["step"] for r in steps], [r["sampler_gap"] for r in steps], label=name, lw=1,
                ls="--" if faulty else "-", marker="." if faulty else None)
    ax.axhline(SAMPLER_GAP_CEILING["bfloat16"], color="k", ls="--", lw=1, label="bf16 ceiling (stop)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("sampler gap (mean |engine - trainer| log-prob per token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    found = runs(os.path.join("*", "runs", "*")) + runs(os.path.join("faults", "*"))
    open(os.path.join(HERE, "gaps.md"), "w").write(table(found))
    figure(found, os.path.join(HERE, "gaps.png"))
    print(table(found), end="")


if __name__ == "__main__":
    main()
