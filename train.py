"""Label-free GRPO for math reasoning: Co-rewarding-I and -II, and their baselines.

    torchrun train.py --method coreward1                       # the classroom world, a few minutes on a CPU
    torchrun --nproc_per_node=2 train.py --method majority     # each rank samples and trains its share
    torchrun --nproc_per_node=8 train.py --method coreward1 --model Qwen/Qwen3-4B-Base --data openrs

One step:
1. take P question pairs (original q, rephrasing q'); each rank takes P / world_size of them;
2. sample G responses to each view with the rollout engine (rollout.py);
3. label each group and reward each response (rewards.py); for coreward1 the majority answer
   over the q' responses labels the q responses and vice versa; for coreward2 the EMA teacher
   (teacher.py) samples G responses per question too and its majority is the label; the
   answer-free baselines (self_certainty, entropy) score responses by the policy's token
   distributions instead;
4. normalise the rewards within each group into advantages, and take the clipped-GRPO update(s)
   with a k3 KL penalty to the frozen start model, or to the teacher for coreward2/3 (grpo.py);
   as J(q) + J(q') is one sum over tokens, the two views simply share one token-mean loss;
5. move the teacher towards the policy (EMA), and load the updated weights into the engine.

Outputs in --out: metrics.jsonl (a line per step; a line per evaluation), config.json (the
resolved configuration) and final/ (the trained model, loadable by transformers and vLLM). A run
refuses an --out that already holds these, unless given --overwrite.

Settings that cannot work (a group of one response, no steps, mini-batches that do not split a
rank's sequences, ...) are refused before any compute, and the run stops before the optimizer
step at the first NaN or infinite loss, gradient norm or sampler gap: nothing non-finite reaches
the weights or a saved model.

Presets: `classroom` (the default with no --model) runs the tiny world of world.py;
`official` (the default with --model) is the paper's recipe; any flag given overrides its preset.
"""
import argparse
import functools
import json
import math
import os
import shutil
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import data
from eval import accuracies, benchmark_prompts, eval_counts
from grpo import (NonFiniteError, StepConfig, full_weights, group_advantages, init_distributed, make_batch, score_responses,
                  shard, train_step)
from rewards import (ANSWER_FREE_METHODS, METHODS, TEACHER_METHODS, certainty_rewards, extract_answer, is_equiv,
                     labels_for, rewards_for)
from teacher import ema_decay, ema_update, teacher_rollout

