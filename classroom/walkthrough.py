"""One Co-rewarding-I training step, stage by stage, with the values of the real step.

    OMP_NUM_THREADS=1 python classroom/walkthrough.py                            # print the step
    OMP_NUM_THREADS=1 python classroom/walkthrough.py --markdown WALKTHROUGH.md  # and rewrite its output blocks

It runs step 1 of `python train.py --method coreward1` (the classroom preset, seed 0) in one process, a
world of one, and calls the functions train.py's `training_step` calls, in its order, on the same 16
questions with the same request seeds (rollout.request_seed, role "policy", step 1). It prints what each
stage gives: the questions and their rephrasings, the sampled responses and their answers, each view's
vote and the cross-labels, the rewards, the group advantages, the loss's policy and KL terms, the update,
the weight sync and the step's line of metrics.jsonl (harness/record.py's `step_record_over_ranks`). Every question of the
step gets one line; one is shown in detail: the first of the step whose two groups both carry a learning
signal (rewards not all equal).

Then the Co-rewarding-II branch on the same questions: an EMA teacher, at step 1 a copy of the start
model, samples G responses to each original question (role "teacher"), its vote labels the student's
responses, and the EMA moves the teacher towards the policy that this step's update left.

WALKTHROUGH.md is the prose around these values: each of its output blocks (a ```text block after a
line `<!-- output: NAME -->`) is the block NAME printed here, and --markdown rewrites them in place, so
that the document shows what the code does now. Numbers are rounded to 4 significant digits (weights
to 9), and the output is the same on every run on one machine.
"""
import argparse
import functools
import os
import re
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # the loop's modules

import config  # noqa: E402
from harness import data  # noqa: E402
from harness import watches  # noqa: E402
import train  # noqa: E402
from harness import world  # noqa: E402
from harness.answers import extract_answer, is_equiv, majority_vote  # noqa: E402
from grpo import (grpo_loss, group_advantages, loss_normalizers_over_ranks, make_batch, score, train_step,  # noqa: E402
                  zero_variance)
from harness.record import Step, step_record_over_ranks  # noqa: E402
from rewards import agreement, label_groups, twin  # noqa: E402
from rollout import request_seed  # noqa: E402
from harness.sharding import gather_full_weights, init_distributed, load_sharded, sync_engine_weights  # noqa: E402
from teacher import ema_alpha, ema_update, teacher_rollout  # noqa: E402

STEP = 1                     # the step shown: the run's first
SHOWN = 4                    # responses per view of the detailed question whose text is printed
# the weight the update and the EMA are shown on: one near 0, where float32 resolves a move of 1e-7 to 4 digits
WEIGHT = ("model.layers.0.self_attn.q_proj.weight", (0, 1))
VIEW_NAMES = ("q ", "q'")
OUTPUT_BLOCK = re.compile(r"(<!-- output: (\w+) -->\n```text\n)(.*?)(```)", re.S)


# --------------------------------------------------------------------------------------------
# Printing

def num(x, digits=4):
    """x rounded to `digits` significant digits, never '-0'."""
    text = f"{x:.{digits}g}"
    return text.lstrip("-") if float(text) == 0 else text


def adv(x):
    """An advantage: signed, 3 decimals; '0' for zero."""
    text = f"{x:+.3f}"
    return "0" if float(text) == 0 else text


def ans(answer):
    """An extracted answer as the tables print it: '-' for none."""
    return "-" if answer is None else answer


def one_line(text):
    """A response's text on one line."""
    return text.strip().replace("\n", "\\n")


def bits(rewards):
    """A group's rewards in {0, 1} as one string of digits."""
    return "".join(str(int(r)) for r in rewards)


def show(blocks, name, title, lines):
    """Print one stage's block and keep it for the document."""
    blocks[name] = "\n".join([f"[{name}] {title}", *lines]) + "\n"
    print(blocks[name], flush=True)


def wrap(items, width=100):
    """Items joined by two spaces, in lines of at most `width` characters."""
    lines = [""]
    for item in items:
        if lines[-1] and len(lines[-1]) + 2 + len(item) > width:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + item
    return lines


