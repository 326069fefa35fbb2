"""Teach a chat model the answer format, and stop there: a short supervised warm-up until most of its
responses end in a \\boxed{} answer.

    python tools/format_warmup.py --model models/smollm2-135m --out models/smollm2-135m-boxed

A label-free reward reads the last \\boxed{} of a response; a model that never writes one gets reward
0 from every method, and nothing can be learned. This warm-up fine-tunes on worked solutions of the
classroom world's `warmup` problems, which share no mathematics (shape and numbers) with its `train`
and `test` splits, asked in plain English through the model's chat template with data.PROMPTS[--prompt],
as train.py asks them. It is world.py's warm-up of the classroom base model applied to a real model:
random views, the loss a token mean of the negative log-likelihood of the response tokens.

Every --check_every steps (and before the first) it samples --check_k responses at --temperature to
the first --check_questions questions of the classroom `train` split (the RL questions: the stop rule
reads only whether a response has a boxed answer, never the answers) and stops as soon as at least
--target of them have one. It stops on the format, not on being right: what the model gets right
(printed beside, graded against the train split's answers) is left to RL to improve. The model, its
tokenizer and warmup.json (each check's figures) go to --out.
"""
import argparse
import json
import os
import random
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)                                   # the loop's modules

import config  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402
from harness import data  # noqa: E402
from harness import world  # noqa: E402
from harness.answers import extract_answer, is_equiv  # noqa: E402


def solution_text(problem, tokenizer):
    """The worked solution of a classroom problem in plain English, ended by the model's end-of-turn token."""
    text, _ = world.worked_solution(*problem.maths)
    return world.plain_english(text).strip() + tokenizer.eos_token


def warmup_batch(problems, encode, tokenizer, rng, batch):
    """Token ids [B, T] and a loss mask [B, T] (1 on response tokens) of `batch` random examples, each a random
    view of its problem."""
    seqs, masks = [], []
    for p in rng.sample(problems, batch):
        prompt = encode((p.original, p.rephrased)[rng.random() < 0.5])
        response = tokenizer(solution_text(p, tokenizer), add_special_tokens=False)["input_ids"]
        seqs.append(prompt + response)
        masks.append([0] * len(prompt) + [1] * len(response))
    return world.padded(seqs, masks, tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                        else tokenizer.eos_token_id)


def check(engine, model, prompts, gold, args):
    """The share of sampled responses with a boxed answer, and of those right, with the model's current weights."""
    problem = engine.load_weights((n, p.detach()) for n, p in model.named_parameters(remove_duplicate=False))
    if problem is not None:
        raise RuntimeError(f"the rollout engine did not take the warm-up's weights: {problem}")
    groups = engine.generate(prompts, n=args.check_k, temperature=args.temperature, max_tokens=args.max_tokens,
                             seeds=list(range(len(prompts))))
    answers = [(extract_answer(s.text), g) for group, g in zip(groups, gold) for s in group]
    return {"boxed": sum(a is not None for a, _ in answers) / len(answers),
            "right": sum(is_equiv(a, g) for a, g in answers) / len(answers),
            "example": groups[0][0].text}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a chat model's folder (tools/smollm.py makes one)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", choices=list(data.PROMPTS), default="official")
    ap.add_argument("--target", type=float, default=0.75, help="stop once this share of responses is boxed")
    ap.add_argument("--max_steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--check_every", type=int, default=10)
    ap.add_argument("--check_questions", type=int, default=32)
    ap.add_argument("--check_k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampling temperature of the checks")
    ap.add_argument("--max_tokens", type=int, default=128, help="response tokens of the checks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=config.BACKENDS, default="auto", help="the engine (train.py --backend)")
    args = ap.parse_args()
    from harness import checkpoint
    args.model = checkpoint.model_folder_for_all_ranks(args.model)
    from rollout import make_engine
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if not tokenizer.chat_template:
        raise SystemExit(f"{args.model}'s tokenizer has no chat template: this warm-up is for chat models")
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    encode = data.prompt_encoder(tokenizer, True, args.prompt)
    problems, rng = world.make_split("warmup"), random.Random(args.seed)
    checked = world.make_split("train")[:args.check_questions]
    prompts, gold = [encode(p.original) for p in checked], [p.answer for p in checked]
    classroom = config.PRESETS["classroom"]                 # the engine's settings: the classroom's
    engine = make_engine(config.choose_backend(args.backend)[0], args.model, max(map(len, prompts)), args.max_tokens,
                         **{k: classroom[k] for k in ("dtype", *("cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib"))})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    history = []
    for step in range(args.max_steps + 1):
        if step % args.check_every == 0 or step == args.max_steps:
            history.append({"step": step, **check(engine, model, prompts, gold, args)})
            print(f"step {step:3d}  boxed {history[-1]['boxed']:.3f}  right {history[-1]['right']:.3f}", flush=True)
            if history[-1]["boxed"] >= args.target or step == args.max_steps:
                break
        ids, mask = warmup_batch(problems, encode, tokenizer, rng, args.batch)
        loss = world.response_loss(model, ids, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history[-1].setdefault("losses", []).append(round(loss.item(), 4))
    engine.close()
    reached = history[-1]["boxed"] >= args.target
    print(f"{'reached' if reached else 'did not reach'} {args.target:.2f} boxed after {history[-1]['step']} steps "
          f"(boxed {history[0]['boxed']:.3f} -> {history[-1]['boxed']:.3f})")
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    with open(os.path.join(args.out, "warmup.json"), "w") as f:
        json.dump({"model": args.model, **{k: v for k, v in vars(args).items() if k != "model"},
                   "reached": reached, "checks": history}, f, indent=1)
    print(f"saved {args.out}")


if __name__ == "__main__":
    exit_on_usage_error(main, "format_warmup.py")
