"""Label-free GRPO for math reasoning: Co-rewarding-I and -II, and their baselines.

    torchrun train.py --method coreward1                       # the classroom world, a few minutes on a CPU
    torchrun --nproc_per_node=2 train.py --method majority     # each rank samples and trains its share
    torchrun --nproc_per_node=8 train.py --method coreward1 --model Qwen/Qwen3-4B-Base --data openrs

One step:
1. take P questions; each rank takes P / world_size of them. The two-view methods (coreward1,
   coreward3_both) take each with its rephrasing q' (`--views both`, the only choice for them);
   every other method trains on the original questions only (`--views original`, its default),
   as the official scripts do, and `--views both` gives it the twins as two independent questions;
2. sample G responses to each question (and view) with the rollout engine (rollout.py);
3. label each group and reward each response (rewards.py); for coreward1 the majority answer
   over the q' responses labels the q responses and vice versa; for coreward2 the EMA teacher
   (teacher.py) samples G responses per question too and its majority is the label; for
   coreward3 the teacher answers the rephrasings instead (`--teacher_prompts rephrased`); the
   answer-free baselines (self_certainty, entropy) score responses by the policy's token
   distributions instead;
4. normalise the rewards within each group into advantages, and take the clipped-GRPO update(s)
   with a k3 KL penalty to the frozen start model, or to the teacher for the teacher methods
   (grpo.py); a two-view method's loss is J(q) + J(q'), one token mean per view;
5. move the teacher towards the policy (EMA), and load the updated weights into the engine.

Outputs in --out: metrics.jsonl (a line per step; a line per evaluation), config.json (the
resolved configuration), checkpoints/step_S/ (every --save_every steps and at the last; see
checkpoint.py) and final/ (the trained model, loadable by transformers and vLLM). A run refuses
an --out that already holds these, unless given --overwrite.

`--resume` continues the run in --out from its newest checkpoint (`--resume PATH`: from that one),
with the checkpoint's configuration; flags given again must agree with it, except those in
MAY_CHANGE_ON_RESUME. It samples exactly what the uninterrupted run would have: every sampled
request is seeded by the run's seed, the step, the question and the view (rollout.py), and the
checkpoint holds every random state the loop draws from. SIGTERM or SIGINT makes all ranks finish
the step, write a checkpoint and exit.

Settings that cannot work (a group of one response, no steps, mini-batches that do not split a
rank's sequences, ...) are refused before any compute, and the run stops before the optimizer
step at the first NaN or infinite loss, gradient norm or sampler gap: nothing non-finite reaches
the weights or a saved model.

Presets: `classroom` (the default with no --model) runs the tiny world of world.py;
`official` (the default with --model) is the paper's recipe; any flag given overrides its preset.
"""
import argparse
import dataclasses
import fcntl
import functools
import json
import math
import os
import secrets
import shutil
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from tqdm import tqdm

import checkpoint
import data
from eval import accuracies, benchmark_prompts, eval_counts
from grpo import (NonFiniteError, StepConfig, full_weights, group_advantages, init_distributed, load_sharded, make_batch,
                  score_responses, train_step)
from rewards import (ANSWER_FREE_METHODS, METHODS, TEACHER_METHODS, TWO_VIEW_METHODS, certainty_per_token,
                     common_answer_share,
                     extract_answer, group_diagnostics, is_equiv, labels_for, majority_vote, rewards_for)
from teacher import ema_decay, ema_update, teacher_rollout

PRESETS = {
    "classroom": dict(
        data="classroom", questions_per_step=16, group_size=8, steps=60, lr=1e-4, weight_decay=0.0,
        warmup_ratio=0.1, max_grad_norm=1.0, clip_eps=0.2, kl_coef=0.005, temperature=1.0,
        max_prompt_len=64, max_response_len=48, mini_batches=1, micro_batch_size=256,
        eval_data="classroom", eval_every=20, eval_k=8, eval_limit=200, eval_temperature=1.0, dtype="float32",
        cpu_kv_cache_gib=0.25, save_every=20, activation_checkpointing=False,
        max_tokens_per_micro_batch=4096),          # less padding: 1.2x faster updates on bench/classroom.py's batch
    "official": dict(
        data="openrs", questions_per_step=128, group_size=8, epochs=3, lr=3e-6, weight_decay=0.01,
        warmup_ratio=0.1, max_grad_norm=1.0, clip_eps=0.2, kl_coef=0.005, temperature=1.0,
        max_prompt_len=512, max_response_len=3072, micro_batch_size=2,
        mini_batches=1,                 # one update per step: ppo_mini_batch_size = train_batch_size = 128
        max_tokens_per_micro_batch=16384,                          # fits 8 x 80 GB with room: bench/scale.py
        # the official scripts' validation: greedy (eval_greedy) on the 5,000 MATH test questions every 10 steps;
        # eval_acc adds one sample per question at the paper's evaluation temperature
        eval_data="math5000", eval_every=10, eval_k=1, eval_limit=None, eval_temperature=0.8, dtype="bfloat16",
        cpu_kv_cache_gib=2.0, save_every=10,           # as Co-rewarding-I's script (Co-rewarding-II's: 30)
        activation_checkpointing=True),
}
# A method is a set of argument values: these override the preset unless given on the command line.
METHOD_DEFAULTS = {
    "coreward1": dict(views="both"),         # each view's vote labels the other's responses
    # the KL anchor is the EMA teacher, weaker than to the start model
    "coreward2": dict(kl_coef=0.001),
    "coreward3": dict(kl_coef=0.001, teacher_prompts="rephrased"),
    "coreward3_both": dict(kl_coef=0.001, views="both"),
}
VIEWS = ("original", "both")
TEACHER_PROMPTS = ("same", "rephrased")


