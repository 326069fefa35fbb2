"""The seed run rehearsed on a CPU, before a GPU hour is spent on it: its command, data, rows, methods, preset,
checkpoint cadence, a lost rank and the paper's evaluation, with a stand-in for Qwen3-4B-Base (tools/standin.py).

    python tools/rehearse.py                 # about 20 minutes on 2 cores
    python tools/rehearse.py --short         # CI's: a few steps over real rows that include row 4303, 2 minutes

The seed command is `python train.py --ranks 8 --method coreward1 --model Qwen/Qwen3-4B-Base --data openrs`. Here it
runs on 2 ranks (torchrun, gloo) with the stand-in, every setting the `official` preset's but those a CPU cannot hold
in half an hour, each named with its value where the rehearsal starts (CPU_SETTINGS). Phase by phase:

1. the stand-in: built (or kept), and every training prompt read without an unknown token;
2. the seed run, until every row of OpenRS has been drawn (an epoch drops the 87 its last step cannot hold, so the
   run goes on into the second until those are drawn too, computed from the run's seed with train.Questions and
   checked against its last checkpoint's data order); every step's record written, its loss finite; the data's
   notices printed once;
3. a lost rank: the same command with --max_restarts 1, rank 1 killed (SIGKILL) mid-step two checkpoints in; torchrun
   restarts the ranks, which resume from the newest checkpoint, and the run ends bit-identical to phase 2's (final/'s
   weights, and every metric but the timings);
4. the evaluation: `eval.py --paper` (MATH500, GSM8K, AMC from the shipped files, a few questions each) on final/ and on
   the last checkpoint, the same weights, with identical results and end tokens;
5. the other methods and data: gt, with a seed whose first step draws row 4303 (its label_acc must be 1), majority,
   coreward2, coreward3 and self_harmony on OpenRS, and coreward1 on --data math and --data dapo, a few steps each.

--short runs 1, 2 (3 steps of 16 questions, from a seed whose first step draws row 4303), 4 and gt of 5. Each phase
prints what it ran and what held; the exit status is 1 if anything did not. The runs' consoles: OUT/*.log.
"""
import argparse
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import standin  # noqa: E402
from config import PRESETS  # noqa: E402
from trial import logged  # noqa: E402

SEED_COMMAND = ["--method", "coreward1", "--data", "openrs"]          # and --model, --ranks
RANKS, ROW = 2, 4303                   # the ranks here; the row without gold that the seed run stopped on
OFFICIAL = PRESETS["official"]         # the seed run's settings
# The settings a CPU cannot hold, and their values here: the rest are the official preset's.
CPU_SETTINGS = {"full": {"group_size": 2, "eval_limit": 128},
                "short": {"group_size": 2, "questions_per_step": 16, "eval_limit": 16}}
OTHER_RUNS = [("gt", "openrs"), ("majority", "openrs"), ("coreward2", "openrs"), ("coreward3", "openrs"),
              ("self_harmony", "openrs"), ("coreward1", "math"), ("coreward1", "dapo")]
OTHER_STEPS, PAPER_LIMIT = 3, {"full": 8, "short": 2}
TIMINGS = ("t_rollout", "t_train", "t_sync")


