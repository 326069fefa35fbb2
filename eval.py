"""Evaluation: greedy accuracy, avg@k, maj@k and pass@k of a model on held-out questions.

    greedy   one response at temperature 0 (the official scripts validate with greedy on the 5,000 MATH test questions)
    avg@k    the share of k samples that are right, averaged over questions: pass@1 at the temperature, estimated from k
    maj@k    the majority answer of those k responses is right
    pass@j   the chance that at least one of j responses is right, for j = 1, 2, 4, ... below k and k itself,
             estimated without bias from the k (Chen et al. 2021); pass@1 is avg@k
    boxed    the share of all 1 + k responses with a final answer (a \\boxed{}), the format the rewards read

The paper's metrics (Appendix C.3, Table 5): MATH500 and GSM8K pass@1 (lighteval), AMC avg@8 (ttrl), at temperature
0.8. `--paper` measures all three as avg@8 (pass@1's expectation, with less variance) at the official preset's
settings (its tokens: the training limit; the paper states none), beside Table 8's values for Qwen3-4B-Base on OpenRS.

    python eval.py --model runs/coreward1/final          # the classroom test split
    python eval.py --model runs/coreward1/checkpoints/step_40      # a training checkpoint
    python eval.py --model runs/coreward1-Qwen3-4B-Base/final --paper   # the paper's Table 8 metrics

A model is evaluated as its training evaluated it: a flag left out takes its setting's value in the preset of the
model's run (`preset_of`). Benchmarks: `classroom` and harness/data.py's math500, gsm8k, amc, amc23, aime24, aime25,
math5000. A training checkpoint is first written out as a temporary model folder (checkpoint.to_hf).
"""
import argparse
import hashlib
import json
import math
import os
import re
import tempfile
import time

import config
from harness import checkpoint, data, world
from harness.errors import FolderInUse, exit_on_usage_error
from harness.answers import extract_answer, is_equiv, majority_vote

# (flag, setting, argparse options, help): eval.py's flags that default to their setting's value in the model's preset
AS_IN_TRAINING = [
    ("benchmarks", "eval_data", {}, "comma-separated benchmark names"),
    ("k", "eval_k", dict(type=int), "samples per question beside the greedy one (0: greedy only)"),
    ("temperature", "eval_temperature", dict(type=float), "the samples' temperature"),
    ("max_tokens", "max_response_len", dict(type=int), "response tokens at most"),
    ("seed", "seed", dict(type=int), "seeds each question's samples (rollout.request_seed)"),
    ("backend", "backend", dict(choices=config.BACKENDS), "the engine: vllm, transformers' generate (hf), or auto"),
    ("dtype", "dtype", dict(choices=config.DTYPES), "the engine's dtype"),
    ("gpu_memory_utilization", "gpu_memory_utilization", dict(type=float), "the share of the GPU vLLM takes"),
]
PAPER_BENCHMARKS = {"math500": "MATH500 pass@1", "gsm8k": "GSM8K pass@1", "amc": "AMC avg@8"}
PAPER_K = 8                                                         # --paper's samples: avg@8
# The paper's Table 8 (p. 21), Qwen3-4B-Base trained on OpenRS, in percent: MATH500 / GSM8K / AMC.
PAPER_TABLE8 = {"before RL": (71.20, 26.15, 21.08), "gt": (78.80, 85.22, 49.55),
                "self_certainty": (73.20, 33.43, 35.84), "entropy": (76.80, 87.57, 42.62),
                "majority": (76.00, 64.14, 44.58), "coreward1": (72.80, 83.93, 39.41),
                "coreward2": (76.60, 89.23, 42.32)}


