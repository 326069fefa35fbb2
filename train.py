"""Label-free GRPO for math reasoning: Co-rewarding-I, -II and -III, and their baselines.

    python train.py --method coreward1                       # the classroom world, a few minutes on a CPU
    python train.py --ranks 2 --method majority              # each rank samples and trains its share
    python train.py --ranks 8 --method coreward1 --model Qwen/Qwen3-4B-Base --data openrs

One step (`training_step`):
1. take P questions, each rank P / world_size; the two-view methods (coreward1, coreward3) with their rephrasings q';
2. sample G responses to each question (and view) with the rollout engine (rollout.py);
3. label each group and reward each response (rewards.py: a method is one row of METHOD_TABLE, saying who
   votes for a group's label, what the EMA teacher of teacher.py answers, the KL anchor and the reward), then shape
   overlong responses' rewards and filter the groups (grpo.shape_and_filter; with a filter, DAPO's `refill`);
4. the update (grpo.update): normalise each group's rewards into advantages, and take the update(s) of the policy
   loss with its k3 KL term to the start model (or to the teacher); by default a two-view method's loss is
   J(q) + J(q'), one token mean per view;
5. move the teacher towards the policy (EMA), and load the updated weights into the engine.

`main` sets up and runs the loop (`train`): a step, its record, an evaluation every --eval_every steps, a
checkpoint every --save_every. Settings are config.py's; the run's folder, checkpoints, restarts and signals are
the harness's (harness/README.md). Nothing non-finite reaches the weights: the run stops before the update.

The step's collectives, in order (every rank reaches each, or the ranks wait for ever):
- the teacher methods: the teacher's weights into the engine (`sync_engine_weights`: all-gathers, then a verdict);
- the answer-free methods: the responses' scores (`score_responses`: a MAX all-reduce of the passes, FSDP's gathers);
- `--group_filter`: the questions with a kept group, on the worst rank (`refill`: a MIN all-reduce a round);
- `--advantage_std batch`: the step's rewards' count, sum and sum of squares (`batch_std`, an all-reduce);
- `train_step`: the reference's log-probs (as the scores), then for each update the normalisers
  (`loss_normalizers_over_ranks`, an all-reduce), the count of passes, FSDP's all-gathers and reduce-scatters,
  the count of non-finite values (an all-reduce) and the gradient norm (`clip_grad_norm_`);
- the updated policy's weights into the engine (`sync_engine_weights`, as the teacher's);
- the step's record (`step_record_over_ranks`: an all-reduce of the sums, an all-gather of the votes).
The loop adds the evaluations' all-reduce (`all_sum`), the stop signals' (`StopSignals.agreed_over_ranks`) and the
checkpoints' barriers.
"""
import dataclasses
import functools
import math
import os
import secrets
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import config
import grpo
from eval import accuracies, benchmark_prompts, eval_counts
from grpo import StepConfig, make_batch, score_responses
from harness import checkpoint, data, launch, resume, runfolder, watches
from harness.data import Questions
from harness.answers import extract_answer
from harness.errors import STOPPED, NonFiniteError, check_groups, exit_on_usage_error
from harness.record import Step, step_record_over_ranks
from harness.sharding import all_sum, init_distributed, load_sharded, sync_engine_weights
from rewards import METHODS, label_groups
from rollout import make_engine, request_seed
from teacher import ema_alpha, ema_update, teacher_rollout


@dataclasses.dataclass
class Models(checkpoint.Trained):
    """What a step samples and trains with: the policy, its optimizer and schedule, and the EMA teacher (or None),
    which a checkpoint saves (checkpoint.Trained), and:"""
    ref: torch.nn.Module                  # the KL anchor: the frozen start model, or the EMA teacher
    engine: object                        # rollout.py's engine: it samples from the policy, and the teacher
    pad_id: int


@dataclasses.dataclass
class Round:
    """One round of sampling and rewarding: its groups, the originals of its questions, then their rephrasings."""
    ids: list                     # [groups] each group's (question index, view)
    groups: list                  # [groups][G] rollout.Sample
    answers: list                 # [groups][G] extracted answers
    gold: list                    # [groups] ground truth
    labels: list | None           # [groups] (None: an answer-free method)
    rewards: torch.Tensor         # [groups, G] the method's rewards,
    shaped: torch.Tensor          # [groups, G] shaped by --overlong (grpo.shape_and_filter, once a round),
    weight: torch.Tensor          # [groups, G] each response's loss weight,
    keep: torch.Tensor            # [groups] bool: and the groups kept by --group_filter
    rounds: int = 1               # the rounds of sampling it holds (DAPO's refill)


