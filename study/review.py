"""The study's statistics, seed first: each row's final evaluation over its seeds, every difference as a t interval over
seeds in one Holm family, the bootstrap beside it, a null comparison, the procedure's simulated false-positive rate, and
pass@k curves.

    python study/review.py study/seeded                      # OUT/review.md and OUT/passk.png, from what the runs hold
    python study/review.py study/reviewed --loss_base coreward1-mb4      # commit da4bcc6's five-seed study, re-judged
    python study/review.py study/seeded --evaluate_start 10  # first the start model on seeds 0-9 (OUT/start/)

The data: each run's RUN/eval/results.json (study.py --eval_k K: its final model, K samples a question at the evaluation
temperature on its own seed's evaluation streams, and the greedy response), and the start model's on the same streams,
OUT/start/sSEED/results.json. A row is a run folder's name without `_sSEED` (study.py).

The unit is the seed: a run's score is its avg@K (right samples / K, the mean over the questions: pass@1 at temperature
1), one number a seed. A difference A - B is paired where both rows ran the seed (the same training questions in the
same order, the same evaluation streams): the mean of the seeds' differences, its 95% interval mean ± t(0.975, n-1)
sd / √n and its two-sided p from Student's t with n - 1 degrees of freedom; over disjoint seeds it is Welch's. Beside
it, for comparison only, the bootstrap over seeds × questions of earlier versions of this file, which treats the
questions as a second source of noise: at five seeds it rejects more true nulls than its nominal 5% (the simulation).

The claims are one family (`design`): every comparison the tables make and pass@K against the start, declared before the
results (study/README.md). Each p is adjusted by Holm's step-down over the whole family, its comparisons not yet run
counted at p = 1, and a difference holds where the adjusted p is below 0.05 (its t interval then excludes 0). Where
only the unadjusted p is, it holds "unadjusted only" and is not claimed. Two checks stand outside the family: the null
comparison (the official setting, `coreward1`, on seeds 0-4 against 5-9, which must not separate), and the false-
positive rate of both procedures at 5%, simulated from the runs' own variance components (`simulated_fpr`).
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from eval import pass_at_k  # noqa: E402
from study import seeds_arg  # noqa: E402

DRAWS = 10_000          # bootstrap draws
ALPHA = 0.05
METHOD_ROWS = ["gt", "majority", "coreward1", "coreward2", "self_harmony", "restrain", "random", "matched_coin",
               "permuted", "wrong_label"]
LOSS_VARIANTS = ("gspo", "cispo", "cliphigh", "drgrpo", "tokenmean", "dapo")
CLIP_ONLY = ("cliphigh", "cispo")          # equal to the official loss where no clip binds
NOISE_ROWS = ["coreward1-noise0.25", "coreward1-noise0.5", "coreward1-noise1"]
NULL = ("coreward1", range(0, 5), range(5, 10))                 # the official setting on two disjoint sets of seeds
PASS_BASE = "start"


def design(loss_base="coreward1-clip"):
    """(tables, family): the tables, each (title, the row each is compared with, the rows, the runs' metrics shown
    beside: each the mean over a run's steps, then over the row's runs); and the family, every comparison they make and
    pass@K against the start. `loss_base`: the official loss in the regime where its clip binds (study/README.md)."""
    loss_rows = [f"{loss_base}.{v}" for v in LOSS_VARIANTS]
    tables = [
        ("Each method and control against the start model", "start", METHOD_ROWS, ["responses", "reward"]),
        ("Which label: each against Co-rewarding-I", "coreward1", [r for r in METHOD_ROWS if r != "coreward1"],
         ["responses", "reward"]),
        ("The loss family where the official clip binds: each against the official loss", loss_base, loss_rows,
         ["clip_frac", "rounds"]),
        ("DAPO against the official loss given as many rollouts", f"{loss_base}.rollouts2x", [f"{loss_base}.dapo"],
         ["clip_frac", "rounds", "responses"]),
        ("Bad rephrasings: Co-rewarding-I with a share of mismatched pairs against the clean run", "coreward1",
         NOISE_ROWS, ["label_acc", "reward"]),
    ]
    family = list(dict.fromkeys([(row, base) for _, base, rows, _ in tables for row in rows] +
                                [(f"pass:{row}", PASS_BASE) for row in METHOD_ROWS]))
    return tables, family


# --------------------------------------------------------------------------------------------
# Student's t, by hand (numpy has no distributions): the regularised incomplete beta by its continued fraction

def _betacf(a, b, x):
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > 1e-300 else 1e-300)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1 + num / c if abs(1 + num / c) > 1e-300 else 1e-300
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def betainc(a, b, x):
    """The regularised incomplete beta I_x(a, b)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_p(t, df):
    """The two-sided p of Student's t with df degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(q, df):
    """t such that P(T <= t) = q (q > 1/2), by bisection on t_p."""
    low, high = 0.0, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_p(mid, df) / 2 > 1 - q else (low, mid)
    return (low + high) / 2


# --------------------------------------------------------------------------------------------
# Differences: over seeds (the claim), and over seeds x questions (shown beside)

def paired_t(d):
    """(mean, low, high, p, n) of the seeds' differences d [n]: the t interval at 95% and the two-sided p."""
    n, mean = len(d), float(np.mean(d))
    if n < 2:
        return mean, None, None, None, n
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    p = 1.0 if se == 0 and mean == 0 else 0.0 if se == 0 else t_p(mean / se, n - 1)
    return mean, mean - half, mean + half, p, n