# The defaults of flags that neither the preset nor the method sets.
DEFAULTS = dict(views="original", teacher_prompts="same", seed=0, backend="vllm", ema_start=0.99, ema_end=0.9999, max_sampler_gap=0.1, keep_last=2,
                gpu_memory_utilization=0.3, defer_grad_sync=False)
# What a resumed run may change; every other flag must agree with the checkpoint's configuration.
MAY_CHANGE_ON_RESUME = ("eval_every", "save_every", "keep_last", "max_sampler_gap", "wandb")
# Flags that say how to start this process, not what the run is: not part of its configuration.
NOT_CONFIG = ("resume", "overwrite")
LATEST = "latest"           # the value of a bare --resume: the newest checkpoint in --out


def build_parser(argument_default=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 argument_default=argument_default)
    ap.add_argument("--method", choices=METHODS, help="required, unless given by --resume's checkpoint")
    ap.add_argument("--model", help="a Hugging Face model folder (default: the classroom base model)")
    ap.add_argument("--preset", choices=list(PRESETS), help="default: classroom without --model, else official")
    ap.add_argument("--data", help="'classroom', openrs, math, dapo, amc_ttt, a parquet of pairs, or a hub dataset id; "
                                   "with --views original also a question set (.parquet/.json/.jsonl with question "
                                   "and answer columns) or a benchmark's questions (test-time training)")
    ap.add_argument("--views", choices=VIEWS,
                    help="'original': train on the original questions; 'both': each with its rephrasing (what "
                         "coreward1 and coreward3_both need; the default for them, 'original' for the others)")
    ap.add_argument("--teacher_prompts", choices=TEACHER_PROMPTS,
                    help="what the EMA teacher answers: the policy's own prompts ('same', the default) or their "
                         "rephrasings ('rephrased': coreward3's default)")
    ap.add_argument("--eval_data", help="'classroom' or a shipped benchmark (math500, gsm8k, amc, amc23, aime24, aime25)")
    ap.add_argument("--out", help="output folder (default: runs/METHOD)")
    ap.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run in --out")
    ap.add_argument("--resume", nargs="?", const=LATEST, metavar="CHECKPOINT",
                    help="continue the run in --out from its latest checkpoint, or from the CHECKPOINT folder named")
    ap.add_argument("--seed", type=int, help=f"default {DEFAULTS['seed']}")
    ap.add_argument("--backend", choices=["vllm", "hf"], help="rollout engine (default vllm)")
    ap.add_argument("--steps", type=int, help="training steps (default: the preset's, or its epochs over the data)")
    ap.add_argument("--epochs", type=float)
    ap.add_argument("--questions_per_step", "--pairs_per_step", type=int,
                    help="questions per step, over all ranks (with --views both, each with its rephrasing)")
    ap.add_argument("--group_size", type=int, help="G: responses per question and view")
    for name, kind in [("lr", float), ("weight_decay", float), ("warmup_ratio", float), ("max_grad_norm", float),
                       ("clip_eps", float), ("kl_coef", float), ("temperature", float), ("max_prompt_len", int),
                       ("max_response_len", int), ("mini_batches", int), ("micro_batch_size", int),
                       ("eval_every", int), ("eval_k", int), ("eval_limit", int), ("eval_temperature", float),
                       ("dtype", str), ("cpu_kv_cache_gib", float)]:
        ap.add_argument(f"--{name}", type=kind)
    ap.add_argument("--gpu_memory_utilization", type=float,
                    help="the share of each GPU vLLM's engine takes for its weights and KV cache (default 0.3)")
    ap.add_argument("--activation_checkpointing", action=argparse.BooleanOptionalAction,
                    help="recompute each decoder layer in the backward instead of keeping its activations "
                         "(on in the official preset)")
    ap.add_argument("--max_tokens_per_micro_batch", type=int,
                    help="group each forward/backward pass by padded tokens instead of --micro_batch_size rows: "
                         "rows of similar length together, each pass padded to its own longest row (0: by "
                         "--micro_batch_size; 4096 in the classroom preset, 16384 in the official one)")
    ap.add_argument("--defer_grad_sync", action=argparse.BooleanOptionalAction,
                    help="reduce-scatter gradients once per update instead of after every micro-batch (keeps "
                         "unsharded gradients in between: see the memory account in README)")
    ap.add_argument("--save_every", type=int, help="write a checkpoint every K steps and at the last (0: never)")
    ap.add_argument("--keep_last", type=int, help="keep the newest N checkpoints (0: all; default 2)")
    ap.add_argument("--wandb", metavar="PROJECT",
                    help="also log every record of metrics.jsonl to Weights & Biases, project PROJECT (wandb is not a "
                         "requirement: pip install wandb; WANDB_MODE=offline works); a resumed run continues its run")
    ap.add_argument("--ema_start", type=float, help="the teacher's EMA decay at the first step (default 0.99)")
    ap.add_argument("--ema_end", type=float, help="... and at the last (default 0.9999; the official code: 0.99999)")
    ap.add_argument("--max_sampler_gap", type=float,
                    help="stop when the sampler's and the trainer's log-probs differ by more than this (mean per "
                         "token; default 0.1)")
    return ap