def training_step(args, step, questions, models, encode, step_cfg, device, world_size):
    """One step (the docstring's 2-5) on this rank's share of the questions: its record."""
    t0 = time.perf_counter()
    sampled = sample_and_reward(args, step, 0, *questions.take(args.questions_per_step, dist.get_rank(), world_size),
                                models, encode, step_cfg, device)
    if args.group_filter != "none":               # DAPO: more rounds while a rank lacks questions with a signal
        sampled = refill(sampled, args, step, questions, models, encode, step_cfg, device, world_size)
    t1 = time.perf_counter()

    # 4. the update: the advantages, and the policy loss with its KL term (grpo.py, THE LOSS FAMILY)
    batch = make_batch([s for g in sampled.groups for s in g], models.pad_id, device)
    if args.views == "both":                      # J(q) + J(q'): one token mean per view (grpo.py, LOSS_AGG_TABLE)
        batch.view = torch.tensor([v for _, v in sampled.ids], device=device).repeat_interleave(args.group_size)
    lr = models.scheduler.get_last_lr()[0]                                        # the rate this step's updates use
    try:
        stats = grpo.update(models.policy, models.ref, models.optimizer, batch, sampled.shaped, sampled.weight,
                            sampled.keep, step_cfg, world_size)
    except NonFiniteError as e:
        raise NonFiniteError(f"step {step}: {e} The run stopped; metrics.jsonl holds the steps before it.") from None
    models.scheduler.step()

    # 5. the teacher follows the policy (EMA), and the engine gets the updated policy
    alpha = ema_alpha(step, args.steps, args.ema_start, args.ema_end) if models.teacher is not None else None
    if alpha:                                     # 0 after the last step: nothing samples from the teacher then
        ema_update(models.teacher, models.policy, alpha)
    t2 = time.perf_counter()
    sync_engine_weights(models.engine, models.policy)
    times = {"t_rollout": t1 - t0, "t_train": t2 - t1, "t_sync": time.perf_counter() - t2}
    seen = Step(step, sampled.groups, sampled.answers, sampled.gold, sampled.labels, sampled.rewards, sampled.shaped,
                sampled.keep, grpo.zero_variance(sampled.rewards), stats, [v for _, v in sampled.ids], lr, alpha, times)
    record = step_record_over_ranks(seen, device, world_size)
    return {**record, "rounds": sampled.rounds} if args.group_filter != "none" else record


def sample_and_reward(args, step, round_, indices, questions, models, encode, step_cfg, device):
    """A round: sample G responses to this rank's `questions` (`indices` into the data), label and reward them (the
    docstring's 2 and 3). A refill round's requests are seeded under step+round, the first's under the step alone."""
    # 2. sample: originals, then (--views both) rephrasings; a request is seeded by who samples which question when
    key, views = step if round_ == 0 else f"{step}+{round_}", (0, 1) if args.views == "both" else (0,)
    ids = [(i, view) for view in views for i in indices]                     # [groups] each group's question, view
    prompts = [encode(q.rephrased if view else q.original) for view in views for q in questions]
    groups = models.engine.generate(prompts, args.group_size, args.temperature, args.max_response_len,
                                    seeds=[request_seed(args.seed, "policy", key, i, view) for i, view in ids])
    check_groups(groups, prompts, ids, args.group_size, "the policy")
    teacher_answers = teacher_answers_of(args, key, indices, questions, models, encode) \
        if models.teacher is not None else None
    models.engine.sleep()                         # on a GPU, its memory goes to the training phase until the sync

    # 3. label and reward; rewards.twin(i) = (i + P) mod 2P pairs a group with its other view: the originals first,
    # then their rephrasings in the same order, as asked for (prompts) and as check_groups found them
    gold = [q.answer for q in questions] * len(views)
    answers = [[extract_answer(s.text) for s in g] for g in groups]
    method = METHODS[args.method]                 # its row of rewards.METHOD_TABLE
    if method.labels is None:                     # a reward of the response's tokens, under the policy
        batch = make_batch([s for g in groups for s in g], models.pad_id, device)
        labels, rewards = None, score_responses(models.policy, batch, step_cfg, method.reward).cpu()
        rewards = rewards.view(len(groups), args.group_size)
    else:
        labels, voters = label_groups(args.method, answers, gold, teacher_answers)
        rewards = torch.tensor(grpo.call(method.reward, answers=answers, labels=labels, voters=voters,
                                         teacher_answers=teacher_answers,
                                         seeds=[request_seed(args.seed, "reward", key, i, view) for i, view in ids],
                                         replayed=runfolder.replayed_rewards(args.replay, step)))
    lengths = torch.tensor([[len(s.token_ids) for s in g] for g in groups], dtype=torch.float)
    truncated = torch.tensor([[not s.finished for s in g] for g in groups])
    return Round(ids, groups, answers, gold, labels, rewards,
                 *grpo.shape_and_filter(rewards, lengths, truncated, step_cfg))       # the group filter, once