def welch_t(a, b):
    """(mean, low, high, p, n) of mean(a) - mean(b) over disjoint seeds: Welch's t and its Satterthwaite df."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    mean, se = float(np.mean(a) - np.mean(b)), math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.975, df) * se
    return mean, mean - half, mean + half, t_p(mean / se, df), len(a) + len(b)


def bootstrap(diff, seed=0, draws=DRAWS):
    """(mean, low, high, p) of a paired difference diff [S, Q], resampling seeds and questions, both with replacement:
    the percentile interval, and p twice the share of draws on the far side of 0 (at least 2 / draws)."""
    rng = np.random.default_rng(seed)
    s, q = diff.shape
    seeds = rng.multinomial(s, [1 / s] * s, size=draws)             # [draws, S] how often each seed is drawn
    questions = rng.multinomial(q, [1 / q] * q, size=draws)         # [draws, Q]
    means = np.einsum("bs,sq,bq->b", seeds, diff, questions) / (s * q)
    low, high = np.percentile(means, [2.5, 97.5])
    p = max(2 * min((means <= 0).mean(), (means >= 0).mean()), 2 / draws)
    return float(diff.mean()), float(low), float(high), float(min(p, 1.0))


def holm(ps):
    """Holm's step-down adjustment of `ps` (None: a comparison not run, counted at p = 1): the i-th smallest of m is
    multiplied by m - i (i from 0), made non-decreasing in that order, and capped at 1."""
    order = sorted((1.0 if p is None else p, i) for i, p in enumerate(ps))
    adjusted, running = [None] * len(ps), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * p))
        adjusted[i] = running if ps[i] is not None else None
    return adjusted


def verdict(diff, adjusted):
    """What a difference says: holds (Holm-adjusted p < 0.05), unadjusted only (its own p), or not separated."""
    if diff[3] is None:
        return "pending: one seed"
    if adjusted is not None and adjusted < ALPHA:
        return "holds"
    return "unadjusted only" if diff[3] < ALPHA else "not separated"


# --------------------------------------------------------------------------------------------
# The runs

def evaluations(out):
    """(K, {row: {seed: per-question array [Q, 2] (right of K, greedy)}}), of the runs and the start model."""
    rows, ks = {}, set()
    paths = glob.glob(os.path.join(out, "runs", "*_s*", "eval", "results.json")) + \
        glob.glob(os.path.join(out, "start", "s*", "results.json"))
    for path in sorted(paths):
        match = re.search(r"([^/]+)_s(\d+)/eval/results\.json$", path) or re.search(r"(start)/s(\d+)/results\.json$",
                                                                                    path)
        result = json.load(open(path))
        ks.add(result["k"])
        rows.setdefault(match.group(1), {})[int(match.group(2))] = np.array(
            result["results"]["classroom"]["per_question"], dtype=float)
    if len(ks) > 1:
        sys.exit(f"{out}: the evaluations hold {sorted(ks)} samples a question: evaluate every run with one k")
    return (ks.pop() if ks else None), rows


def metric_mean(out, row, seeds, key):
    """The mean over a row's runs of `seeds` of the mean of `key` over their steps (metrics.jsonl; None: not logged)."""
    means = []
    for seed in seeds:
        path = os.path.join(out, "runs", f"{row}_s{seed}", "metrics.jsonl")
        values = [r[key] for r in map(json.loads, open(path)) if r.get(key) is not None] if os.path.exists(path) else []
        means += [np.mean(values)] if values else []
    return float(np.mean(means)) if means else None