def parse_args(argv=None):
    """The run's settings: the flags given, then the method's and the preset's values, then DEFAULTS."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.method is None and args.resume is None:
        ap.error("the following arguments are required: --method")
    args.preset = args.preset or ("classroom" if args.model is None else "official")
    preset = {**DEFAULTS, **PRESETS[args.preset], **METHOD_DEFAULTS.get(args.method, {})}     # later ones win
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.out = args.out or (args.method and os.path.join("runs", args.method))
    return args


def given_flags(argv=None):
    """The names of the flags on the command line."""
    return set(vars(build_parser(argparse.SUPPRESS).parse_args(argv)))


def config_of(args):
    """The run's configuration: what config.json and a checkpoint record."""
    return {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}


def resume_settings(args, given):
    """(settings, checkpoint path) of `--resume`: the checkpoint's configuration, with the flags given
    now checked against it. A flag outside MAY_CHANGE_ON_RESUME that differs stops the run."""
    def refuse(message):
        raise ValueError(f"{message}; nothing was run")
    if args.overwrite:
        refuse("--resume continues the run in its folder and --overwrite would delete it: give one or the other")
    if args.resume == LATEST:
        if args.out is None:
            refuse("--resume needs --out (the run's folder), or --method for the default runs/METHOD")
        path = checkpoint.latest(args.out)
        if path is None:
            raise FileNotFoundError(f"--resume: {args.out} holds no complete checkpoint (checkpoints/step_S); "
                                    f"nothing to continue. Start the run without --resume")
        out = args.out
    else:
        path = os.path.normpath(args.resume)
        if not checkpoint.is_checkpoint(path):
            raise FileNotFoundError(f"--resume {args.resume}: not a complete checkpoint folder (one holds trainer.pt "
                                    f"and config.json, as OUT/checkpoints/step_S does)")
        out = os.path.dirname(os.path.dirname(path))
        in_its_run = os.path.basename(os.path.dirname(path)) == "checkpoints"
        if in_its_run and "out" in given and os.path.abspath(args.out) != os.path.abspath(out):
            refuse(f"--out {args.out} is not the run that holds {path} ({out}): a resumed run writes into the folder "
                   f"of its checkpoint; drop --out")
        if not in_its_run:
            if "out" not in given:
                refuse(f"--resume {args.resume} is not in a run's checkpoints/ folder (a copy?): say which run folder "
                       f"it continues with --out, so that nothing beside the copy is taken for the run's")
            out = args.out
    settings = checkpoint.read_config(path)
    for name in sorted(given - {"resume", "out", "overwrite"}):
        now, then = getattr(args, name), settings.get(name)
        if now == then:
            continue
        if name in MAY_CHANGE_ON_RESUME:
            print(f"resume: --{name} changes from {then} to {now}")
            settings[name] = now
        else:
            why = " (it sets the LR and EMA schedules)" if name in ("steps", "epochs") else ""
            refuse(f"--{name} {now} differs from the checkpoint's {then}{why} in {path}: a resumed run keeps its "
                   f"configuration; drop the flag, or start a new run in another --out")
    return argparse.Namespace(**{**settings, "out": out, "resume": path, "overwrite": False}), path