def pass_at_k(n, c, k):
    """pass@k of a question with n samples, c of them right: 1 - C(n - c, k) / C(n, k), the unbiased estimator of
    Chen et al. (2021, Codex), in their product form 1 - prod_{i = n - c + 1}^{n} (1 - k / i); 1.0 when n - c < k."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (k of the n samples), got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n (c right of the n samples), got c={c}, n={n}")
    return 1.0 if n - c < k else 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_ks(k):
    """The j of the pass@j reported with k samples: the powers of two below k, and k (k = 5: 1, 2, 4, 5)."""
    return [2 ** e for e in range(k.bit_length()) if 2 ** e < k] + ([k] if k >= 1 else [])


def eval_counts(engine, prompt_ids, gold, k, temperature, max_tokens, seed, indices=None, keep=0, tally=None):
    """(sums, examples) over this share of the questions; sums, not means, so that ranks' shares add up. examples: the
    first `keep` questions' greedy response and first sample, with answer, gold and 0/1 reward (samples.jsonl). `tally`,
    a list, gets each question's [right ones of the k samples, greedy right (0/1)] (eval.py --per_question). Question i
    (`indices`: places in the benchmark, default 0, 1, ...) samples with rollout.request_seed(seed, "eval", 0, i),
    without the step: evaluations differ by the model alone, and a share gives what the whole would."""
    from rollout import request_seed
    indices = range(len(prompt_ids)) if indices is None else indices
    seeds = [request_seed(seed, "eval", 0, i) for i in indices]
    greedy = engine.generate(prompt_ids, n=1, temperature=0.0, max_tokens=max_tokens)
    sampled = engine.generate(prompt_ids, n=k, temperature=temperature, max_tokens=max_tokens, seeds=seeds) if k else \
        [[] for _ in prompt_ids]                  # k = 0: greedy only, as the official scripts validate
    sums, examples = {"n": len(gold), "greedy": 0.0, "avg": 0.0, "maj": 0.0, "boxed": 0.0}, []
    if k:                   # the same keys on every rank: harness.sharding.all_sum adds them up
        sums.update({"pass": 0.0, **{f"pass@{j}": 0.0 for j in pass_ks(k)}})
    for place, (i, g, group, answer) in enumerate(zip(indices, greedy, sampled, gold)):
        answers, first = [extract_answer(s.text) for s in group], extract_answer(g[0].text)
        sums["greedy"] += is_equiv(first, answer)
        sums["boxed"] += sum(a is not None for a in [first] + answers)
        right = sum(is_equiv(a, answer) for a in answers)
        if tally is not None:
            tally.append([right, int(is_equiv(first, answer))])
        sums["avg"] += right / max(k, 1)
        sums["maj"] += bool(answers) and is_equiv(majority_vote(answers), answer)
        if k:
            sums["pass"] += pass_at_k(k, right, k)
            for j in pass_ks(k):
                sums[f"pass@{j}"] += pass_at_k(k, right, j)
        if place < keep:
            for kind, s in [("greedy", g[0])] + [("sample", s) for s in group[:1]]:
                extracted = extract_answer(s.text)
                examples.append({"question": i, "kind": kind, "prompt_ids": list(s.prompt_ids), "response": s.text,
                                 "answer": extracted, "gold": answer, "reward": float(is_equiv(extracted, answer))})
    return sums, examples


def accuracies(sums, k):
    """Fractions of the sums, boxed over all n * (1 + k) responses; at k = 0 avg and maj are None, no pass@j."""
    n, sampled = max(sums["n"], 1), k > 0
    fractions = {"greedy": sums["greedy"] / n, "avg": sums["avg"] / n if sampled else None,
                 "maj": sums["maj"] / n if sampled else None, "boxed": sums["boxed"] / (n * (1 + k))}
    if sampled:
        fractions.update({key: sums[key] / n for key in ["pass"] + [f"pass@{j}" for j in pass_ks(k)]})
    return fractions


def benchmark_prompts(tokenizer, name, limit=None, max_prompt_len=None, prompt="official"):
    """Prompt ids and gold answers of a benchmark ('classroom' or in data.BENCHMARKS) in the training prompt format."""
    encode = data.prompt_encoder(tokenizer, name == "classroom", prompt)
    if name == "classroom":
        pairs = [(encode(p.original), p.answer) for p in data.classroom_pairs("test")[:limit]]
    else:
        pairs = [(encode(p.question), p.answer) for p in data.load_benchmark(name, limit)]
    if max_prompt_len is not None:
        pairs = data.drop_long(pairs, lambda pair: [pair[0]], max_prompt_len, f"{name} questions")
    return [p for p, _ in pairs], [g for _, g in pairs]


def markdown_table(results, k):
    """The results as a markdown table: a row per benchmark; the pass@j of pass_ks(k) after maj@k (none at k = 0)."""
    passes = [f"pass@{j}" for j in pass_ks(k)]
    lines = [f"| benchmark | n | greedy | avg@{k} | maj@{k} | " + "".join(f"{p} | " for p in passes) + "boxed |",
             "|---" * (6 + len(passes)) + "|"]
    shown = lambda value: "–" if value is None else f"{value:.3f}"         # avg@k and maj@k at k = 0
    lines += [f"| {name} | {r['n']} | {shown(r['greedy'])} | {shown(r['avg'])} | {shown(r['maj'])} | "
              + "".join(f"{shown(r[p])} | " for p in passes) + f"{shown(r['boxed'])} |" for name, r in results.items()]
    return "\n".join(lines)


def paper_lines(results):
    """The paper's metrics of `results` (eval.py --paper), each beside Table 8's values."""
    lines = ["| metric | this model | " + " | ".join(PAPER_TABLE8) + " |", "|---|---|" + "---|" * len(PAPER_TABLE8)]
    for column, (name, metric) in enumerate(PAPER_BENCHMARKS.items()):
        paper = " | ".join(f"{row[column]:.2f}" for row in PAPER_TABLE8.values())
        lines.append(f"| {metric} | {100 * results[name]['avg']:.2f} | {paper} |")
    return "\n".join(lines)


def default_out(model):
    """runs/eval/ + the model's path (`/` as `_`) + a hash of its absolute path: a folder per model, always the same."""
    path = os.path.abspath(model)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.normpath(model)).strip("._") or "model"
    return os.path.join("runs", "eval", f"{readable[-80:]}-{hashlib.sha1(path.encode()).hexdigest()[:8]}")