class Rehearsal:
    def __init__(self, out, short):
        self.out, self.short, self.failed, self.seed_ok = out, short, [], False
        self.model = os.path.join(out, "standin")
        self.settings = CPU_SETTINGS["short" if short else "full"]
        self.setting_flags = [x for name, value in self.settings.items() for x in (f"--{name}", str(value))]
        self.questions = self.settings.get("questions_per_step", OFFICIAL["questions_per_step"])

    def check(self, what, holds):
        """One thing the phase checks: printed as held, or as NOT held and counted."""
        print(f"   {'held' if holds else 'NOT HELD'}: {what}", flush=True)
        if not holds:
            self.failed.append(what)

    def train(self, name, flags, kill_rank_at=None):
        """train.py --ranks 2 with the stand-in and `flags`, its console in OUT/NAME.log: (status, console, records).
        kill_rank_at: SIGKILL rank 1 once that step is logged (the next is in flight)."""
        run = os.path.join(self.out, name)
        command = [sys.executable, os.path.join(ROOT, "train.py"), "--ranks", str(RANKS), "--model", self.model,
                   *flags, "--out", run, "--overwrite"]
        log = run + ".log"
        with open(log, "w") as console:
            job = subprocess.Popen(command, stdout=console, stderr=subprocess.STDOUT,
                                   env={**os.environ, "REHEARSAL_RUN": run})
            if kill_rank_at is not None:
                while job.poll() is None and kill_rank_at not in {r["step"] for r in logged(run)}:
                    time.sleep(0.2)
                time.sleep(1.0)                                    # into the next step's rollout or update
                os.kill(rank_pid(run, 1), signal.SIGKILL)
            status = job.wait()
        return status, open(log).read(), logged(run)

    # ---------------------------------------------------------------------------------------------------- the phases

    def stand_in(self):
        from transformers import AutoTokenizer
        from harness import data
        from rollout import end_tokens
        print(f"1. the stand-in for Qwen3-4B-Base (tools/standin.py): {self.model}", flush=True)
        standin.build(self.model, say=lambda line: print(f"   {line}", flush=True))
        tokenizer = AutoTokenizer.from_pretrained(self.model)
        encode = data.prompt_encoder(tokenizer)
        self.pairs = data.load_training("openrs", "both")[0]
        prompts = [encode(q) for p in self.pairs for q in (p.original, p.rephrased)]
        longest = OFFICIAL["max_prompt_len"]
        self.kept = data.drop_long(self.pairs, lambda p: [encode(p.original), encode(p.rephrased)], longest, "pairs")
        self.row_seed = first_seed_drawing(self.kept, ROW, self.questions)      # gt's, and --short's seed run
        ends, eos = end_tokens(self.model, tokenizer), tokenizer.eos_token_id
        self.check(f"end tokens {ends} (generation_config's) beside the tokenizer's EOS {eos}", len(ends) > 1)
        self.check(f"no unknown token in the {len(prompts):,} OpenRS prompts (the chat template's, the longest "
                   f"{max(map(len, prompts))} tokens); {len(self.pairs) - len(self.kept)} pairs over --max_prompt_len "
                   f"{longest}", data.unknown_token_warning(tokenizer, prompts, "prompts") is None)

    def seed_run(self):
        import train
        from harness import checkpoint
        seed = self.row_seed if self.short else OFFICIAL["seed"]
        steps = 3 if self.short else steps_to_draw_every_row(self.kept, seed, self.questions)
        self.flags = [*SEED_COMMAND, *self.setting_flags, "--steps", str(steps), "--seed", str(seed)]
        why = f"--seed {seed} (the seed's {OFFICIAL['seed']}): the first seed whose first step draws row {ROW}" \
            if self.short else "the steps by which every row is drawn"
        seed_steps = train.run_length(OFFICIAL["epochs"], len(self.kept), OFFICIAL["questions_per_step"])
        print(f"2. the seed run: train.py --ranks {RANKS} --model STANDIN {' '.join(self.flags)}\n"
              f"   changed for a CPU: {changed(self.settings)}; --steps {steps} (the seed's --epochs "
              f"{OFFICIAL['epochs']}, {seed_steps} steps), {why}", flush=True)
        t0 = time.perf_counter()
        status, console, lines = self.train("seed", self.flags)
        self.seed_records = [r for r in lines if "reward" in r]
        print(f"   ran {len(self.seed_records)} steps in {(time.perf_counter() - t0) / 60:.1f} min, status {status}")
        self.seed_ok = status == 0 and len(self.seed_records) == steps and os.path.isdir(
            os.path.join(self.out, "seed", "final")) and all(math.isfinite(r["loss"]) for r in self.seed_records)
        self.check(f"status 0, final/ written, {steps} records with a finite loss" if self.seed_ok else
                   f"the run: {failure(console)}", self.seed_ok)
        if not self.seed_ok:
            return
        steps_rows = list(itertools.islice(draws(self.kept, seed, self.questions), steps))
        drawn = [rows for rows, _ in steps_rows]
        first = min(s for s, rows in enumerate(drawn, 1) if ROW in rows)
        every = set().union(*drawn) == set(range(len(self.kept)))
        self.check(f"row {ROW} (no gold) drawn in step {first}" if self.short else
                   f"every one of the {len(self.kept):,} OpenRS rows drawn, row {ROW} (no gold) first in step {first}",
                   first == 1 if self.short else every)
        saved = checkpoint.read_trainer_state(checkpoint.latest(os.path.join(self.out, "seed")))
        rank_0 = steps_rows[-1][1]
        self.check("the run's data order and cursor are those the rows were counted from (its last checkpoint)",
                   (saved["order"], saved["cursor"]) == (rank_0.order, rank_0.cursor))
        if len(self.seed_records) >= first:
            r = self.seed_records[first - 1]
            print(f"   step {first}: reward {r['reward']:.3f}, label_acc {r['label_acc']:.3f} (its graded groups), "
                  f"zero_variance {r['zero_variance']:.3f}, loss {r['loss']:.4f}, clip_frac {r['clip_frac']:.4f}")
        self.check("the data's notices printed once (rank 0), not once a rank",
                   console.count("have no gold answer") == 1)

    def lost_rank(self):
        import torch
        from safetensors.torch import load_file
        every = OFFICIAL["save_every"]
        at = 2 * every + 2
        print(f"3. a lost rank: the same command with --max_restarts 1; rank 1 killed (SIGKILL) in step {at + 1}, "
              f"after step_{2 * every}'s checkpoint (--save_every {every}, the seed's)", flush=True)
        t0 = time.perf_counter()
        status, console, lines = self.train("lost_rank", [*self.flags, "--max_restarts", "1"], kill_rank_at=at)
        print(f"   ran in {(time.perf_counter() - t0) / 60:.1f} min, status {status}")
        restarted = [line for line in console.splitlines() if "restart 1 of 1" in line]
        self.check(f"torchrun restarted the ranks: {restarted[0].strip() if restarted else 'no restart line'}",
                   bool(restarted) and f"step_{2 * every}" in restarted[0])
        strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rs]
        self.check("every step's record equals the uninterrupted run's, but the timings",
                   strip([r for r in lines if "reward" in r]) == strip(self.seed_records))
        a, b = (load_file(os.path.join(self.out, run, "final", "model.safetensors")) for run in ("seed", "lost_rank"))
        self.check("final/'s weights equal the uninterrupted run's, bit for bit",
                   a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a))

    def evaluation(self):
        from transformers import AutoTokenizer
        from harness import checkpoint
        from rollout import end_tokens
        import eval as evaluation
        run = os.path.join(self.out, "seed")
        step = checkpoint.latest(run)
        limit = PAPER_LIMIT["short" if self.short else "full"]
        print(f"4. the evaluation: eval.py --paper --limit {limit} on final/ and on {os.path.basename(step)}",
              flush=True)
        exported = checkpoint.to_hf(step, os.path.join(self.out, "exported"))
        tokenizer = AutoTokenizer.from_pretrained(self.model)
        ends = [end_tokens(m, tokenizer) for m in (os.path.join(run, "final"), exported)]
        self.check(f"the same end tokens, {ends[0]}", ends[0] == ends[1] == end_tokens(self.model, tokenizer))
        results = []
        for name, model in (("final", os.path.join(run, "final")), ("checkpoint", step)):
            out = os.path.join(self.out, f"eval_{name}")
            with open(out + ".log", "w") as log:
                status = subprocess.call([sys.executable, os.path.join(ROOT, "eval.py"), "--model", model, "--paper",
                                          "--limit", str(limit), "--out", out, "--overwrite"], stdout=log,
                                         stderr=subprocess.STDOUT)
            path = os.path.join(out, "results.json")
            results.append(json.load(open(path))["results"] if status == 0 and os.path.exists(path) else None)
        if None in results:
            return self.check("eval.py ran on both (see OUT/eval_*.log)", False)
        for name, r in results[0].items():
            print(f"   {name}: n {r['n']}, avg@8 {r['avg']:.3f}, greedy {r['greedy']:.3f}, boxed {r['boxed']:.3f}")
        strip = lambda rs: {b: {k: v for k, v in r.items() if k != "seconds"} for b, r in rs.items()}
        self.check("identical results on final/ and the checkpoint", strip(results[0]) == strip(results[1]))

    def other_runs(self):
        runs = OTHER_RUNS[:1] if self.short else OTHER_RUNS
        print(f"5. the other methods and data, {OTHER_STEPS} steps each", flush=True)
        for method, source in runs:
            seed = self.row_seed if method == "gt" else OFFICIAL["seed"]
            t0 = time.perf_counter()
            status, console, lines = self.train(f"{method}_{source}", ["--method", method, "--data", source,
                                                                       *self.setting_flags, "--steps",
                                                                       str(OTHER_STEPS), "--seed", str(seed)])
            steps = [r for r in lines if "reward" in r]
            shown = ", ".join(f"{r['reward']:.2f}" for r in steps)
            what = f"{method} on {source} (--seed {seed}): status {status}, rewards {shown} " \
                f"({time.perf_counter() - t0:.0f} s)"
            holds = status == 0 and len(steps) == OTHER_STEPS and all(math.isfinite(r["loss"]) for r in steps)
            if method == "gt":
                what += f"; step 1 draws row {ROW}: label_acc {steps[0]['label_acc'] if steps else None}"
                holds = holds and steps[0]["label_acc"] == 1.0
            if status:
                what += f"; {failure(console)}"
            self.check(what, holds)