def teacher_answers_of(args, key, indices, questions, models, encode):
    """The teacher methods' answers [groups][G] to the policy's prompts (coreward2_rephrased's: their rephrasings),
    seeded under `key`. The engine serves the teacher until the step's sync."""
    views = (1,) if args.teacher_prompts == "rephrased" else (0, 1) if args.views == "both" else (0,)
    ids = [(i, view) for view in views for i in indices]
    prompts = [encode(q.rephrased if view else q.original) for view in views for q in questions]
    groups = teacher_rollout(models.engine, models.teacher, prompts,
                             [request_seed(args.seed, "teacher", key, i, view) for i, view in ids], args.group_size,
                             args.temperature, args.max_response_len)
    check_groups(groups, prompts, ids, args.group_size, "the teacher")
    return [[extract_answer(s.text) for s in g] for g in groups]


def refill(first, args, step, questions, models, encode, step_cfg, device, world_size):
    """DAPO's dynamic sampling, after the first round: while a rank is short of questions with a kept group (a MIN
    all-reduce: the ranks take their rounds together), another round, up to --refill_rounds more. The step then
    trains on this rank's share of the rounds' questions in the order sampled, those with a kept group first, then
    (when the rounds ran out) the others, whose groups the filter leaves at loss weight 0."""
    rounds, views = [first], 2 if args.views == "both" else 1
    share = len(first.ids) // views                                      # this rank's questions a step
    while True:
        fewest = torch.tensor(sum(int(r.keep.view(views, share).any(0).sum()) for r in rounds), device=device)
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN)                 # questions with a kept group, on the worst rank
        short = max(share - int(fewest), 0)
        if not short or len(rounds) > args.refill_rounds:
            break
        sync_engine_weights(models.engine, models.policy)    # the engine slept (or served the teacher): the policy
        rounds.append(sample_and_reward(args, step, len(rounds), *questions.take(
            args.questions_per_step, dist.get_rank(), world_size), models, encode, step_cfg, device))
    if short and args.refill_rounds and dist.get_rank() == 0:
        tqdm.write(f"step {step}: a rank is {short} question(s) short of its {share} with a signal after "
                   f"{len(rounds)} rounds (--refill_rounds {args.refill_rounds} spent); it trains on those it has, "
                   f"the others at loss weight 0")
    if len(rounds) == 1:
        return first
    signal = [r.keep.view(views, share).any(0) for r in rounds]          # [rounds][share] a question with a kept group
    places = [(r, q) for wanted in (True, False) for r in range(len(rounds)) for q in range(share)
              if bool(signal[r][q]) == wanted][:share]
    rows = [(r, v * share + q) for v in range(views) for r, q in places]       # the originals, then the rephrasings
    picked = {f.name: [getattr(rounds[r], f.name)[i] for r, i in rows] for f in dataclasses.fields(Round)
              if f.name != "rounds" and getattr(first, f.name) is not None}
    tensors = {name: torch.stack(picked[name]) for name in ("rewards", "shaped", "weight", "keep")}
    return Round(**{"labels": None, **picked, **tensors, "rounds": len(rounds)})