def fill_document(path, blocks):
    """Rewrite each output block of the document at `path` with the printed block of that name."""
    with open(path) as f:
        text = f.read()
    names = [m.group(2) for m in OUTPUT_BLOCK.finditer(text)]
    missing, unknown = sorted(set(blocks) - set(names)), sorted(set(names) - set(blocks))
    if missing or unknown:
        raise SystemExit(f"{path}: no output block for {missing}; blocks this script does not print: {unknown}")
    text = OUTPUT_BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)] + m.group(4), text)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote the {len(names)} output blocks of {path}")


def weight_at(model, name, index):
    """One weight of a sharded model, as a Python float."""
    return float(dict(gather_full_weights(model))[name][index])


# --------------------------------------------------------------------------------------------
# The step

def walk():
    """Step 1 of the classroom coreward1 run, then the coreward2 branch: the printed blocks by name."""
    blocks = {}
    # as train.main: the settings, a world of one, the training questions, the models and the engine
    args = config.parse_args(["--method", "coreward1"])          # the classroom preset, as train.py's default run
    config.check_settings(args, 1)
    args.backend, _ = config.choose_backend(args.backend)        # auto: vLLM where it is installed, as config.settings
    rank, world_size, device = init_distributed()
    from transformers import AutoTokenizer
    model_dir = world.base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode = functools.lru_cache(maxsize=None)(data.prompt_encoder(tokenizer, args.data == "classroom"))
    pairs, _ = train.training_questions(args, encode, rank)
    models = train.build_models(args, model_dir, device, tokenizer.pad_token_id or 0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    step_cfg = train.StepConfig.of(args)
    torch.manual_seed(args.seed)                                  # after the engine has started, as train.main
    P, G, views = args.questions_per_step, args.group_size, (0, 1)
    warmup = max(1, int(args.steps * args.warmup_ratio))
    show(blocks, "settings", "config.py parse_args(['--method', 'coreward1']): the classroom preset", [
        f"method {args.method}  preset {args.preset}  views {args.views}  seed {args.seed}  backend {args.backend}",
        f"questions_per_step {P}  group_size {G}  temperature {args.temperature}  "
        f"max_response_len {args.max_response_len}",
        f"lr {args.lr} (warm-up over {warmup} of {args.steps} steps)  clip_eps {args.clip_eps}  "
        f"kl_coef {args.kl_coef}  mini_batches {args.mini_batches}",
        f"training pairs {len(pairs)}  policy parameters {sum(p.numel() for p in models.policy.parameters()):,}"])

    # 1. take the questions: P a step, from the run's shuffle of the pairs
    questions = train.Questions.shuffled(pairs, args.seed)
    indices, step_pairs = questions.take(P, rank, world_size)

    # 2. sample G responses to each view: the originals, then their rephrasings (group k + P is group k's twin)
    prompts = [encode(q.rephrased if view else q.original) for view in views for q in step_pairs]
    seeds = [request_seed(args.seed, "policy", STEP, i, view) for view in views for i in indices]
    groups = models.engine.generate(prompts, G, args.temperature, args.max_response_len, seeds=seeds)
    answers = [[extract_answer(s.text) for s in g] for g in groups]
    gold = [q.answer for q in step_pairs] * len(views)

    # 3. label (each view's vote labels the other view's responses) and reward
    votes = [majority_vote(g) for g in answers]
    labels = label_groups(args.method, answers, gold)[0]
    rewards = torch.tensor(agreement(answers, labels))                         # [2P, G]

    # 4. advantages: the rewards normalised within each group
    advantages = group_advantages(rewards)

    signal = lambda g: not (rewards[g] == rewards[g, 0]).all()
    k = next((k for k in range(P) if signal(k) and signal(k + P)), 0)          # the question shown in detail
    mine, pair = (k, k + P), step_pairs[k]
    show(blocks, "questions", "harness/data.py Questions.take: the step's questions", [
        f"step {STEP} takes the training pairs {indices}",
        f"shown in detail: pair {indices[k]}, question {k + 1} of the step (data.Pair):",
        f"  original   q : {pair.original}",
        f"  rephrased  q': {pair.rephrased}",
        f"  answer       : {pair.answer}   (the gold answer: the metrics read it, the reward never does)"])

    lines = [f"{len(groups)} groups ({P} questions x {len(views)} views) of {G} responses"]
    for view, g in zip(views, mine):
        lines += [f"{VIEW_NAMES[view]}: request seed {seeds[g]} = request_seed({args.seed}, 'policy', {STEP}, "
                  f"{indices[k]}, {view}); response j samples from seed + j"]
        shown = zip(groups[g][:SHOWN], answers[g])
        lines += [f'  {j}  "{one_line(s.text)}"  -> {ans(a)}' for j, (s, a) in enumerate(shown)]
        lines += [f"  answers of all {G}: {answers[g]}"]
    show(blocks, "sample", "rollout.py VLLMEngine.generate, harness/answers.py extract_answer", lines)

    show(blocks, "label", "harness/answers.py majority_vote, rewards.py label_groups('coreward1', ...)", [
        f"vote on q : {ans(votes[mine[0]])}    vote on q': {ans(votes[mine[1]])}    (gold {pair.answer})",
        f"label of the responses to q : {ans(labels[mine[0]])}  (the vote on group {twin(mine[0], 2 * P)}, q')",
        f"label of the responses to q': {ans(labels[mine[1]])}  (the vote on group {twin(mine[1], 2 * P)}, q)"])

    show(blocks, "reward", "rewards.py agreement: 1 when the answer equals the label", [
        f"{VIEW_NAMES[v]}: label {ans(labels[g])}  rewards {bits(rewards[g].tolist())}" for v, g in zip(views, mine)])

    show(blocks, "advantages", "grpo.py group_advantages: (r - mean) / (std + 1e-6), std with Bessel's correction", [
        f"{VIEW_NAMES[v]}: mean {num(rewards[g].mean().item())}  std {num(rewards[g].std().item())}  "
        f"advantages {' '.join(adv(a) for a in advantages[g].tolist())}" for v, g in zip(views, mine)])

    lines = [" pair  gold |  q: vote  rewards     A(1)    A(0) | q': vote  rewards     A(1)    A(0)",
             "            |  (labels q')                     |  (labels q)"]
    for j, i in enumerate(indices):
        row = f"{i:5d}  {ans(step_pairs[j].answer):>4} |"
        for g in (j, j + P):
            r, a = rewards[g], advantages[g]
            a1 = adv(a[r == 1][0].item()) if (r == 1).any() else "."
            a0 = adv(a[r == 0][0].item()) if (r == 0).any() else "."
            row += f" {ans(votes[g]):>8}  {bits(r.tolist())}  {a1:>6}  {a0:>6} |"
        lines.append(row[:-2])
    equal = sum(not signal(g) for g in range(2 * P))
    lines += [f"groups whose rewards are all equal (zero advantages, no signal): {equal} of {2 * P}",
              f"labels equal to the gold answer: {sum(is_equiv(lab, g) for lab, g in zip(labels, gold))} of {2 * P}"]
    show(blocks, "step", "every question of the step: votes, rewards, the advantage of a reward 1 and of a 0", lines)

    # 4. the update: the batch, the loss's two terms per view (the policy before the update), train_step
    batch = make_batch([s for g in groups for s in g], models.pad_id, device)
    batch.view = torch.arange(len(views), device=device).repeat_interleave(P * G)
    batch.advantages = advantages.flatten().to(device)
    logp, ref_logp = score(models.policy, batch, step_cfg), score(models.ref, batch, step_cfg)
    lines, total = [], 0.0
    for view in views:
        tokens, policy_term, kl_term, weighted = loss_terms(batch, logp, ref_logp, view, step_cfg, world_size)
        total += policy_term + kl_term
        lines.append(f"{VIEW_NAMES[view]}: {tokens} response tokens  policy term {num(policy_term)}  "
                     f"(-sum_i A_i n_i / N = {num(weighted)})  KL term {num(kl_term)}")
    lines.append(f"loss (the two views' terms summed): {num(total)}")
    show(blocks, "loss", "grpo.py grpo_loss: per view, the token mean of -min(rho A, clip(rho) A) + beta k3", lines)

    lr = models.scheduler.get_last_lr()[0]
    before = weight_at(models.policy, *WEIGHT)
    stats = train_step(models.policy, models.ref, models.optimizer, batch, step_cfg, world_size)
    models.scheduler.step()
    after = weight_at(models.policy, *WEIGHT)
    moved = max((p - r).abs().max().item() for (_, p), (_, r) in zip(gather_full_weights(models.policy),
                                                                     gather_full_weights(models.ref)))
    show(blocks, "update", "grpo.py train_step: the gradient of the loss, clipped, and one AdamW step", [
        f"grad_norm {num(stats.grad_norm)} (clipped to {args.max_grad_norm})  "
        f"clip_frac {num((stats.clipped_low_sum + stats.clipped_high_sum) / stats.tokens)}  kl {num(stats.kl_sum / stats.tokens)}",
        f"lr {num(lr)} (the warm-up's first step: {args.lr} x 1/{warmup})",
        f"{WEIGHT[0]}{list(WEIGHT[1])}: {before:.9g} -> {after:.9g} (change {num(after - before)})",
        f"largest |change| of a weight: {num(moved)} (lr {num(lr)})"])

    # 5. the EMA (coreward1 has no teacher), then the sync: the engine gets the updated policy
    sync_engine_weights(models.engine, models.policy)
    synced = sum(1 for _ in gather_full_weights(models.policy, models.engine.dtype))
    show(blocks, "sync", "harness/sharding.py sync_engine_weights: the updated policy's weights into the vLLM engine", [
        f"{synced} tensors ({models.engine.dtype}) for {len(list(models.policy.parameters()))} parameters, by their "
        f"Hugging Face names (a tied one under each of its names)",
        f"sampler_gap {stats.sampler_gap_sum / stats.tokens:.1e}: the mean |vLLM - trainer| log-prob per "
        f"token of this step's responses (a {args.dtype} run stops above {watches.SAMPLER_GAP_CEILING[args.dtype]:g})"])

    keep = torch.ones(len(groups), dtype=torch.bool)                   # --group_filter none: every group trains
    view = [v for v in views for _ in step_pairs]
    record = step_record_over_ranks(Step(STEP, groups, answers, gold, labels, rewards, rewards, keep,
                                         zero_variance(rewards), stats, view, lr, None, {}), device, world_size)
    show(blocks, "record", "harness/record.py step_record_over_ranks: the step's line of metrics.jsonl (without its times)",
         wrap([f"{key} {num(v, 2 if key == 'sampler_gap' else 4) if isinstance(v, float) else v}"
               for key, v in record.items()]))

    coreward2_branch(blocks, args, models, model_dir, device, prompts[:P], indices, k, answers[:P], gold[:P],
                     labels[:P])
    dist.barrier()
    models.engine.close()
    if dist.is_initialized():                 # closing the engine may already have taken the process group down
        dist.destroy_process_group()
    return blocks


def loss_terms(batch, logp, ref_logp, view, cfg, world_size):
    """One view's (response tokens N, policy term, KL term, -sum_i A_i n_i / N) of grpo_loss, from its terms: each
    term's sum over the view's tokens over their count. π_old is the policy itself, as in train_step
    at one update per step, so rho = 1 at every token."""
    rows = (batch.view == view).nonzero().flatten()
    part = batch.rows(rows)
    width = part.mask.shape[1]
    normalizers = loss_normalizers_over_ranks(part.mask, part.view, world_size, cfg.max_response_len)
    policy, ref = logp[rows, :width], ref_logp[rows, :width]
    _, terms = grpo_loss(policy, policy, ref, torch.zeros_like(policy), part, normalizers, part.weight, cfg)
    policy_term, kl_term = (terms[t].sum().item() / normalizers.view_tokens[view].item() for t in ("policy", "kl"))
    tokens = part.mask.sum(-1)                                                     # n_i
    weighted = -(part.advantages * tokens).sum().item() / tokens.sum().item()
    return int(tokens.sum()), policy_term, kl_term, weighted


def coreward2_branch(blocks, args, models, model_dir, device, prompts, indices, k, answers, gold, coreward1_labels):
    """What a coreward2 step does differently, on the same original questions and student responses: the
    EMA teacher's vote is the label; then the EMA moves the teacher towards the updated policy."""
    P, G = len(prompts), args.group_size
    # built as train.build_models builds the teacher: the start model, kept in fp32 for its averaging
    teacher = load_sharded(model_dir, device, torch.float32, getattr(torch, args.dtype)).requires_grad_(False)
    seeds = [request_seed(args.seed, "teacher", STEP, i, 0) for i in indices]
    teacher_groups = teacher_rollout(models.engine, teacher, prompts, seeds, G, args.temperature,
                                     args.max_response_len)
    teacher_answers = [[extract_answer(s.text) for s in g] for g in teacher_groups]
    labels = label_groups("coreward2", answers, gold, teacher_answers)[0]
    rewards = agreement(answers, labels)
    show(blocks, "teacher", "teacher.py teacher_rollout, rewards.py label_groups('coreward2', ...)", [
        f"the teacher (at step 1 the start model) answers q: request seed {seeds[k]} = "
        f"request_seed({args.seed}, 'teacher', {STEP}, {indices[k]}, 0)",
        f"  teacher's answers: {teacher_answers[k]}",
        f"  teacher's vote, the label: {ans(labels[k])}",
        f"  student's answers: {answers[k]}",
        f"  student's rewards: {bits(rewards[k])}",
        f"over the step: labels equal to the gold answer {sum(is_equiv(lab, g) for lab, g in zip(labels, gold))} of "
        f"{P} (coreward1's labels of q: {sum(is_equiv(lab, g) for lab, g in zip(coreward1_labels, gold))} of {P}); "
        f"mean reward {num(sum(map(sum, rewards)) / (P * G))}"])

    alpha = ema_alpha(STEP, args.steps, args.ema_start, args.ema_end)
    teacher_value, policy_value = weight_at(teacher, *WEIGHT), weight_at(models.policy, *WEIGHT)
    old = {name: t.double().clone() for name, t in gather_full_weights(teacher)}
    ema_update(teacher, models.policy, alpha)
    after = weight_at(teacher, *WEIGHT)
    error = max((t.double() - ((1 - alpha) * old[name] + alpha * p.double())).abs().max().item()
                for (name, t), (_, p) in zip(gather_full_weights(teacher), gather_full_weights(models.policy)))
    shown = (1, args.steps // 2, args.steps - 1, args.steps)
    alphas = [num(ema_alpha(s, args.steps, args.ema_start, args.ema_end), 6) for s in shown]
    show(blocks, "ema", "teacher.py ema_alpha, ema_update: teacher <- (1 - alpha) teacher + alpha policy", [
        f"alpha after steps {', '.join(map(str, shown))} of {args.steps}: {', '.join(alphas)}",
        f"alpha after step {STEP} = 1 - decay({STEP} / {args.steps}) = {num(alpha)}",
        f"{WEIGHT[0]}{list(WEIGHT[1])}:",
        f"  teacher {teacher_value:.9g}  policy {policy_value:.9g}  teacher after {after:.9g}",
        f"  alpha (policy - teacher) = {num(alpha * (policy_value - teacher_value))}  "
        f"teacher after - teacher = {num(after - teacher_value)}",
        f"largest |after - ((1 - alpha) teacher + alpha policy)| over all weights: {error:.1e} "
        f"(float32's spacing at 1.0: {torch.finfo(torch.float32).eps:.1e})"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", metavar="PATH", help="rewrite the output blocks of this document (WALKTHROUGH.md)")
    cli = ap.parse_args(argv)
    # vLLM (imported when the engine starts) logs to stdout: its lines go to stderr, stdout is the walkthrough alone
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    blocks = walk()
    if cli.markdown:
        fill_document(cli.markdown, blocks)


if __name__ == "__main__":
    main()
