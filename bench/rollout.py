"""The default run's rollout and evaluation through vLLM, timed with the engine's settings varied, and each
variant's samples compared bit for bit with the project's: what detokenizing cost, and what else was tried.

    python bench/rollout.py                 # about 4 minutes: each variant in a process of its own, in turn, twice
    python bench/rollout.py --rounds 3 --variants now,detokenized

A variant is one process: the classroom engine as train.py builds it (rollout.make_engine), then, six times, a
rollout of the default run's shape (16 training pairs x 2 views x G=8 at temperature 1.0, seeded as train.py seeds
step 1's) and one evaluation (the default run's 200 test questions: greedy, then 8 samples each, as
eval.eval_counts asks). The first
of the six is left out of the medians (vLLM compiles its sampler's kernels then).
- now: rollout.VLLMEngine.generate as it is (vLLM returns token ids; response_texts decodes them);
- detokenized: with vLLM's detokenizer on (`SamplingParams(detokenize=True)`), as the engine sampled before (the
  texts then decoded a second time by response_texts, which costs little);
- flat_logprobs: `SamplingParams(flat_logprobs=True)`, vLLM's log-probs in flat arrays instead of a dict a token;
- budget_16384: `max_num_batched_tokens=16384` instead of 2,048 (a rollout's 32 prompts in one engine step).
The variants alternate within each round, so that the machine's drift falls on all alike. Each variant's token ids,
log-probs and texts are compared with those of "now" in the same round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# each variant's changes: (to SamplingParams, to the engine's arguments)
VARIANTS = {"now": ({}, {}), "detokenized": ({"detokenize": True}, {}),
            "flat_logprobs": ({"flat_logprobs": True}, {}), "budget_16384": ({}, {"max_num_batched_tokens": 16384})}


def measure(variant, repeats=6):
    """{rollout: [s], eval: [s], samples: (ids, log-probs, texts) of the first round} of one variant, here."""
    import vllm
    from config import PRESETS
    from harness import data, vllm_setup
    import rollout
    from harness import world
    from eval import benchmark_prompts
    from rollout import request_seed
    params_change, engine_change = VARIANTS[variant]
    arguments, sampling_params = vllm_setup.engine_arguments, vllm.SamplingParams
    vllm_setup.engine_arguments = lambda *a, **k: {**arguments(*a, **k), **engine_change}
    engine = rollout.make_engine("vllm", world.BASE_DIR, 64, 48, **{name: PRESETS["classroom"][name] for name in (
        "dtype", "cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib")})
    # VLLMEngine.generate imports it at each call; vLLM's own modules hold the class from their import
    vllm.SamplingParams = lambda **k: sampling_params(**{**k, **params_change})
    encode = data.prompt_encoder(engine.tokenizer, classroom=True)
    pairs = data.classroom_pairs("train")[:16]
    prompts = [encode(q.original) for q in pairs] + [encode(q.rephrased) for q in pairs]
    seeds = [request_seed(0, "policy", 1, i, view) for view in (0, 1) for i in range(16)]
    test, _ = benchmark_prompts(engine.tokenizer, "classroom", limit=200)
    eval_seeds = [request_seed(0, "eval", 0, i) for i in range(200)]
    times, samples = {"rollout": [], "eval": []}, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, 8, 1.0, 48, seeds=seeds)
        t1 = time.perf_counter()
        groups += engine.generate(test, 1, 0.0, 48) + engine.generate(test, 8, 1.0, 48, seeds=eval_seeds)
        times["rollout"].append(t1 - t0)
        times["eval"].append(time.perf_counter() - t1)
        samples = samples or [[s.token_ids, s.logprobs, s.text] for g in groups for s in g]
    engine.close()
    return {**times, "samples": samples}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"'now' first, then any of {', '.join(VARIANTS)}")
    ap.add_argument("--worker", help=argparse.SUPPRESS)            # internal: measure one variant, print JSON
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker)))
        return
    variants = args.variants.split(",")
    if variants[0] != "now" or not set(variants) <= set(VARIANTS):
        ap.error(f"--variants: 'now' first, then any of {', '.join(VARIANTS)}")
    runs = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for v in variants:
            res = subprocess.run([sys.executable, __file__, "--worker", v], capture_output=True, text=True)
            if res.returncode:
                sys.exit(f"variant {v!r} failed:\n{res.stderr[-3000:]}")
            runs[v].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}, {v}: rollout {statistics.median(runs[v][-1]['rollout'][1:]):.3f} s, "
                  f"evaluation {statistics.median(runs[v][-1]['eval'][1:]):.3f} s", flush=True)
    print("\n| variant | rollout, s | evaluation, s | rollout / now, by round | evaluation / now, by round | "
          "the same token ids, log-probs, texts as now |\n|---|---|---|---|---|---|")
    for v in variants:
        med = {k: [statistics.median(run[k][1:]) for run in runs[v]] for k in ("rollout", "eval")}
        ratios = {k: [a / b for a, b in zip(med[k], [statistics.median(r[k][1:]) for r in runs["now"]])]
                  for k in med}
        same = [all(all(x[i] == y[i] for x, y in zip(run["samples"], base["samples"])) for run, base in
                    zip(runs[v], runs["now"])) for i in range(3)]
        print(f"| {v} | {statistics.median(med['rollout']):.3f} | {statistics.median(med['eval']):.3f} | "
              + " | ".join(", ".join(f"{x:.2f}" for x in ratios[k]) for k in ("rollout", "eval"))
              + " | " + ", ".join("yes" if x else "no" for x in same) + " |")


if __name__ == "__main__":
    main()