def score(array, k):
    """A run's per-question score [Q]: avg@k (right / k)."""
    return array[:, 0] / k


def reach(array, k):
    """A run's per-question pass@k [Q], by the unbiased estimator (eval.pass_at_k)."""
    return np.array([pass_at_k(k, int(c), k) for c in array[:, 0]])


def compare(rows, row, base, k):
    """(t difference, bootstrap) of row - base over their common seeds: a comparison of the family (pass:ROW: pass@k)."""
    measure = reach if row.startswith("pass:") else score
    a, b = rows.get(row.removeprefix("pass:"), {}), rows.get(base, {})
    common = sorted(set(a) & set(b))
    if not common:
        return None, None
    per_question = np.stack([measure(a[s], k) - measure(b[s], k) for s in common])        # [S, Q]
    return paired_t(per_question.mean(1)), bootstrap(per_question)


def interval(diff):
    mean, low, high = diff[:3]
    return f"{mean:+.3f}" if low is None else f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def family_results(rows, k, family):
    """{(row, base): (t difference, bootstrap, Holm-adjusted p)} over the family's comparisons, those run."""
    results = {pair: compare(rows, *pair, k) for pair in family}
    adjusted = holm([t[3] if t is not None else None for t, _ in results.values()])
    return {pair: (t, boot, p) for (pair, (t, boot)), p in zip(results.items(), adjusted) if t is not None}