def check_settings(args, world_size):
    """Refuse, before any compute, settings that cannot work."""
    def refuse(message):
        raise ValueError(f"{message}; nothing was run")
    if not 0 < args.gpu_memory_utilization < 1:
        refuse(f"--gpu_memory_utilization {args.gpu_memory_utilization} must be between 0 and 1: the share of each "
               f"GPU vLLM takes; the trainer needs the rest")
    for name in ("questions_per_step", "mini_batches", "micro_batch_size", "eval_every", "eval_k", "max_prompt_len",
                 "max_response_len"):
        if getattr(args, name) < 1:
            refuse(f"--{name} {getattr(args, name)} must be at least 1")
    for name in ("save_every", "keep_last", "max_tokens_per_micro_batch"):
        if getattr(args, name) < 0:
            refuse(f"--{name} {getattr(args, name)} must be 0 or more")
    longest = args.max_prompt_len + args.max_response_len
    if args.max_tokens_per_micro_batch and args.max_tokens_per_micro_batch < longest:
        refuse(f"--max_tokens_per_micro_batch {args.max_tokens_per_micro_batch} must hold one sequence of the longest "
               f"length, {longest} tokens (--max_prompt_len {args.max_prompt_len} + --max_response_len "
               f"{args.max_response_len})")
    if args.steps is not None and args.steps < 1:
        refuse(f"--steps {args.steps} must be at least 1")
    if args.steps is None and not args.epochs > 0:
        refuse(f"--epochs {args.epochs} must be positive")
    if not args.temperature > 0:
        refuse(f"--temperature {args.temperature} must be positive: GRPO samples its groups")
    if args.group_size < 2:
        refuse(f"--group_size {args.group_size} must be at least 2: advantages compare a response with the others "
               f"to its question (a group of one has no spread; the paper uses 8)")
    if args.method in TWO_VIEW_METHODS and args.views != "both":
        refuse(f"--method {args.method} labels each question's responses with its rephrasing's vote: it needs "
               f"--views both, not --views {args.views}")
    if args.teacher_prompts == "rephrased" and (args.method not in TEACHER_METHODS or args.views != "original"):
        refuse(f"--teacher_prompts rephrased has the EMA teacher answer the rephrasings of the original questions "
               f"the policy trains on: it needs a teacher method ({', '.join(TEACHER_METHODS)}) and --views "
               f"original, not --method {args.method} --views {args.views}")
    if args.questions_per_step % world_size:
        refuse(f"--questions_per_step {args.questions_per_step} must be divisible by the {world_size} ranks")
    views = 2 if args.views == "both" else 1
    sequences = args.questions_per_step // world_size * views * args.group_size      # per rank: questions x views x G
    if sequences % args.mini_batches:
        refuse(f"--mini_batches {args.mini_batches} must divide the {sequences} sequences each rank trains on per "
               f"step (--questions_per_step {args.questions_per_step} / {world_size} ranks x {views} view(s) x --group_size "
               f"{args.group_size})")


RUN_OUTPUTS = ("metrics.jsonl", "config.json", "final", "checkpoints")
RUN_LOCK = ".run.lock"           # rank 0 holds it exclusively for the whole run; it names the holder
WORKERS_LOCK = ".workers.lock"   # every rank holds it shared while it lives


def lock_out(out, rank):
    """Take --out for this run, before anything slow, for as long as the process lives (the kernel
    releases a flock when its process ends, however it ends, so a crashed run leaves no lock: its
    lock file is stale and is taken over). Rank 0 takes RUN_LOCK exclusively, then checks that no
    process still holds WORKERS_LOCK (a worker of an earlier run whose launcher is gone); every rank
    then holds WORKERS_LOCK shared. A second run on the folder is refused, naming the holder.
    Returns the open lock files, which must stay open."""
    error, held = None, []
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        run_lock = open(os.path.join(out, RUN_LOCK), "a+")
        workers = open(os.path.join(out, WORKERS_LOCK), "a+")
        run_lock.seek(0)
        holder = run_lock.read().strip() or "a process that did not say who it is"
        try:
            fcntl.flock(run_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(workers, fcntl.LOCK_EX | fcntl.LOCK_NB)    # no worker of another run is alive
            fcntl.flock(workers, fcntl.LOCK_SH)                    # we hold RUN_LOCK: no run can slip in between
            run_lock.seek(0)
            run_lock.truncate()
            run_lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                           f"{' '.join(sys.argv)}\n")
            run_lock.flush()
            held = [run_lock, workers]
        except BlockingIOError:
            error = (f"--out {out} is in use by another run ({holder}), or by a worker of it that is still running; "
                     f"wait for it to end or stop it (its workers stop at their step's end once their launcher is "
                     f"gone), or choose another --out. Nothing was run or deleted")
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise FileExistsError(box[0])
    if rank != 0:
        workers = open(os.path.join(out, WORKERS_LOCK), "a+")
        fcntl.flock(workers, fcntl.LOCK_SH)
        held = [workers]
    return held


def claim_out(out, overwrite, rank):
    """Refuse an --out that holds an earlier run's outputs, or with --overwrite remove them.
    Rank 0 looks and every rank gets its answer, so that all ranks stop or go on together."""
    found = [name for name in RUN_OUTPUTS if os.path.exists(os.path.join(out, name))] if rank == 0 else None
    box = [found]
    dist.broadcast_object_list(box, src=0)
    found = box[0]
    if found and not overwrite:
        raise FileExistsError(f"--out {out} already holds a run ({', '.join(found)}); pass --resume to continue it, "
                              f"--overwrite to replace it, or choose another --out")
    if found and rank == 0:
        for name in found:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


class NoWandb:
    """The stand-in for a wandb run when --wandb is not given, and on ranks other than 0."""
    def log(self, record, step):
        pass

    def finish(self):
        pass


