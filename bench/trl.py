"""Our GRPO step against TRL's GRPOTrainer: one setting, seconds per step and the training
phase's FLOP/s, in a table.

    python3 -m venv bench/.venv-trl && bench/.venv-trl/bin/pip install -r bench/requirements-trl.txt
    .venv/bin/python bench/trl.py --steps 10            # on an otherwise idle machine

TRL lives in bench/.venv-trl only (same torch and transformers as requirements.txt, trl on top), so
that it cannot move the project's pins; this script runs with the project's venv, starts `train.py`
with it and TRL with bench/.venv-trl/bin/python (this file again, with --trl_worker).

The setting, for both: the classroom base model (world.base_model_dir()), 16 train pairs x 2 views
x G=8 = 256 responses a step, at most 48 response tokens, temperature 1.0 (no top-p, no top-k),
lr 1e-4, KL coefficient 0.005 to the start model, fp32, one optimizer update a step over all 256
(token mean over the batch: TRL's loss_type="dapo"), reward 1 when the \\boxed answer equals the
gold one (the `gt` method; TRL gets rewards.extract_answer / rewards.is_equiv), no evaluation.

- Ours: `train.py --method gt --views both --steps N --eval_every 1000 --save_every 0` (its classroom preset; the
  evaluations at step 0 and N, with --eval_limit 16, fall outside the step timings). Per step from
  metrics.jsonl: t_rollout (vLLM sampling), t_train (rewards, the reference forward, the policy's
  forward and backward, the optimizer) and t_sync (loading the new weights into vLLM). train.py
  runs under a wrapper of grpo.make_batch that notes each step's batch shape, for the FLOPs.
- TRL: GRPOTrainer with transformers' generate (no vLLM), per_device_train_batch_size 256 and
  gradient_accumulation_steps 1 (one optimizer step = one generation batch), num_iterations 1,
  no gradient checkpointing. A step is on_step_begin to on_step_end (a TrainerCallback); its
  rollout is GRPOTrainer._generate (tokenise the prompts, generate, decode) and its train phase is
  the rest: rewards, the reference forward, the policy's forward and backward, the optimizer.
  With num_iterations 1 and generation aligned with the optimizer step, TRL computes no separate
  old log-probs (π_old is the update's own forward, detached), as ours.

The first --warmup steps of each are left out; the table shows medians. Train-phase FLOPs per step
= 8 x (B x T x N_body + R x N_head): 2 for the reference forward and 6 for the policy's forward and
backward; B x T the padded batch the forwards run on (ours right-pads prompt+response; TRL
left-pads prompts and right-pads completions), N_body all parameters except the output layer
(the norms included, the embedding lookup being free of FLOPs), N_head the output layer's (tied to
the embedding: counted once), run by both only on the R response tokens (logprobs.response_hidden,
TRL's fused LM head). Attention's score and value products are left out. The machine's practical
FLOP/s is the best of a few fp32 --matmul_size square matmuls, with the threads the runs use.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this file is named trl.py: keep its folder off the path, so that `import trl` is the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, ROOT)

TRL_PYTHON = os.path.join(HERE, ".venv-trl", "bin", "python")
SETTING = dict(pairs=16, group_size=8, max_response_len=48, temperature=1.0, lr=1e-4, kl_coef=0.005, seed=0)

# Runs train.py as `python train.py ...` would, with grpo.make_batch noting each step's batch shape.
OURS_LAUNCHER = r"""
import json, runpy, sys
shapes, train_py = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
import os
sys.path.insert(0, os.path.dirname(train_py))
import grpo
make_batch = grpo.make_batch
def noting(samples, *args, **kwargs):
    batch = make_batch(samples, *args, **kwargs)
    with open(shapes, "a") as f:
        f.write(json.dumps({"rows": batch.input_ids.shape[0], "width": batch.input_ids.shape[1],
                            "response_tokens": int(batch.mask.sum().item())}) + "\n")
    return batch
grpo.make_batch = noting
runpy.run_path(train_py, run_name="__main__")
"""


def threads():
    """The threads train.py takes with one rank."""
    return int(os.environ.get("OMP_NUM_THREADS", max(1, os.cpu_count())))


def offline_env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def matmul_flops(n, repeats=5, rounds=3):
    """Best FLOP/s of `repeats` back-to-back fp32 n x n matmuls, over `rounds`."""
    import torch
    torch.set_num_threads(threads())
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b                                                          # warm up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 * repeats / best


def param_counts(model_dir):
    """(N_body, N_head): all parameters but the output layer, and the output layer's."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = sum(p.numel() for p in model.parameters())              # tied weights once
    head = model.get_output_embeddings().weight.numel()
    return total - head, head