def training_questions(args, encode, rank):
    """(pairs, a line for run.log or None): the training questions (data.Pair) whose prompts fit --max_prompt_len,
    without rephrasings where none is sampled; with --rephrase_noise, a share with another's (the line says how many)."""
    rephrasings = "both" if args.views == "both" or args.teacher_prompts == "rephrased" else "original"
    pairs, test_time_training = (data.classroom_pairs("train"), False) if args.data == "classroom" else \
        data.load_training(args.data, rephrasings)
    if test_time_training and rank == 0:
        print(f"test-time training: the training questions are {args.data}'s test questions (as TTRL)")
    if rephrasings == "original":                     # the rephrasings are not sampled: not read, not checked
        pairs = [dataclasses.replace(p, rephrased=None) for p in pairs]
    views = lambda pair: [encode(q) for q in (pair.original, pair.rephrased) if q is not None]
    pairs, noise = data.mismatch_rephrasings(data.drop_long(pairs, views, args.max_prompt_len, "pairs"),
                                             args.rephrase_noise, args.seed)        # --rephrase_noise: the control
    return pairs, noise if args.rephrase_noise else None


def build_models(args, model_dir, device, pad_id):
    """Policy, KL anchor (and teacher), optimizer, schedule and rollout engine, sharded: no rank holds a whole
    model. The policy keeps fp32 weights for AdamW and computes in --dtype; the EMA teacher is fp32 for its
    averaging; a frozen start model as KL anchor is kept in --dtype, as it only runs forwards."""
    dtype = getattr(torch, args.dtype)
    method = METHODS[args.method]
    policy = load_sharded(model_dir, device, torch.float32, dtype, args.activation_checkpointing, args.compile_layers)
    frozen = lambda weights: load_sharded(model_dir, device, weights, dtype,
                                          compile_layers=args.compile_layers).requires_grad_(False)
    teacher = frozen(torch.float32) if method.teacher is not None else None
    ref = teacher if method.kl_anchor == "teacher" else frozen(dtype)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(args.steps, args.warmup_ratio))
    engine = make_engine(args.backend, model_dir, args.max_prompt_len, args.max_response_len, dtype=args.dtype,
                         cpu_kv_cache_gib=args.cpu_kv_cache_gib, gpu_memory_utilization=args.gpu_memory_utilization,
                         hf_kv_budget_gib=args.hf_kv_budget_gib)
    return Models(policy, optimizer, scheduler, teacher, ref, engine, pad_id)


def cosine_with_warmup(total_steps, warmup_ratio):
    """The learning-rate factor of training step `step` (0-based): a linear warm-up over the first
    max(1, int(total_steps * warmup_ratio)) steps, then a cosine from 1 towards 0. It counts steps, not
    optimizer updates: a step's mini-batch updates share one rate."""
    warmup = max(1, int(total_steps * warmup_ratio))
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
    return factor


def evaluate(step, engine, eval_set, args, device, log, rank, tokenizer):
    """Evaluate the engine's model on the evaluation questions, every rank its share; log the record, and
    on rank 0 its first --eval_samples questions' responses to samples.jsonl (`runfolder.write_samples`)."""
    prompts, gold, indices = eval_set
    sums, examples = eval_counts(engine, prompts, gold, args.eval_k, args.eval_temperature, args.max_response_len,
                                 args.seed, indices, keep=args.eval_samples if rank == 0 else 0)
    runfolder.write_samples(args.out, step, examples, tokenizer)
    acc = accuracies(all_sum(sums, device), args.eval_k)
    log.write({"step": step, "eval_acc": acc["avg"], "eval_greedy": acc["greedy"], "eval_maj": acc["maj"],
               "eval_boxed": acc["boxed"], "eval_pass": acc.get("pass")})             # pass@k: none at --eval_k 0
    if rank == 0:
        shown = f"avg@{args.eval_k} {acc['avg']:.3f}  greedy {acc['greedy']:.3f}  maj@{args.eval_k} {acc['maj']:.3f}" \
            if args.eval_k else f"greedy {acc['greedy']:.3f}"              # --eval_k 0: greedy only
        tqdm.write(f"eval @ step {step}: {shown}")