def start_wandb(project, run_id, config):
    """The wandb run `run_id` of `project`, continued if it exists (a resumed run). wandb is imported
    only here, when --wandb is given."""
    try:
        import wandb
    except ImportError:
        raise ImportError("--wandb needs the wandb package: pip install wandb (or drop --wandb)") from None
    return wandb.init(project=project, id=run_id, resume="allow", config=config)


class CollapseWatch:
    """Warns (it does not stop the run) when the label-free diagnostics signal a collapse, averaged
    over the last WINDOW steps: at least 0.8 of the groups are unanimous (the policy says one answer
    to each question, right or wrong) or have zero reward variance (no learning signal); at least
    0.8 of the responses have no answer or are cut at the length limit (degenerate text); or the
    most common majority answer is that of at least 0.2 of the questions (one answer whatever the
    question: the reward hack of a vote). On the classroom's 16 questions a step, the 10-step mean
    of healthy runs sits near 0.12 (two questions sharing a small whole-number answer) and stayed
    at or below 0.163 in every study run that did not collapse; the self-vote's three collapses
    at lr 5e-4 passed 0.2 at steps 47-54 and reached 0.29-0.42. It warns when a rule
    starts to hold, and again only after the rules have stopped holding (a resumed run starts
    watching afresh)."""
    WINDOW = 10
    THRESHOLDS = {"unanimous": 0.8, "zero_variance": 0.8, "no_answer": 0.8, "truncated": 0.8, "common_answer": 0.2}

    def __init__(self):
        self.history, self.firing = [], False

    def update(self, record):
        """The warning to print after this step's record, or None."""
        self.history = (self.history + [record])[-self.WINDOW:]
        if len(self.history) < self.WINDOW:
            return None
        means = {k: sum(r.get(k, 0.0) for r in self.history) / self.WINDOW for k in self.THRESHOLDS}
        signs = [f"{k} {v:.2f}" for k, v in means.items() if v >= self.THRESHOLDS[k]]
        was, self.firing = self.firing, bool(signs)
        if signs and not was:
            return (f"warning: step {record['step']}: the policy may be collapsing ({', '.join(signs)} over the last "
                    f"{self.WINDOW} steps; limits {self.THRESHOLDS}): a label-free reward then rewards whatever its "
                    f"groups agree on. Check eval_acc; consider stopping or a lower --lr")
        return None


class MetricsLog:
    """Appends JSON lines on rank 0, and sends each record to wandb (`NoWandb` without --wandb); a
    stand-in that does nothing on the other ranks. A new run starts the file afresh; a resumed one
    keeps the records up to its checkpoint's step."""
    def __init__(self, path, active, resume_step=None, wandb_run=None):
        self.path, self.active = path, active
        self.wandb = wandb_run or NoWandb()
        if active and resume_step is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        elif active:
            self.truncate(resume_step)

    def truncate(self, step):
        """Drop the records after `step` (the steps a killed run logged after its checkpoint, and a
        line it may have left half-written)."""
        lines = open(self.path).read().splitlines(keepends=True)
        kept = []                                           # (line, record)
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:                     # the kill cut the last line short
                    break
                raise ValueError(f"{self.path} line {i + 1} is not JSON: {line[:80]!r}; repair or remove it") from None
            if record["step"] > step:
                break
            kept.append((line, record))
        logged = [record["step"] for _, record in kept if "reward" in record]
        if logged != list(range(1, step + 1)):
            raise ValueError(f"{self.path} does not hold one record for each step up to the checkpoint's {step} "
                             f"(it has {logged[:3]}...{logged[-3:]}); resume needs the run's own metrics.jsonl")
        with open(self.path + ".tmp", "w") as f:           # each line whole: one cut before its newline gets it
            f.writelines(line if line.endswith("\n") else line + "\n" for line, _ in kept)
        os.replace(self.path + ".tmp", self.path)

    def write(self, record):
        if self.active:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            self.wandb.log(record, step=record["step"])


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


def evaluate(engine, eval_prompts, eval_gold, eval_indices, args, device):
    sums = eval_counts(engine, eval_prompts, eval_gold, args.eval_k, args.eval_temperature, args.max_response_len,
                       args.seed, eval_indices)
    return accuracies(all_sum(sums, device))