def tables(out, rows, k, design_tables, family):
    """review.md's tables: each row's score over its seeds, and its difference from the table's base."""
    lines = []
    for title, base, names, extras in design_tables:
        shown = [n for n in names if n in rows]
        if not shown or base not in rows:                  # nothing to compare yet
            continue
        head = ["row", "seeds", f"avg@{k} [seeds' range]"] + extras + \
            [f"Δ vs `{base}` [95% t]", "p", "Holm", "bootstrap seeds × questions", "verdict"]
        lines += [f"### {title}", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        binds = metric_mean(out, base, rows[base], "clip_frac")
        for name in [base] + shown:
            runs = rows[name]
            per_seed = [score(runs[s], k).mean() for s in sorted(runs)]
            same = name.rsplit(".", 1)[-1] in CLIP_ONLY and binds is not None and binds < 0.01
            cells = [f"`{name}`" + (" (the official loss by construction here: clip_frac < 0.01)" if same else ""),
                     str(len(runs)), f"{np.mean(per_seed):.3f} [{min(per_seed):.3f}–{max(per_seed):.3f}]"]
            cells += ["–" if v is None else f"{v:.0f}" if key == "responses" else f"{v:.3f}"
                      for key, v in ((key, metric_mean(out, name, runs, key)) for key in extras)]
            if name == base or (name, base) not in family:
                cells += ["–"] * 5
            else:
                t, boot, adjusted = family[name, base]
                cells += [interval(t), "–" if t[3] is None else f"{t[3]:.4f}",
                          "–" if adjusted is None else f"{adjusted:.4f}", interval(boot), verdict(t, adjusted)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def null_lines(rows, k):
    """The null comparison: the official setting on two disjoint sets of seeds (Welch), which must not separate."""
    row, first, second = NULL
    runs = rows.get(row, {})
    a, b = [score(runs[s], k).mean() for s in first if s in runs], [score(runs[s], k).mean() for s in second if s in runs]
    title = f"### The null comparison: `{row}` on seeds {first[0]}–{first[-1]} against {second[0]}–{second[-1]}"
    if len(a) < 2 or len(b) < 2:
        return f"{title}\n\npending: {len(a)} and {len(b)} seeds run.\n"
    mean, low, high, p, _ = welch_t(np.array(a), np.array(b))
    said = "separated: the procedure found a difference where there is none" if p < ALPHA else "not separated"
    return (f"{title}\n\nWelch's t over {len(a)} and {len(b)} seeds: {mean:+.3f} [{low:+.3f}, {high:+.3f}], "
            f"p {p:.4f}: {said}.\n")


# --------------------------------------------------------------------------------------------
# The false-positive rate, simulated from the runs' own variance components

def variance_components(rows, k):
    """(seed variance of a run's score, [Q] each question's residual variance): a two-way analysis of each row of the
    method table over its seeds x questions, pooled: MS_seed = Q Σ(m_s - m)^2 / (S - 1), the residual per question
    the mean square of x_sq - m_s - m_q + m over the seeds."""
    seed_parts, residuals = [], []
    for name in METHOD_ROWS:                               # trained rows: the start model has no training seed
        runs = rows.get(name, {})
        if len(runs) < 3:
            continue
        x = np.stack([score(runs[s], k) for s in sorted(runs)])                              # [S, Q]
        s, q = x.shape
        rest = x - x.mean(1, keepdims=True) - x.mean(0, keepdims=True) + x.mean()
        residuals.append((rest ** 2).sum(0) / (s - 1))                                        # [Q]
        seed_parts.append(max(np.var(x.mean(1), ddof=1) - residuals[-1].mean() / q, 0.0))
    if not seed_parts:
        return None
    return float(np.mean(seed_parts)), np.mean(residuals, 0)


def simulated_fpr(seed_var, question_var, seeds, sims=2000, draws=1000, rng_seed=0):
    """(paired t, bootstrap): the share of `sims` simulated true nulls each rejects at 5%. A run's score on question q
    is its seed's offset (variance seed_var) plus noise (variance question_var[q]); two rows with no difference are
    compared over `seeds` seeds, paired as the study pairs them. The bootstrap's resampling weights are drawn once
    and serve every simulation (they do not depend on the data)."""
    rng = np.random.default_rng(rng_seed)
    q = len(question_var)
    crit = t_quantile(0.975, seeds - 1)
    w_s = rng.multinomial(seeds, [1 / seeds] * seeds, size=draws).astype(float)               # [draws, S]
    w_q = rng.multinomial(q, [1 / q] * q, size=draws).astype(float)                           # [draws, Q]
    rejected_t = rejected_boot = 0
    for _ in range(sims):
        diff = (rng.normal(0, math.sqrt(2 * seed_var), (seeds, 1)) +
                rng.normal(0, 1, (seeds, q)) * np.sqrt(2 * question_var))                      # [S, Q]
        d = diff.mean(1)
        rejected_t += abs(d.mean()) > crit * d.std(ddof=1) / math.sqrt(seeds)
        means = ((w_q @ diff.T) * w_s).sum(1) / (seeds * q)                                   # [draws]
        low, high = np.percentile(means, [2.5, 97.5])
        rejected_boot += low > 0 or high < 0
    return rejected_t / sims, rejected_boot / sims


def fpr_lines(rows, k):
    components = variance_components(rows, k)
    if components is None:
        return "### The false-positive rate at 5%\n\npending: no method has three seeds.\n"
    seed_var, question_var = components
    lines = ["### The false-positive rate at 5%, simulated", "",
             f"From the method table's runs: a run's score varies over seeds with sd {math.sqrt(seed_var):.4f} beyond "
             f"its questions' noise (each question's residual sd over seeds, mean {np.sqrt(question_var).mean():.4f}). "
             f"Two rows with no difference, 2,000 times:", "",
             "| seeds | paired t over seeds | bootstrap over seeds × questions |", "|---|---|---|"]
    for seeds in (5, 10):
        t_rate, boot_rate = simulated_fpr(seed_var, question_var, seeds)
        lines.append(f"| {seeds} | {t_rate:.3f} | {boot_rate:.3f} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# pass@k

def pass_ks(k):
    return [2 ** i for i in range(int(math.log2(k)) + 1)]


def pass_curves(rows, k):
    """{row: [pass@j for j in pass_ks(k)]}: the mean over seeds and questions of the unbiased estimate."""
    return {name: [np.mean([pass_at_k(k, int(c), j) for s in rows[name] for c in rows[name][s][:, 0]])
                   for j in pass_ks(k)] for name in [PASS_BASE] + METHOD_ROWS if name in rows}


def reach_lines(curves, k, family):
    """Whether RL narrows what the model reaches: each row's pass@k against the start's, in the family."""
    ks = pass_ks(k)
    lines = [f"### pass@k, k = 1 to {k} ([passk.png](passk.png)): does RL narrow what the model reaches?", "",
             "| row | " + " | ".join(f"pass@{j}" for j in ks) + f" | Δ pass@{k} vs `start` [95% t] | p | "
             "Holm | bootstrap | verdict |", "|---" * (len(ks) + 6) + "|"]
    for name, values in curves.items():
        cells = [f"`{name}`"] + [f"{v:.3f}" for v in values]
        if (f"pass:{name}", PASS_BASE) in family:
            t, boot, adjusted = family[f"pass:{name}", PASS_BASE]
            cells += [interval(t), "–" if t[3] is None else f"{t[3]:.4f}",
                      "–" if adjusted is None else f"{adjusted:.4f}", interval(boot), verdict(t, adjusted)]
        else:
            cells += ["–"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(curves, k, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, values in curves.items():
        ax.plot(pass_ks(k), values, marker="o", markersize=3, label=name,
                linestyle="--" if name in ("start", "random", "matched_coin", "permuted", "wrong_label") else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(pass_ks(k), [str(j) for j in pass_ks(k)])
    ax.set_xlabel("k (samples a question)")
    ax.set_ylabel("pass@k, classroom test set")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def evaluate_start(out, seeds, k):
    """The start model on the evaluation streams of `seeds`, into OUT/start/sSEED."""
    from harness import world
    for seed in seeds:
        folder = os.path.join(out, "start", f"s{seed}")
        if not os.path.exists(os.path.join(folder, "results.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--model", world.base_model_dir(), "--k",
                            str(k), "--seed", str(seed), "--per_question", "--out", folder], check=True)


def review(out, loss_base="coreward1-clip"):
    """review.md's text and the pass@k curves of the study in `out`."""
    k, rows = evaluations(out)
    if not rows:
        sys.exit(f"no run in {out} has its evaluation (RUN/eval/results.json) yet")
    design_tables, family = design(loss_base)
    results = family_results(rows, k, family)
    curves = pass_curves(rows, k)
    text = "\n".join([f"The family: {len(family)} comparisons, {len(results)} of them run; Holm's adjustment over all "
                      f"{len(family)}, those not run at p = 1.\n", tables(out, rows, k, design_tables, results),
                      reach_lines(curves, k, results), null_lines(rows, k), fpr_lines(rows, k)])
    return text, curves, k


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the study's folder (its runs/ and start/)")
    ap.add_argument("--evaluate_start", type=seeds_arg, default=[], metavar="SEEDS",
                    help="first evaluate the start model on the evaluation streams of these seeds: N (0 to N-1), A-B "
                         "or a list")
    ap.add_argument("--k", type=int, default=256, help="with --evaluate_start: samples a question")
    ap.add_argument("--loss_base", default="coreward1-clip",
                    help="the loss table's official row; its variants are LOSS_BASE.gspo, ... (study/README.md)")
    args = ap.parse_args(argv)
    if args.evaluate_start:
        evaluate_start(args.out, args.evaluate_start, args.k)
    text, curves, k = review(args.out, args.loss_base)
    plot(curves, k, os.path.join(args.out, "passk.png"))
    with open(os.path.join(args.out, "review.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