def read_inputs(args, resume_from, rank, world_size):
    """Every input of the run, read and checked before --overwrite deletes an earlier run: the model folder, its
    tokenizer, the prompt encoder, the training questions, their fingerprints (checked against a resumed checkpoint's)
    and this rank's share of the evaluation questions (prompts, gold answers, their indices). Sets --steps from
    --epochs."""
    from harness import world
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging
    model_dir = checkpoint.model_folder_for_all_ranks(args.model) if args.model else world.base_model_dir()
    transformers_logging.disable_progress_bar()      # the bars of loads and saves, each over in a moment
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # question -> prompt ids, encoded once: drop_long sees every prompt, the steps reuse them
    encode = functools.lru_cache(maxsize=None)(data.prompt_encoder(tokenizer, args.data == "classroom"))
    pairs, noise = training_questions(args, encode, rank)
    warning = data.unknown_token_warning(tokenizer, [encode(q) for p in pairs for q in (p.original, p.rephrased)
                                                     if q is not None], "training prompts")
    if warning and rank == 0:
        print(warning)
    fingerprints = {"questions": checkpoint.questions_fingerprint(pairs),
                    "model": checkpoint.model_fingerprint(model_dir)}
    if resume_from is not None:                     # before anything slow: the data and model it was trained on
        resume.check_fingerprints(resume_from, fingerprints)
    if args.steps is None:
        args.steps = run_length(args.epochs, len(pairs), args.questions_per_step)
    leftover = len(pairs) % args.questions_per_step
    if leftover and args.steps * args.questions_per_step >= len(pairs) and rank == 0:
        print(f"each epoch leaves out {leftover} of its {len(pairs)} questions, the last of its shuffle: "
              f"--questions_per_step {args.questions_per_step} does not divide them (Questions.take)")
    prompts, gold = benchmark_prompts(tokenizer, args.eval_data, args.eval_limit, args.max_prompt_len)
    eval_set = prompts[rank::world_size], gold[rank::world_size], range(rank, len(prompts), world_size)
    return model_dir, tokenizer, encode, pairs, fingerprints, eval_set, noise