# ------------------------------------------------------------------------------------------------ the data order

def changed(settings):
    """The CPU's settings beside the seed run's, as the rehearsal names them."""
    def seed_value(name):
        if name == "eval_limit" and OFFICIAL[name] is None:
            from harness import data
            return f"all {len(data.load_benchmark(OFFICIAL['eval_data'])):,}"
        return OFFICIAL[name]
    return ", ".join(f"--{name} {value} (the seed's {seed_value(name)})" for name, value in settings.items())


def draws(pairs, seed, questions):
    """Step after step: (the rows it draws over both ranks, rank 0's train.Questions after it), as the run's ranks take
    them (each its own copy of the shuffle)."""
    import train
    ranks = [train.Questions.shuffled(pairs, seed) for _ in range(RANKS)]
    while True:
        yield set().union(*(q.take(questions, r, RANKS)[0] for r, q in enumerate(ranks))), ranks[0]


def drawn_by_step(pairs, seed, questions, steps):
    """[{rows}] the rows each of the first `steps` steps draws (`draws`)."""
    return [rows for rows, _ in itertools.islice(draws(pairs, seed, questions), steps)]


def steps_to_draw_every_row(pairs, seed, questions):
    seen = set()
    for step, (rows, _) in enumerate(draws(pairs, seed, questions), 1):
        seen |= rows
        if len(seen) == len(pairs):
            return step