PRESETS = {
    "classroom": dict(
        data="classroom", pairs_per_step=16, group_size=8, steps=60, lr=1e-4, weight_decay=0.0,
        warmup_ratio=0.1, max_grad_norm=1.0, clip_eps=0.2, kl_coef=0.005, temperature=1.0,
        max_prompt_len=64, max_response_len=48, mini_batches=1, micro_batch_size=256,
        eval_data="classroom", eval_every=20, eval_k=8, eval_limit=200, eval_temperature=1.0, dtype="float32",
        cpu_kv_cache_gib=0.25),
    "official": dict(
        data="openrs", pairs_per_step=128, group_size=8, epochs=3, lr=3e-6, weight_decay=0.01,
        warmup_ratio=0.1, max_grad_norm=1.0, clip_eps=0.2, kl_coef=0.005, temperature=1.0,
        max_prompt_len=512, max_response_len=3072, mini_batches=2, micro_batch_size=2,
        eval_data="math500", eval_every=20, eval_k=8, eval_limit=500, eval_temperature=0.8, dtype="bfloat16",
        cpu_kv_cache_gib=2.0),
}
# A method is a set of argument values: these override the preset unless given on the command line.
METHOD_DEFAULTS = {
    "coreward2": dict(kl_coef=0.001),       # the KL anchor is the EMA teacher, weaker than to the start model
    "coreward3": dict(kl_coef=0.001),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", required=True, choices=METHODS)
    ap.add_argument("--model", default=None, help="a Hugging Face model folder (default: the classroom base model)")
    ap.add_argument("--preset", choices=list(PRESETS), default=None, help="default: classroom without --model, else official")
    ap.add_argument("--data", help="'classroom', openrs, math, dapo, amc_ttt, a parquet of pairs, or a hub dataset id")
    ap.add_argument("--eval_data", help="'classroom' or a shipped benchmark (math500, gsm8k, amc, amc23, aime24, aime25)")
    ap.add_argument("--out", default=None, help="output folder (default: runs/METHOD)")
    ap.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run in --out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="rollout engine")
    ap.add_argument("--steps", type=int, help="training steps (default: the preset's, or its epochs over the data)")
    ap.add_argument("--epochs", type=float)
    ap.add_argument("--pairs_per_step", type=int, help="question pairs per step, over all ranks")
    ap.add_argument("--group_size", type=int, help="G: responses per question and view")
    for name, kind in [("lr", float), ("weight_decay", float), ("warmup_ratio", float), ("max_grad_norm", float),
                       ("clip_eps", float), ("kl_coef", float), ("temperature", float), ("max_prompt_len", int),
                       ("max_response_len", int), ("mini_batches", int), ("micro_batch_size", int),
                       ("eval_every", int), ("eval_k", int), ("eval_limit", int), ("eval_temperature", float),
                       ("dtype", str), ("cpu_kv_cache_gib", float)]:
        ap.add_argument(f"--{name}", type=kind)
    ap.add_argument("--ema_start", type=float, default=0.99, help="the teacher's EMA decay at the first step")
    ap.add_argument("--ema_end", type=float, default=0.9999, help="... and at the last (the official code: 0.99999)")
    ap.add_argument("--max_sampler_gap", type=float, default=0.1,
                    help="stop when the sampler's and the trainer's log-probs differ by more than this (mean per token)")
    args = ap.parse_args(argv)
    preset = {**PRESETS[args.preset or ("classroom" if args.model is None else "official")],
              **METHOD_DEFAULTS.get(args.method, {})}
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.out = args.out or os.path.join("runs", args.method)
    return args


def check_settings(args, world_size):
    """Refuse, before any compute, settings that cannot work."""
    def refuse(message):
        raise ValueError(f"{message}; nothing was run")
    for name in ("pairs_per_step", "mini_batches", "micro_batch_size", "eval_every", "eval_k", "max_prompt_len",
                 "max_response_len"):
        if getattr(args, name) < 1:
            refuse(f"--{name} {getattr(args, name)} must be at least 1")
    if args.steps is not None and args.steps < 1:
        refuse(f"--steps {args.steps} must be at least 1")
    if args.steps is None and not args.epochs > 0:
        refuse(f"--epochs {args.epochs} must be positive")
    if not args.temperature > 0:
        refuse(f"--temperature {args.temperature} must be positive: GRPO samples its groups")
    if args.group_size < 2:
        refuse(f"--group_size {args.group_size} must be at least 2: advantages compare a response with the others "
               f"to its question (a group of one has no spread; the paper uses 8)")
    if args.pairs_per_step % world_size:
        refuse(f"--pairs_per_step {args.pairs_per_step} must be divisible by the {world_size} ranks")
    sequences = args.pairs_per_step // world_size * 2 * args.group_size          # per rank: pairs x 2 views x G
    if sequences % args.mini_batches:
        refuse(f"--mini_batches {args.mini_batches} must divide the {sequences} sequences each rank trains on per "
               f"step (--pairs_per_step {args.pairs_per_step} / {world_size} ranks x 2 views x --group_size "
               f"{args.group_size})")


RUN_OUTPUTS = ("metrics.jsonl", "config.json", "final")


def claim_out(out, overwrite, rank):
    """Refuse an --out that holds an earlier run's outputs, or with --overwrite remove them.
    Rank 0 looks and every rank gets its answer, so that all ranks stop or go on together."""
    found = [name for name in RUN_OUTPUTS if os.path.exists(os.path.join(out, name))] if rank == 0 else None
    box = [found]
    dist.broadcast_object_list(box, src=0)
    found = box[0]
    if found and not overwrite:
        raise FileExistsError(f"--out {out} already holds a run ({', '.join(found)}); pass --overwrite to replace it, "
                              f"or choose another --out")
    if found and rank == 0:
        for name in found:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


