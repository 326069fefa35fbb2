"""What a model can do before any RL: each question set under each prompt of data.PROMPTS.

    python study/baseline.py --model models/smollm2-135m --out study/smollm          # about an hour on 2 cores

The question sets, each its first --limit questions:
- classroom: the classroom world's held-out split, asked of a chat model in plain English;
- gsm8k_2step: GSM8K's test questions whose worked solution has two lines, the fewest it has.

For each (set, prompt): greedy accuracy, avg@k and maj@k at --temperature (the training temperature:
what a group of samples gives a label-free reward to work with) and the share of responses with a
\\boxed{} answer, as eval.py grades them; beside them `last number`, the share of greedy responses whose
last number is the gold answer. That is not a grade the rewards use: it says how often the model
reaches the answer in some words of its own, what a warm-up that teaches only the boxed format could
at most reveal. Writes OUT/baseline.md (the table) and OUT/baseline.json.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)                                   # the loop's modules

import config  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402
from harness import data  # noqa: E402
from harness.answers import is_equiv  # noqa: E402
from eval import accuracies, eval_counts  # noqa: E402

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text):
    """The last number written in a text (thousands commas dropped; a sentence's full stop is not its), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def question_sets(limit):
    """{name: [(question, gold answer, whether it is a classroom question)]}."""
    classroom = [(p.original, p.answer, True) for p in data.classroom_pairs("test")[:limit]]
    records = data.json_records(os.path.join(data.DATA_DIR, data.BENCHMARKS["gsm8k"][0]))
    two_steps = [(r["question"], data.gsm8k_answer(r["answer"], "gsm8k"), False) for r in records
                 if len(r["answer"].split("####")[0].strip().splitlines()) == 2][:limit]
    return {"classroom": classroom, "gsm8k_2step": two_steps}


def measure(engine, tokenizer, questions, prompt, args):
    """The row of one (set, prompt)."""
    encoders = {classroom: data.prompt_encoder(tokenizer, classroom, prompt) for classroom in (False, True)}
    prompts = [encoders[classroom](q) for q, _, classroom in questions]
    gold = [a for _, a, _ in questions]
    sums, examples = eval_counts(engine, prompts, gold, args.k, args.temperature, args.max_tokens, args.seed,
                                 keep=len(questions))
    greedy = [e for e in examples if e["kind"] == "greedy"]
    last = sum(is_equiv(last_number(e["response"]), e["gold"]) for e in greedy) / len(greedy)
    return {"n": len(questions), **accuracies(sums, args.k), "last_number": last,
            "example": greedy[0]["response"]}


def table(rows, k):
    lines = [f"| set | prompt | n | greedy | avg@{k} | maj@{k} | boxed | last number |", "|---" * 8 + "|"]
    lines += [f"| {r['set']} | {r['prompt']} | {r['n']} | {r['greedy']:.3f} | {r['avg']:.3f} | {r['maj']:.3f} | "
              f"{r['boxed']:.3f} | {r['last_number']:.3f} |" for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=60, help="questions per set")
    ap.add_argument("--prompts", default=",".join(data.PROMPTS), help="comma-separated names of data.PROMPTS")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=config.BACKENDS, default="auto", help="the engine (train.py --backend)")
    args = ap.parse_args()
    from harness import checkpoint
    args.model = checkpoint.model_folder_for_all_ranks(args.model)
    from rollout import make_engine
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    sets = question_sets(args.limit)
    engine = make_engine(config.choose_backend(args.backend)[0], args.model, max_prompt_len=512,
                         max_response_len=args.max_tokens, dtype="float32",
                         **{k: config.PRESETS["classroom"][k] for k in ("cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib")})
    rows = []
    for name, questions in sets.items():
        for prompt in args.prompts.split(","):
            rows.append({"set": name, "prompt": prompt, **measure(engine, tokenizer, questions, prompt, args)})
            print(table(rows[-1:], args.k).splitlines()[-1], flush=True)
            os.makedirs(args.out, exist_ok=True)                   # partial results as they come
            with open(os.path.join(args.out, "baseline.json"), "w") as f:
                json.dump({"model": args.model, **{k: v for k, v in vars(args).items() if k != "model"},
                           "rows": rows}, f, indent=1)
    engine.close()
    with open(os.path.join(args.out, "baseline.md"), "w") as f:
        f.write(table(rows, args.k) + "\n")
    print(f"\n{table(rows, args.k)}\nwrote {args.out}/baseline.md and baseline.json")


if __name__ == "__main__":
    exit_on_usage_error(main, "baseline.py")