class StopSignals:
    """SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) ask the run to stop: every rank
    finishes its step, and at the step's end the ranks agree (an all-reduce: one rank's signal
    stops them all), write a checkpoint and exit cleanly. Repeated signals change nothing.

    So does the end of the launcher: torchrun starts its workers in sessions of their own, so a
    `kill -9` of torchrun (or of its process group) leaves them running, still writing into --out.
    A worker started by torchrun (TORCHELASTIC_RUN_ID is set) remembers its parent; once its
    parent is another process (the launcher died and it was re-parented), it stops as on SIGTERM."""
    def __init__(self):
        self.received = None
        self.previous = {s: signal.signal(s, self._receive) for s in (signal.SIGTERM, signal.SIGINT)}
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

    def _receive(self, signum, frame):
        if self.received is None:
            print(f"received {signal.Signals(signum).name}: finishing this step, then writing a checkpoint", flush=True)
        self.received = signum

    def agreed(self, device):
        if self.launcher is not None and os.getppid() != self.launcher and self.received is None:
            print(f"the launcher (pid {self.launcher}) is gone: finishing this step, then writing a checkpoint", flush=True)
            self.received = "launcher gone"
        flag = torch.tensor([float(self.received is not None)], device=device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def load_checkpoint(path, policy, optimizer, teacher):
    """checkpoint.load, or a stop that names the checkpoint that failed and the one before it."""
    try:
        return checkpoint.load(path, policy, optimizer, teacher)
    except checkpoint.LOAD_ERRORS as e:          # any failure to read it; re-raised with what to do
        step = int(checkpoint.STEP_DIR.fullmatch(os.path.basename(os.path.normpath(path))).group(1))
        earlier = [p for s, p in checkpoint.complete(os.path.dirname(os.path.dirname(path))) if s < step]
        instead = f"the previous one is {earlier[-1]}: resume from it with --resume {earlier[-1]}" if earlier else \
            "there is no earlier checkpoint: start the run afresh"
        raise RuntimeError(f"--resume: the checkpoint {path} cannot be loaded ({type(e).__name__}: {e}); {instead}, "
                           f"or move {path} away") from e


def check_fingerprints(path, now):
    """Refuse to resume checkpoint `path` on other training questions or another start model."""
    saved = checkpoint.read_trainer_state(path).get("fingerprints")
    if saved is None:
        print(f"resume: {path} was written before checkpoints held fingerprints: the training questions and the "
              f"start model are not checked")
        return
    changes = checkpoint.fingerprint_changes(saved, now)
    if changes:
        raise ValueError(f"--resume {path}: the run's inputs changed since the checkpoint: " + "; ".join(changes)
                         + ". Resume with the data and model it was trained on, or start a new run; nothing was run")


def prepare_resume(out, step, steps):
    """Rank 0, on resume: what the run wrote after the checkpoint belongs to a future that will be
    rewritten: checkpoints of later steps, and a final/ model from before. They are moved, not
    deleted, into OUT/superseded/TIME/, and the run says so."""
    later = [path for s, path in checkpoint.complete(out) if s > step]
    final = os.path.join(out, "final")
    later += [final] if os.path.exists(final) and step < steps else []
    if not later:
        return
    aside = os.path.join(out, "superseded", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(aside, exist_ok=True)
    for path in later:
        shutil.move(path, os.path.join(aside, os.path.basename(path)))
    print(f"resume from step {step}: moved {', '.join(os.path.basename(p) for p in later)}, written after it, "
          f"into {aside}; delete that folder once it is not wanted")


def main(argv=None):
    args = parse_args(argv)
    resume = None
    if args.resume is not None:
        args, resume = resume_settings(args, given_flags(argv))
    check_settings(args, int(os.environ.get("WORLD_SIZE", 1)))
    rank, world_size, device = init_distributed()
    locks = lock_out(args.out, rank)                 # noqa: F841  (held open until the process ends)
    if resume is None:
        claim_out(args.out, args.overwrite, rank)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import world
    from rollout import make_engine, request_seed

    classroom = args.data == "classroom"
    model_dir = args.model or world.base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # question -> prompt ids, encoded once: drop_long sees every prompt, the steps reuse them
    encode = functools.lru_cache(maxsize=None)(data.prompt_encoder(tokenizer, classroom))
    rephrasings = "both" if args.views == "both" or args.teacher_prompts == "rephrased" else "original"
    pairs, args.test_time_training = (data.classroom_pairs("train"), False) if classroom else \
        data.load_training(args.data, rephrasings)
    if args.test_time_training and rank == 0:
        print(f"test-time training: the training questions are {args.data}'s test questions (as TTRL)")
    if rephrasings == "original":                     # the rephrasings are not sampled: not read, not checked
        pairs = [dataclasses.replace(p, rephrased=None) for p in pairs]
    pairs = data.drop_long(pairs, encode, args.max_prompt_len)
    fingerprints = {"questions": checkpoint.questions_fingerprint(pairs), "model": checkpoint.model_fingerprint(model_dir)}
    if resume is not None:                          # before anything slow: the data and model it was trained on
        check_fingerprints(resume, fingerprints)
    if args.steps is None:
        args.steps = max(1, int(args.epochs * len(pairs) / args.questions_per_step))
    eval_prompts, eval_gold = benchmark_prompts(tokenizer, args.eval_data, args.eval_limit, args.max_prompt_len)
    eval_indices = range(rank, len(eval_prompts), world_size)     # each rank evaluates its share
    eval_prompts, eval_gold = eval_prompts[rank::world_size], eval_gold[rank::world_size]

    # Built sharded: no rank ever holds a whole model on its device. The policy keeps fp32 weights for
    # AdamW and computes in --dtype. The KL anchor is the frozen start model, kept in --dtype as it only
    # runs forwards, or for the teacher methods the EMA teacher (which also samples), fp32 for its averaging.
    dtype = getattr(torch, args.dtype)
    policy = load_sharded(model_dir, device, torch.float32, dtype, args.activation_checkpointing)
    teacher_method = args.method in TEACHER_METHODS
    ref = load_sharded(model_dir, device, torch.float32 if teacher_method else dtype, dtype).requires_grad_(False)
    teacher = ref if teacher_method else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(args.steps, args.warmup_ratio))
    engine = make_engine(args.backend, model_dir, args.max_prompt_len, args.max_response_len,
                         dtype=args.dtype, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
                         gpu_memory_utilization=args.gpu_memory_utilization)
    # the node's cores, shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE), not the whole world
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, os.cpu_count() // local_ranks))))
    step_cfg = StepConfig(args.temperature, args.clip_eps, args.kl_coef, args.mini_batches, args.micro_batch_size,
                          args.max_tokens_per_micro_batch or None, args.max_grad_norm, args.defer_grad_sync)
    # The loop's random state: the data shuffle, and the global torch RNG behind the mini-batch order
    # (seeded after the engine starts, as vLLM seeds the global RNG with its own seed).
    torch.manual_seed(args.seed)
    shuffle = torch.Generator().manual_seed(args.seed)
    order, cursor, start = torch.randperm(len(pairs), generator=shuffle).tolist(), 0, 0
    wandb_id = secrets.token_hex(4)                               # kept in checkpoints: a resumed run continues it
    if resume is not None:
        state = load_checkpoint(resume, policy, optimizer, teacher)
        wandb_id = state.get("wandb_id") or wandb_id
        scheduler.load_state_dict(state["scheduler"])
        shuffle.set_state(state["shuffle"])
        order, cursor, start = state["order"], state["cursor"], state["step"]
        engine.load_weights(full_weights(policy, engine.dtype))        # the engine samples from the resumed policy
        if rank == 0:
            prepare_resume(args.out, start, args.steps)
            print(f"resumed from {resume} (step {start} of {args.steps})")
    wandb_run = start_wandb(args.wandb, wandb_id, config_of(args)) if args.wandb and rank == 0 else None
    log = MetricsLog(os.path.join(args.out, "metrics.jsonl"), rank == 0, resume_step=start if resume else None,
                     wandb_run=wandb_run)
    watch = CollapseWatch()
    if rank == 0:
        print(json.dumps(config_of(args), indent=1))
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(config_of(args), f, indent=1)

    def run_eval(step):
        acc = evaluate(engine, eval_prompts, eval_gold, eval_indices, args, device)
        record = {"step": step, "eval_acc": acc["mean"], "eval_greedy": acc["greedy"], "eval_maj": acc["maj"]}
        log.write(record)
        if rank == 0:
            tqdm.write(f"eval @ step {step}: mean@{args.eval_k} {acc['mean']:.3f}  greedy {acc['greedy']:.3f}  maj@{args.eval_k} {acc['maj']:.3f}")
        return record

    def save(step):
        trainer_state = {"scheduler": scheduler.state_dict(), "order": order, "cursor": cursor, "shuffle": shuffle.get_state(),
                         "wandb_id": wandb_id, "fingerprints": fingerprints}
        t0 = time.perf_counter()
        path = checkpoint.save(args.out, step, policy, optimizer, teacher, trainer_state, config_of(args), tokenizer,
                               args.keep_last)
        if rank == 0:
            tqdm.write(f"saved {path} ({time.perf_counter() - t0:.1f} s)")

    if start == 0:
        run_eval(0)
    per_rank = args.questions_per_step // world_size
    signals, stopped = StopSignals(), False
    bar = tqdm(range(start + 1, args.steps + 1), disable=rank != 0, desc=args.method, initial=start, total=args.steps)
    try:
        for step in bar:
            if cursor + args.questions_per_step > len(order):              # a new epoch
                order, cursor = torch.randperm(len(pairs), generator=shuffle).tolist(), 0
            indices = order[cursor + rank * per_rank: cursor + (rank + 1) * per_rank]    # this rank's questions
            mine = [pairs[i] for i in indices]
            cursor += args.questions_per_step

            t0 = time.perf_counter()
            # originals, then (--views both) rephrasings; each request seeded by who samples which question at which step
            views = (0, 1) if args.views == "both" else (0,)
            prompts = lambda views: [encode(p.rephrased if view else p.original) for view in views for p in mine]
            seeds = lambda role, views: [request_seed(args.seed, role, step, i, view) for view in views for i in indices]
            groups = engine.generate(prompts(views), args.group_size, args.temperature, args.max_response_len,
                                     seeds=seeds("policy", views))

            teacher_answers = None
            if teacher is not None:
                # the engine now serves the teacher, until the updated policy is loaded after the step;
                # coreward3's teacher answers the rephrasings of the policy's questions
                teacher_views = (1,) if args.teacher_prompts == "rephrased" else views
                teacher_groups = teacher_rollout(engine, teacher, prompts(teacher_views), seeds("teacher", teacher_views),
                                                 args.group_size, args.temperature, args.max_response_len)
                teacher_answers = [[extract_answer(s.text) for s in g] for g in teacher_groups]
            t1 = time.perf_counter()

            gold = [p.answer for p in mine] * len(views)
            answers = [[extract_answer(s.text) for s in g] for g in groups]
            batch = make_batch([s for g in groups for s in g], tokenizer.pad_token_id or 0, device)
            if args.method in TWO_VIEW_METHODS:      # J(q) + J(q'): one token mean per view (grpo.py, NORMALISATION)
                batch.view = torch.arange(len(views), device=device).repeat_interleave(len(mine) * args.group_size)
            if args.method in ANSWER_FREE_METHODS:
                labels = None
                per_token = functools.partial(certainty_per_token, args.method)
                rewards = score_responses(policy, batch, step_cfg, per_token).view(len(groups), args.group_size).cpu()
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
            engine.load_weights(full_weights(policy, engine.dtype))
            t3 = time.perf_counter()

            sums = all_sum({
                **{k: v for k, v in stats.items() if k != "grad_norm"},
                "responses": rewards.numel(), "groups": len(groups),
                "reward": rewards.sum().item(),
                "correct": sum(is_equiv(a, g) for group, g in zip(answers, gold) for a in group),
                "no_answer": sum(a is None for group in answers for a in group),
                "truncated": sum(not s.finished for g in groups for s in g),
                "label_correct": sum(is_equiv(label, g) for label, g in zip(labels or [], gold)),
                **group_diagnostics(answers, rewards),
            }, device)
            n, tokens = sums["responses"], sums["tokens"]
            votes = [None] * world_size
            dist.all_gather_object(votes, [majority_vote(group) for group in answers])   # every rank's groups
            record = {
                "step": step, "responses": int(n), "reward": sums["reward"] / n, "rollout_acc": sums["correct"] / n,
                "label_acc": None if labels is None else sums["label_correct"] / sums["groups"],
                "no_answer": sums["no_answer"] / n,
                # label-free: what a run without labels can watch (CollapseWatch)
                "unanimous": sums["unanimous"] / sums["groups"], "distinct_answers": sums["distinct"] / sums["groups"],
                "zero_variance": sums["zero_variance"] / sums["groups"],
                "common_answer": common_answer_share([v for rank_votes in votes for v in rank_votes]),
                "truncated": sums["truncated"] / n,
                "kl": sums["kl_sum"] / tokens, "entropy": sums["entropy_sum"] / tokens,
                "response_len": tokens / n, "clip_frac": sums["clipped_sum"] / tokens,
                "grad_norm": stats["grad_norm"], "lr": lr,
                "sampler_gap": sums["sampler_gap_sum"] / tokens,
                "t_rollout": t1 - t0, "t_train": t2 - t1, "t_sync": t3 - t2,
                **({"ema_alpha": alpha} if teacher is not None else {}),
            }
            log.write(record)
            warning = watch.update(record)
            if warning and rank == 0:
                tqdm.write(warning)
            bar.set_postfix(reward=f"{record['reward']:.2f}", acc=f"{record['rollout_acc']:.2f}",
                            label_acc="-" if labels is None else f"{record['label_acc']:.2f}")
            if not record["sampler_gap"] <= args.max_sampler_gap:
                raise RuntimeError(f"step {step}: the rollout engine's log-probs differ from the trainer's by "
                                   f"{record['sampler_gap']:.3f} per token (> --max_sampler_gap {args.max_sampler_gap}): "
                                   f"the engine is not running the trainer's weights. Check the weight sync "
                                   f"(names and dtypes the engine expects), or raise the limit for low-precision engines.")
            if step % args.eval_every == 0 or step == args.steps:
                run_eval(step)
            stopped = signals.agreed(device) and step < args.steps          # at the last step, simply finish
            if stopped or (args.save_every and (step % args.save_every == 0 or step == args.steps)):
                save(step)
            if stopped:
                if rank == 0:
                    print(f"stopped after step {step} of {args.steps}; continue with: --out {args.out} --resume")
                break
        if not stopped:
            # the full fp32 weights, gathered into rank 0's CPU memory only
            weights = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:              # written as final.partial/, so that a crash never leaves a final/ that is not
                final = os.path.join(args.out, "final")
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                model.load_state_dict(weights)
                shutil.rmtree(final + ".partial", ignore_errors=True)
                model.save_pretrained(final + ".partial")
                tokenizer.save_pretrained(final + ".partial")
                checkpoint.fsync_files(final + ".partial")
                checkpoint.publish(final + ".partial", final)
                print(f"saved {final}")
    finally:
        signals.restore()
        log.wandb.finish()
    dist.barrier()
    engine.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