def train_flops(rec, n_body, n_head):
    """A reference forward (2x) and the policy's forward and backward (6x)."""
    return 8 * (rec["rows"] * rec["width"] * n_body + rec["response_tokens"] * n_head)


def run_ours(steps, tmp):
    """Per step: rollout, train, sync and total seconds, and the batch's shape."""
    out, shapes = os.path.join(tmp, "ours"), os.path.join(tmp, "ours-shapes.jsonl")
    cmd = [sys.executable, "-c", OURS_LAUNCHER, shapes, os.path.join(ROOT, "train.py"),
           "--method", "gt", "--steps", str(steps), "--eval_every", "1000", "--eval_limit", "16",
           "--save_every", "0", "--out", out, "--overwrite", "--seed", str(SETTING["seed"]),
           "--questions_per_step", str(SETTING["pairs"]), "--views", "both",
           "--group_size", str(SETTING["group_size"]),
           "--max_response_len", str(SETTING["max_response_len"]), "--temperature", str(SETTING["temperature"]),
           "--lr", str(SETTING["lr"]), "--kl_coef", str(SETTING["kl_coef"]), "--mini_batches", "1",
           "--micro_batch_size", str(2 * SETTING["pairs"] * SETTING["group_size"]), "--dtype", "float32"]
    done = subprocess.run(cmd, cwd=ROOT, env=offline_env(), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"train.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"reward"' in x]
    batches = [json.loads(x) for x in open(shapes)]
    if len(records) != steps or len(batches) != steps:
        sys.exit(f"train.py: {len(records)} step records and {len(batches)} batch shapes for {steps} steps")
    return [{"rollout": r["t_rollout"], "train": r["t_train"], "sync": r["t_sync"],
             "total": r["t_rollout"] + r["t_train"] + r["t_sync"], "reward": r["reward"], **b}
            for r, b in zip(records, batches)]


def run_trl(steps, tmp):
    if not os.path.exists(TRL_PYTHON):
        sys.exit(f"no {TRL_PYTHON}: python3 -m venv bench/.venv-trl && "
                 f"bench/.venv-trl/bin/pip install -r bench/requirements-trl.txt")
    out = os.path.join(tmp, "trl")
    done = subprocess.run([TRL_PYTHON, os.path.abspath(__file__), "--trl_worker", out, "--steps", str(steps)],
                          cwd=ROOT, env=offline_env(), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the TRL run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(x) for x in open(os.path.join(out, "steps.jsonl"))]
    if len(records) != steps:
        sys.exit(f"TRL: {len(records)} step records for {steps} steps")
    return records


def trl_worker(out, steps):
    """One GRPOTrainer run in bench/.venv-trl; a line per step in out/steps.jsonl."""
    import torch
    torch.set_num_threads(threads())
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import data
    import rewards
    import world

    model_dir = world.base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode = data.prompt_encoder(tokenizer, classroom=True)
    pairs = data.classroom_pairs("train")
    random.Random(SETTING["seed"]).shuffle(pairs)
    P = SETTING["pairs"]
    if steps * P > len(pairs):
        sys.exit(f"{steps} steps need {steps * P} pairs; the classroom has {len(pairs)}")
    rows = []   # a step's 2P prompts in order, originals then rephrasings (the dataset is not shuffled)
    for s in range(steps):
        mine = pairs[s * P:(s + 1) * P]
        rows += [{"prompt": world.format_prompt(q), "answer": p.answer, "question": q}
                 for view in ("original", "rephrased") for p in mine for q in [getattr(p, view)]]
    for r in rows:   # TRL tokenises the text prompt as is: the ids must be ours
        if tokenizer(text=[r["prompt"]])["input_ids"][0] != encode(r["question"]):
            sys.exit(f"TRL's prompt ids differ from data.prompt_encoder's for {r['prompt']!r}")

    now = {}

    def gt_reward(completions, answer, **_):
        out = [float(rewards.is_equiv(rewards.extract_answer(c), a)) for c, a in zip(completions, answer)]
        now["reward"] = sum(out) / len(out)
        return out

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            result = super()._generate(prompts)
            now["generate"] = now.get("generate", 0.0) + time.perf_counter() - t0
            prompt_ids, completion_ids = result[0], result[1]
            now["rows"] = len(completion_ids)
            now["width"] = max(map(len, prompt_ids)) + max(map(len, completion_ids))   # left + right padded
            now["response_tokens"] = sum(map(len, completion_ids))
            return result

    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, "steps.jsonl"), "w")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            now.clear()
            now["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            total = time.perf_counter() - now.pop("t0")
            gen = now.pop("generate")
            log.write(json.dumps({"step": state.global_step, "total": total, "rollout": gen, "train": total - gen,
                                  "sync": 0.0, **now}) + "\n")
            log.flush()

    config = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=2 * P * SETTING["group_size"],
        gradient_accumulation_steps=1, num_generations=SETTING["group_size"], num_iterations=1,
        max_completion_length=SETTING["max_response_len"], temperature=SETTING["temperature"], top_p=1.0, top_k=0,
        learning_rate=SETTING["lr"], beta=SETTING["kl_coef"], loss_type="dapo", epsilon=0.2, max_grad_norm=1.0,
        weight_decay=0.0, optim="adamw_torch", lr_scheduler_type="cosine", warmup_steps=0.1,
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"},
        use_vllm=False, shuffle_dataset=False, logging_steps=1, report_to="none", save_strategy="no",
        eval_strategy="no", seed=SETTING["seed"], dataloader_num_workers=0, disable_tqdm=True)
    trainer = TimedGRPOTrainer(model=model_dir, reward_funcs=gt_reward, args=config, processing_class=tokenizer,
                               train_dataset=Dataset.from_list(rows), callbacks=[StepTimer()])
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every or trainer.ref_model is None:
        sys.exit("TRL would recompute old log-probs or has no reference model: not the setting measured here")
    print(f"trl {trl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    trainer.train()
    log.close()


def median(records, key):
    return statistics.median(r[key] for r in records)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="training steps of each run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out (default 2)")
    ap.add_argument("--matmul_size", type=int, default=2048)
    ap.add_argument("--trl_worker", metavar="OUT", help=argparse.SUPPRESS)   # internal: the TRL run
    args = ap.parse_args()
    if args.trl_worker:
        return trl_worker(args.trl_worker, args.steps)
    if args.steps <= args.warmup:
        ap.error(f"--steps must exceed --warmup ({args.warmup})")
    import torch
    import world
    model_dir = world.base_model_dir()
    n_body, n_head = param_counts(model_dir)
    peak = matmul_flops(args.matmul_size)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ours_all = run_ours(args.steps, tmp)
        t1 = time.perf_counter()
        theirs_all = run_trl(args.steps, tmp)
        t2 = time.perf_counter()
    ours, theirs = ours_all[args.warmup:], theirs_all[args.warmup:]
    for runs in (ours, theirs):
        for r in runs:
            r["gflops"] = train_flops(r, n_body, n_head) / r["train"] / 1e9
            r["response_len"] = r["response_tokens"] / r["rows"]
    print(f"torch {torch.__version__}, {threads()} threads; {model_dir}: {n_body + n_head:,} parameters "
          f"(output layer {n_head:,}, tied to the embedding); fp32 {args.matmul_size}^3 matmul: "
          f"{peak / 1e9:.1f} GFLOP/s")
    print(f"{args.steps} steps each (ours {t1 - t0:.0f} s, TRL {t2 - t1:.0f} s with start-up), "
          f"medians over steps {args.warmup + 1}-{args.steps}")
    for name, runs in (("ours", ours_all), ("TRL", theirs_all)):
        print(f"{name} per step (rollout + train + sync s): " +
              ", ".join(f"{r['rollout']:.2f} + {r['train']:.2f} + {r['sync']:.2f}" for r in runs))
    print("| per step | ours | TRL | TRL / ours |")
    print("|---|---|---|---|")
    for name, key in (("seconds", "total"), ("rollout s (ours: vLLM; TRL: generate)", "rollout"),
                      ("train s", "train"), ("weight sync s", "sync")):
        a, b = median(ours, key), median(theirs, key)
        print(f"| {name} | {a:.3f} | {b:.3f} | " + (f"{b / a:.2f}x |" if a and b else "- |"))
    a, b = median(ours, "gflops"), median(theirs, "gflops")
    print(f"| train GFLOP/s | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    print(f"| train, % of matmul | {100 * a * 1e9 / peak:.1f}% | {100 * b * 1e9 / peak:.1f}% | |")
    for name, key, fmt in (("padded width T (B = 256)", "width", "{:.0f}"),
                           ("response tokens", "response_len", "{:.1f}"), ("reward", "reward", "{:.3f}")):
        if all(key in r for r in ours + theirs):
            print(f"| {name} | {fmt.format(median(ours, key))} | {fmt.format(median(theirs, key))} | |")


if __name__ == "__main__":
    main()
