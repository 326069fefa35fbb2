"""Evaluation: greedy accuracy, mean@k and maj@k of a model on held-out questions.

    greedy   one response at temperature 0, graded against the ground truth
    mean@k   k responses at the sampling temperature; the fraction that is right, averaged over
             questions (the paper's avg@k, an estimate of pass@1 at that temperature)
    maj@k    the majority answer of those k responses is right

`eval_counts` returns sums, not means, so that ranks evaluating disjoint shares of the
questions can add them up; `accuracies` turns the sums into fractions.

    python eval.py --model runs/coreward1/final          # the classroom test split
"""
import argparse

from rewards import extract_answer, is_equiv, majority_vote


def eval_counts(engine, prompt_ids, gold, k=8, temperature=1.0, max_tokens=64):
    """Sums over this share of the questions: {"n", "greedy", "mean", "maj"}."""
    greedy = engine.generate(prompt_ids, n=1, temperature=0.0, max_tokens=max_tokens)
    sampled = engine.generate(prompt_ids, n=k, temperature=temperature, max_tokens=max_tokens)
    sums = {"n": len(gold), "greedy": 0.0, "mean": 0.0, "maj": 0.0}
    for g, group, answer in zip(greedy, sampled, gold):
        answers = [extract_answer(s.text) for s in group]
        sums["greedy"] += is_equiv(extract_answer(g[0].text), answer)
        sums["mean"] += sum(is_equiv(a, answer) for a in answers) / k
        sums["maj"] += is_equiv(majority_vote(answers), answer)
    return sums


def accuracies(sums):
    n = max(sums["n"], 1)
    return {"greedy": sums["greedy"] / n, "mean": sums["mean"] / n, "maj": sums["maj"] / n}


def classroom_test_prompts(tokenizer, limit=None):
    import world
    problems = world.make_split("test")[:limit]
    return [tokenizer(world.format_prompt(p.original))["input_ids"] for p in problems], [p.answer for p in problems]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a saved model folder (default: the classroom base model)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import world
    from rollout import make_engine
    model = args.model or world.base_model_dir()
    engine = make_engine(args.backend, model, max_prompt_len=128, max_response_len=args.max_tokens, seed=args.seed)
    prompts, gold = classroom_test_prompts(engine.tokenizer)
    acc = accuracies(eval_counts(engine, prompts, gold, args.k, args.temperature, args.max_tokens))
    print(f"\n| model | questions | greedy | mean@{args.k} | maj@{args.k} |\n|---|---|---|---|---|\n"
          f"| {model} | {len(gold)} | {acc['greedy']:.3f} | {acc['mean']:.3f} | {acc['maj']:.3f} |")


if __name__ == "__main__":
    main()