def run_length(epochs, pairs, questions_per_step):
    """The steps of --epochs over `pairs` questions, as the official trainer counts them: its dataloader's length
    (drop_last: pairs // questions_per_step) times the epochs (at least 1)."""
    return max(1, int(epochs * (pairs // questions_per_step)))


def show_step(step, record, bar, watchers, rank):
    """The console's view of a step: the progress bar's figures, and the watches' warnings (rank 0). The sampler
    gap's watch stops the run past its ceiling (watches.SamplerGapWatch)."""
    for warning in (watchers[0].update(record), watchers[1].check(step, record)):
        if warning and rank == 0:
            tqdm.write(warning)
    bar.set_postfix(reward=f"{record['reward']:.2f}", acc=f"{record['rollout_acc']:.2f}",
                    label_acc="-" if record["label_acc"] is None else f"{record['label_acc']:.2f}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # a launcher's restart of the run in --out continues it; --resume, with its checkpoint's settings
    start = resume.begin(config.parse_args(argv, __doc__), config.PRESETS, config.NOT_CONFIG)
    if start.finished:
        return
    args = config.settings(start.args, resumed=start.checkpoint is not None)
    if args.ranks and "WORLD_SIZE" not in os.environ:     # python train.py --ranks N: start the N ranks here
        return launch.launch_ranks(args.ranks, os.path.abspath(__file__), argv, args.max_restarts or 0, args.out)
    rank, world_size, device = init_distributed(start.store)
    with runfolder.locked(args.out, rank, start.run_id):          # no other run on --out, until this one returns
        earlier = runfolder.earlier_outputs(args.out, args.overwrite, rank) if start.checkpoint is None else []
        inputs = read_inputs(args, start.checkpoint, rank, world_size)
        runfolder.remove_outputs(args.out, earlier, rank)          # only now: every input was read and checked
        with runfolder.console_log(args.out, rank):               # rank 0's console, also into OUT/run.log
            status = train(args, start.checkpoint, start.restart, inputs, rank, world_size, device)
    if dist.is_initialized():                       # the engine's close may have ended it already
        dist.destroy_process_group()
    return status


def train(args, resume_from, restart, inputs, rank, world_size, device):
    """Build the models, then the loop: a step, its record, an evaluation every --eval_every steps, a checkpoint every
    --save_every and at a stop signal. Returns STOPPED after a stop, else None."""
    model_dir, tokenizer, encode, pairs, fingerprints, eval_set, noise = inputs
    began = time.perf_counter()
    models, questions, start, log, watchers, wandb_id = set_up(args, resume_from, restart, model_dir, tokenizer, pairs,
                                                               noise, rank, world_size, device)
    if start == 0:
        evaluate(0, models.engine, eval_set, args, device, log, rank, tokenizer)
    signals, stopped, step_cfg = launch.StopSignals(args.out, rank), False, StepConfig.of(args)
    bar = tqdm(range(start + 1, args.steps + 1), disable=rank != 0, desc=args.method, initial=start, total=args.steps)
    try:
        for step in bar:
            record = training_step(args, step, questions, models, encode, step_cfg, device, world_size)
            log.write(record)
            show_step(step, record, bar, watchers, rank)
            if step % args.eval_every == 0 or step == args.steps:
                evaluate(step, models.engine, eval_set, args, device, log, rank, tokenizer)
            stopped = signals.agreed_over_ranks(device) and step < args.steps     # at the last step, simply finish
            if stopped or (args.save_every and (step % args.save_every == 0 or step == args.steps)):
                checkpoint.save_checkpoint(args, config.config_of(args), step, models, questions, wandb_id,
                                           fingerprints, tokenizer, rank, watchers[1].first)
            if stopped:
                break
        if not stopped:
            checkpoint.save_final(models.policy, model_dir, tokenizer, args.out, rank, args.preset)
            if rank == 0 and (line := log.learned(args.eval_k, time.perf_counter() - began, start)):
                print(line, flush=True)
    except BaseException:
        if world_size == 1:       # a run of one stopped by an error gives its engine back (a process may start another
            models.engine.close()  # run); with other ranks, the launcher ends them all
        raise
    finally:
        signals.restore()
        log.wandb.finish()
    if stopped and rank == 0:
        print(f"stopped after step {step} of {args.steps}; continue with: --out {args.out} --resume (status "
              f"{STOPPED}: a launcher's restart or requeue continues it)")
    dist.barrier()
    models.engine.close()
    return STOPPED if stopped else None


def set_up(args, resume_from, restart, model_dir, tokenizer, pairs, noise, rank, world_size, device):
    """The models, the question order and the watches, fresh or from the checkpoint `resume_from`, the metrics log and
    the run's first lines (rank 0): (models, questions, the step to start after, log, watches, the wandb run's id)."""
    models = build_models(args, model_dir, device, tokenizer.pad_token_id or 0)
    # the node's cores, shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE), not the world
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, os.cpu_count() // local_ranks))))
    # The loop's random state: the question order, and the global torch RNG behind the mini-batch order (seeded
    # after the engine starts, as vLLM seeds the global RNG with its own seed).
    torch.manual_seed(args.seed)
    questions, start, wandb_id = Questions.shuffled(pairs, args.seed), 0, secrets.token_hex(4)
    ceiling = watches.SAMPLER_GAP_CEILING[args.dtype] if args.max_sampler_gap is None else args.max_sampler_gap
    gap_watch, collapse_watch = watches.SamplerGapWatch(ceiling, args.sampler_gap_factor), watches.CollapseWatch()
    if resume_from is not None:
        start, saved_id, gap_watch.first = resume.restore(resume_from, models, questions, args, rank)
        sync_engine_weights(models.engine, models.policy)      # the engine samples from the resumed policy
        wandb_id = saved_id or wandb_id                       # kept in checkpoints: a resumed run continues it
    wandb_run = runfolder.start_wandb(args.wandb, wandb_id, config.config_of(args)) if args.wandb and rank == 0 \
        else None
    log = runfolder.MetricsLog(os.path.join(args.out, "metrics.jsonl"), rank == 0,
                               resume_step=start if resume_from else None, wandb_run=wandb_run)
    if rank == 0:
        path = runfolder.write_config(args.out, config.config_of(args))
        summary = config.summary(args, checkpoint.disk_bytes(models, args), path)
        for line in (restart and restart + resume.dropped_note(log.dropped), summary,
                     models.engine.weight_check_report(), noise):
            if line:
                print(line, flush=True)
    return models, questions, start, log, (collapse_watch, gap_watch), wandb_id


if __name__ == "__main__":
    sys.exit(exit_on_usage_error(main, "train.py"))