class MetricsLog:
    """Appends JSON lines on rank 0; a stand-in that does nothing on the other ranks."""
    def __init__(self, path, active):
        self.path, self.active = path, active
        if active:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()

    def write(self, record):
        if self.active:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def all_sum(values, device):
    """Sum a dict of floats over ranks."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def cosine_with_warmup(total_steps, warmup_ratio):
    """The learning-rate factor of training step `step` (0-based): a linear warm-up over the first
    max(1, int(total_steps * warmup_ratio)) steps (1/warmup, 2/warmup, ..., 1), then a cosine from 1
    towards 0. It counts training steps, not optimizer updates: the scheduler moves once per step, so
    a step's mini-batch updates share one rate."""
    warmup = max(1, int(total_steps * warmup_ratio))
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
    return factor


def evaluate(engine, eval_prompts, eval_gold, args, device):
    sums = eval_counts(engine, eval_prompts, eval_gold, args.eval_k, args.eval_temperature, args.max_response_len, args.seed)
    return accuracies(all_sum(sums, device))


def main(argv=None):
    args = parse_args(argv)
    check_settings(args, int(os.environ.get("WORLD_SIZE", 1)))
    rank, world_size, device = init_distributed()
    claim_out(args.out, args.overwrite, rank)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import world
    from rollout import make_engine

    classroom = args.data == "classroom"
    model_dir = args.model or world.base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # question -> prompt ids, encoded once: drop_long sees every prompt, the steps reuse them
    encode = functools.lru_cache(maxsize=None)(data.prompt_encoder(tokenizer, classroom))
    pairs = data.drop_long(data.classroom_pairs("train") if classroom else data.load_pairs(args.data), encode, args.max_prompt_len)
    if args.steps is None:
        args.steps = max(1, int(args.epochs * len(pairs) / args.pairs_per_step))
    eval_prompts, eval_gold = benchmark_prompts(tokenizer, args.eval_data, args.eval_limit, args.max_prompt_len)
    eval_prompts, eval_gold = eval_prompts[rank::world_size], eval_gold[rank::world_size]

    dtype = getattr(torch, args.dtype)
    policy = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device),
                   param_dtype=None if dtype == torch.float32 else dtype)
    # The KL anchor: the frozen start model, or for the teacher methods the EMA teacher (which also samples).
    ref = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).requires_grad_(False),
                param_dtype=None if dtype == torch.float32 else dtype)
    teacher = ref if args.method in TEACHER_METHODS else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(args.steps, args.warmup_ratio))
    engine = make_engine(args.backend, model_dir, args.max_prompt_len, args.max_response_len,
                         seed=args.seed + rank, dtype=args.dtype, cpu_kv_cache_gib=args.cpu_kv_cache_gib)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() // world_size)))
    step_cfg = StepConfig(args.temperature, args.clip_eps, args.kl_coef, args.mini_batches,
                          args.micro_batch_size, args.max_grad_norm)
    shuffle = torch.Generator().manual_seed(args.seed)
    log = MetricsLog(os.path.join(args.out, "metrics.jsonl"), rank == 0)
    if rank == 0:
        print(json.dumps(vars(args), indent=1))
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(vars(args), f, indent=1)

    def run_eval(step):
        acc = evaluate(engine, eval_prompts, eval_gold, args, device)
        record = {"step": step, "eval_acc": acc["mean"], "eval_greedy": acc["greedy"], "eval_maj": acc["maj"]}
        log.write(record)
        if rank == 0:
            tqdm.write(f"eval @ step {step}: mean@{args.eval_k} {acc['mean']:.3f}  greedy {acc['greedy']:.3f}  maj@{args.eval_k} {acc['maj']:.3f}")
        return record

    run_eval(0)
    order, cursor = torch.randperm(len(pairs), generator=shuffle).tolist(), 0
    per_rank = args.pairs_per_step // world_size
    bar = tqdm(range(1, args.steps + 1), disable=rank != 0, desc=args.method)
    for step in bar:
        if cursor + args.pairs_per_step > len(order):              # a new epoch
            order, cursor = torch.randperm(len(pairs), generator=shuffle).tolist(), 0
        mine = [pairs[i] for i in order[cursor + rank * per_rank: cursor + (rank + 1) * per_rank]]
        cursor += args.pairs_per_step

        t0 = time.perf_counter()
        prompts = [encode(p.original) for p in mine] + [encode(p.rephrased) for p in mine]
        groups = engine.generate(prompts, args.group_size, args.temperature, args.max_response_len)

        teacher_answers = None
        if teacher is not None:
            teacher_groups = teacher_rollout(engine, teacher, policy, prompts, args.group_size, args.temperature, args.max_response_len)
            teacher_answers = [[extract_answer(s.text) for s in g] for g in teacher_groups]
        t1 = time.perf_counter()

        gold = [p.answer for p in mine] * 2
        answers = [[extract_answer(s.text) for s in g] for g in groups]
        batch = make_batch([s for g in groups for s in g], tokenizer.pad_token_id or 0, device)
        if args.method in ANSWER_FREE_METHODS:
            labels = None
            fn = lambda logp_all, mask: certainty_rewards(args.method, logp_all, mask)
            rewards = score_responses(policy, batch, step_cfg, fn).view(len(groups), args.group_size).cpu()
        else:
            labels = labels_for(args.method, answers, gold, teacher_answers)
            rewards = torch.tensor(rewards_for(answers, labels))                      # [2P, G]
        batch.advantages = group_advantages(rewards).flatten().to(device)
        lr = scheduler.get_last_lr()[0]                                    # the rate this step's updates use
        try:
            stats = train_step(policy, ref, optimizer, batch, step_cfg, world_size)
        except NonFiniteError as e:
            raise NonFiniteError(f"step {step}: {e} The run stopped; metrics.jsonl holds the steps before it.") from None
        scheduler.step()
        alpha = 1 - ema_decay(step - 1, args.steps - 1, args.ema_start, args.ema_end)
        if teacher is not None:
            ema_update(teacher, policy, alpha)
        t2 = time.perf_counter()
        engine.load_weights(full_weights(policy))
        t3 = time.perf_counter()

        sums = all_sum({
            **{k: v for k, v in stats.items() if k != "grad_norm"},
            "responses": rewards.numel(), "groups": len(groups),
            "reward": rewards.sum().item(),
            "correct": sum(is_equiv(a, g) for group, g in zip(answers, gold) for a in group),
            "no_answer": sum(a is None for group in answers for a in group),
            "label_correct": sum(is_equiv(label, g) for label, g in zip(labels or [], gold)),
        }, device)
        n, tokens = sums["responses"], sums["tokens"]
        record = {
            "step": step, "responses": int(n), "reward": sums["reward"] / n, "rollout_acc": sums["correct"] / n,
            "label_acc": None if labels is None else sums["label_correct"] / sums["groups"],
            "no_answer": sums["no_answer"] / n,
            "kl": sums["kl_sum"] / tokens, "entropy": sums["entropy_sum"] / tokens,
            "response_len": tokens / n, "clip_frac": sums["clipped_sum"] / tokens,
            "grad_norm": stats["grad_norm"], "lr": lr,
            "sampler_gap": sums["sampler_gap_sum"] / tokens,
            "t_rollout": t1 - t0, "t_train": t2 - t1, "t_sync": t3 - t2,
            **({"ema_alpha": alpha} if teacher is not None else {}),
        }
        log.write(record)
        bar.set_postfix(reward=f"{record['reward']:.2f}", acc=f"{record['rollout_acc']:.2f}",
                        label_acc="-" if labels is None else f"{record['label_acc']:.2f}")
        if not record["sampler_gap"] <= args.max_sampler_gap:
            raise RuntimeError(f"step {step}: the rollout engine's log-probs differ from the trainer's by "
                               f"{record['sampler_gap']:.3f} per token (> --max_sampler_gap {args.max_sampler_gap}): "
                               f"the engine is not running the trainer's weights. Check the weight sync "
                               f"(names and dtypes the engine expects), or raise the limit for low-precision engines.")
        if step % args.eval_every == 0 or step == args.steps:
            run_eval(step)

    weights = full_weights(policy)
    if rank == 0:
        final = os.path.join(args.out, "final")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.load_state_dict(dict(weights))
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
        print(f"saved {final}")
    dist.barrier()
    engine.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