def preset_of(model):
    """The preset of `model`'s training: a checkpoint's run's, classroom for the base model, else config.preset_of's."""
    if checkpoint.is_checkpoint(model):
        return checkpoint.read_config(model).get("preset", "classroom")
    base = os.path.realpath(os.path.expanduser(model)) == os.path.realpath(world.BASE_DIR)
    return "classroom" if base else config.preset_of(model)[0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="a model folder (the classroom's base model: classroom/base), a Hugging Face id, or a "
                         "training checkpoint (OUT/checkpoints/step_S)")
    ap.add_argument("--preset", choices=list(config.PRESETS), help="whose settings (default: the model's, preset_of)")
    for flag, name, options, help in AS_IN_TRAINING:
        ap.add_argument(f"--{flag}", help=f"{help} (default: the preset's --{name}{config.values_of(name)})", **options)
    ap.add_argument("--limit", type=int, help="the first N questions of each benchmark")
    ap.add_argument("--prompt", choices=list(data.PROMPTS), default="official",
                    help="how a question is asked (data.PROMPTS; the classroom's own tokenizer has its format)")
    ap.add_argument("--out", help="folder for results.md and results.json (default: runs/eval/ + the model's path + "
                                  "a hash of it)")
    ap.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    ap.add_argument("--per_question", action="store_true",
                    help="results.json also holds each question's [right ones of the k samples, greedy right]")
    ap.add_argument("--paper", action="store_true",
                    help=f"the paper's metrics: {', '.join(PAPER_BENCHMARKS)}, k {PAPER_K}, with the official preset's "
                         f"settings, beside its Table 8")
    args = ap.parse_args(argv)
    if args.paper:
        args.benchmarks, args.k = ",".join(PAPER_BENCHMARKS), PAPER_K
    args.preset = args.preset or ("official" if args.paper else preset_of(args.model))
    for flag, name, *_ in AS_IN_TRAINING:
        if getattr(args, flag) is None:
            setattr(args, flag, config.PRESETS[args.preset][name])
    args.backend, _ = config.choose_backend(args.backend)
    args.benchmarks = args.benchmarks.split(",")
    return args


def main(argv=None):
    args = parse_args(argv)
    out = args.out or default_out(args.model)
    if os.path.exists(os.path.join(out, "results.json")) and not args.overwrite:
        raise FolderInUse(f"{out} already holds results (results.json); pass --overwrite to replace them, or --out "
                          f"another folder. Nothing was run")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = checkpoint.to_hf(args.model, tmp) if checkpoint.is_checkpoint(args.model) else args.model
        results = evaluate_model(model_dir, args)
    table = markdown_table(results, args.k)
    print(f"\n{args.model}, k={args.k}, temperature {args.temperature}, max_tokens {args.max_tokens}\n\n{table}")
    if args.paper:
        paper = "The paper's metrics (%), beside its Table 8 (Qwen3-4B-Base on OpenRS):\n\n" + paper_lines(results)
        print(f"\n{paper}")
        table += "\n\n" + paper
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({**vars(args), "results": results}, f, indent=1)   # the model first: --model is the first flag
    print(f"wrote {out}/results.md and results.json")
    return results


def evaluate_model(model_dir, args):
    """The results of the model in `model_dir` (a folder or a Hugging Face id) on args.benchmarks."""
    from transformers import AutoTokenizer
    from rollout import make_engine
    model_dir = checkpoint.model_folder_for_all_ranks(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sets = {name: benchmark_prompts(tokenizer, name, args.limit, prompt=args.prompt) for name in args.benchmarks}
    longest, preset = max(len(p) for prompts, _ in sets.values() for p in prompts), config.PRESETS[args.preset]
    engine = make_engine(args.backend, model_dir, max_prompt_len=longest, max_response_len=args.max_tokens,
                         dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                         cpu_kv_cache_gib=preset["cpu_kv_cache_gib"], hf_kv_budget_gib=preset["hf_kv_budget_gib"])
    results = {}
    for name, (prompts, gold) in sets.items():
        t0, tally = time.perf_counter(), ([] if args.per_question else None)
        sums, _ = eval_counts(engine, prompts, gold, args.k, args.temperature, args.max_tokens, args.seed, tally=tally)
        results[name] = {"n": len(gold), **accuracies(sums, args.k), "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {results[name]}")
        if tally is not None:
            results[name]["per_question"] = tally
    engine.close()
    return results


if __name__ == "__main__":
    exit_on_usage_error(main, "eval.py")