def first_seed_drawing(pairs, row, questions):
    """The first --seed whose first step draws `row`."""
    return next(s for s in range(100_000) if row in drawn_by_step(pairs, s, questions, 1)[0])


# --------------------------------------------------------------------------------------------- the run's folders

def failure(console):
    """What stopped a run, from its console: the ranks' first error line, or its last line."""
    lines = [line.strip() for line in console.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"(\[rank\d+\]: )?\w*(Error|Exception): ", line)]
    return (errors or lines or ["no output"])[0 if errors else -1]


def rank_pid(run, rank):
    """The process of the run's rank `rank`: the one whose environment names the run and the rank, and whose parent's
    does not (its helpers inherit both)."""
    def environ(pid):
        try:
            return dict(x.split("=", 1) for x in open(f"/proc/{pid}/environ").read().split("\0") if "=" in x)
        except OSError:
            return {}

    def ours(pid):
        env = environ(pid)
        return env.get("REHEARSAL_RUN") == run and env.get("RANK") == str(rank)
    parent = lambda pid: int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    return next(int(p) for p in os.listdir("/proc") if p.isdigit() and ours(p) and not ours(parent(p)))


def quiet():
    """This process's own loads say nothing: the data's notices are the runs' to print (phase 2 counts them there),
    and the bars of saves and DCP's note on a load without a process group say nothing about the seed run."""
    import warnings
    from transformers.utils import logging as transformers_logging
    from harness import data
    data.notice = lambda line: None
    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("runs", "rehearsal"), help="its folder: the stand-in, the runs")
    ap.add_argument("--short", action="store_true", help="CI's: phases 1, 2 (3 steps), 4 and gt")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    quiet()
    began = time.perf_counter()
    print(f"rehearsal of the seed run, python train.py --ranks 8 --method coreward1 --model Qwen/Qwen3-4B-Base --data "
          f"openrs, on this CPU with a stand-in model{' (--short)' if args.short else ''}", flush=True)
    r = Rehearsal(args.out, args.short)
    phases = [r.stand_in, r.seed_run, r.evaluation, r.other_runs] if args.short else \
        [r.stand_in, r.seed_run, r.lost_rank, r.evaluation, r.other_runs]
    for phase in phases:
        if phase in (r.lost_rank, r.evaluation) and not r.seed_ok:
            print(f"   skipped {phase.__name__}: it needs the seed run's checkpoints and final/", flush=True)
            continue
        phase()
    minutes = (time.perf_counter() - began) / 60
    if r.failed:
        print(f"rehearsal failed ({minutes:.1f} min): {len(r.failed)} did not hold; the runs' consoles: "
              f"{args.out}/*.log")
        return 1
    held = "trains over real rows, row 4303 among them, and evaluates its checkpoint as its final model" if args.short \
        else "trains on every row of OpenRS, restarts a lost rank to the same weights, and evaluates its checkpoint " \
             "as its final model"
    print(f"rehearsal passed ({minutes:.1f} min): the seed command {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
