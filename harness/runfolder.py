"""The run folder (--out): its lock, its logs and its samples.

- The folder is the run's own: `locked` holds it for the run. `earlier_outputs` refuses a folder that holds an
  earlier run unless given --overwrite or --resume; --overwrite removes its outputs (`remove_outputs`) only once
  every input of the new run has been read and checked, so that a typo in --data or --model loses nothing.
- metrics.jsonl (`MetricsLog`: rank 0, and each record to wandb with --wandb), run.log (`console_log`, rank 0's
  console), samples.jsonl (`write_samples`) and config.json (`write_config`).
"""
import contextlib
import json
import os
import shutil
import socket
import sys
import time

from harness.errors import USAGE, FolderInUse, InputError, refuse

try:
    import fcntl                        # the folder's locks (locked): POSIX file locks, shared and exclusive
except ImportError:                     # native Windows: no fcntl, and no shared locks in msvcrt
    print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: native Windows is not supported (a run's folder "
          f"is locked with POSIX file locks, which Windows lacks): run it in WSL, where the README's install and "
          f"commands work as on Linux", file=sys.stderr, flush=True)
    sys.exit(USAGE)

import torch.distributed as dist

RUN_OUTPUTS = ("metrics.jsonl", "config.json", "final", "checkpoints", "run.log", "samples.jsonl")
RUN_LOCK = ".run.lock"           # rank 0 holds it exclusively for the whole run; it names the holder
WORKERS_LOCK = ".workers.lock"   # every rank holds it shared while it lives
RUN_ID = ".run.id"               # the launcher's id of the run holding the folder, which its restarts know (resume.py)


@contextlib.contextmanager
def locked(out, rank, run_id):
    """Hold --out, from before anything slow, until the block or the process ends (the kernel releases a flock with its
    process: a crashed run's stale lock file is taken over). Rank 0 takes RUN_LOCK exclusively and checks that no worker
    of an earlier run still holds WORKERS_LOCK; every rank then holds WORKERS_LOCK shared. A second run on the folder is
    refused, naming the holder. Rank 0 writes `run_id` into RUN_ID whole or not at all: restarts read it any time."""
    error, held = None, []
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        run_lock, workers = open(os.path.join(out, RUN_LOCK), "a+"), open(os.path.join(out, WORKERS_LOCK), "a+")
        run_lock.seek(0)
        holder = run_lock.read().strip() or "a process that did not say who it is"
        held = [run_lock, workers]
        try:
            fcntl.flock(run_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(workers, fcntl.LOCK_EX | fcntl.LOCK_NB)    # no worker of another run is alive
            fcntl.flock(workers, fcntl.LOCK_SH)                    # we hold RUN_LOCK: no run can slip in between
            run_lock.seek(0)
            run_lock.truncate()
            run_lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                           f"{' '.join(sys.argv)}\n")
            run_lock.flush()
        except BlockingIOError:
            error = (f"--out {out} is in use by another run ({holder}), or by a worker of it that is still running; "
                     f"wait for it to end or stop it (its workers stop at their step's end once their launcher is "
                     f"gone), or choose another --out. Nothing was run or deleted")
    box = [error]
    dist.broadcast_object_list(box, src=0)
    try:
        if box[0] is not None:
            raise FolderInUse(box[0])
        if rank != 0:
            held = [open(os.path.join(out, WORKERS_LOCK), "a+")]
            fcntl.flock(held[0], fcntl.LOCK_SH)
        else:
            with open(os.path.join(out, RUN_ID + ".tmp"), "w") as f:
                f.write(str(run_id))
            os.replace(os.path.join(out, RUN_ID + ".tmp"), os.path.join(out, RUN_ID))
        yield
    finally:
        for f in held:                                    # closing a file gives its lock back
            f.close()


def earlier_outputs(out, overwrite, rank):
    """What an earlier run left in --out (RUN_OUTPUTS), as rank 0 found it: refused without --overwrite."""
    box = [[name for name in RUN_OUTPUTS if os.path.exists(os.path.join(out, name))] if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    found = box[0]
    if found and not overwrite:
        raise FolderInUse(f"--out {out} already holds a run ({', '.join(found)}); pass --resume to continue it, "
                              f"--overwrite to replace it, or choose another --out")
    return found


def remove_outputs(out, found, rank):
    """--overwrite: delete the earlier run's outputs (`earlier_outputs`), never the locks (rank 0)."""
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
    """The wandb run `run_id` of `project`, continued if it exists (a resumed run); wandb is imported only here."""
    try:
        import wandb
    except ImportError:
        raise ImportError("--wandb needs the wandb package: pip install wandb (or drop --wandb)") from None
    return wandb.init(project=project, id=run_id, resume="allow", config=config)


class MetricsLog:
    """Appends JSON lines on rank 0 and sends each record to wandb (`NoWandb` without --wandb); nothing on the other
    ranks. A new run starts the file afresh; a resumed one keeps the records up to its checkpoint's step."""
    def __init__(self, path, active, resume_step=None, wandb_run=None):
        self.path, self.active, self.dropped, self.wandb = path, active, [], wandb_run or NoWandb()
        if active and resume_step is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        elif active:
            self.truncate(resume_step)

    def truncate(self, step):
        """Drop the records after `step` (logged after the checkpoint by a killed run) and a half-written last line."""
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
                self.dropped += [json.loads(x)["step"] for x in lines[i:] if x.endswith("\n") and '"reward"' in x]
                break
            kept.append((line, record))
        logged = [record["step"] for _, record in kept if "reward" in record]
        if logged != list(range(1, step + 1)):
            raise ValueError(f"{self.path} does not hold one record for each step up to the checkpoint's {step} "
                             f"(it has {logged[:3]}...{logged[-3:]}); resume needs the run's own metrics.jsonl")
        with open(self.path + ".tmp", "w") as f:           # each line whole: one cut before its newline gets it
            f.writelines(line if line.endswith("\n") else line + "\n" for line, _ in kept)
        os.replace(self.path + ".tmp", self.path)

    def learned(self, k, seconds, resumed_at=0):
        """The run's closing line: each evaluated metric (avg@k, greedy, maj@k; greedy alone at k = 0) from the first
        evaluation in metrics.jsonl to the last, and this process's time; None with fewer than two evaluations."""
        evals = [record for record in map(json.loads, open(self.path)) if "eval_greedy" in record]
        if len(evals) < 2:
            return None
        first, last = evals[0], evals[-1]
        names = {"eval_acc": f"avg@{k}", "eval_greedy": "greedy", "eval_maj": f"maj@{k}"} if k else \
            {"eval_greedy": "greedy"}
        shown = [(name, round(first[key], 3), round(last[key], 3)) for key, name in names.items()]
        since = f" since the resume at step {resumed_at}" if resumed_at else ""
        return (f"learned over steps {first['step']}-{last['step']} ({seconds:.1f} s{since}): "
                + ", ".join(f"{name} {a:.3f} -> {b:.3f} ({b - a:+.3f})" for name, a, b in shown))

    def write(self, record):
        if self.active:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            self.wandb.log(record, step=record["step"])


def write_config(out, configuration):
    """config.json: the run's resolved configuration (rank 0). Returns its path."""
    path = os.path.join(out, "config.json")
    with open(path, "w") as f:
        json.dump(configuration, f, indent=1)
    return path


def write_samples(out, step, examples, tokenizer):
    """Append an evaluation's example responses (eval.eval_counts), greedy or sampled, to OUT/samples.jsonl."""
    if not examples:
        return
    with open(os.path.join(out, "samples.jsonl"), "a") as f:
        for e in examples:
            prompt = tokenizer.decode(e["prompt_ids"], skip_special_tokens=True)
            f.write(json.dumps({"step": step, "question": e["question"], "kind": e["kind"], "prompt": prompt,
                                **{k: e[k] for k in ("response", "answer", "gold", "reward")}}) + "\n")


class ConsoleLog:
    """Rank 0's console, also written to OUT/run.log without progress bars (writes with carriage returns)."""
    def __init__(self, path, stream):
        self.file, self.stream = open(path, "a", buffering=1), stream

    def write(self, text):
        self.stream.write(text)
        if "\r" not in text:
            self.file.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()

    def __getattr__(self, name):                  # isatty, fileno, encoding: the console's
        return getattr(self.stream, name)


@contextlib.contextmanager
def console_log(out, rank):
    """Within it, rank 0's stdout and stderr also go to OUT/run.log (`ConsoleLog`)."""
    if rank != 0:
        yield
        return
    path, streams = os.path.join(out, "run.log"), (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = ConsoleLog(path, sys.stdout), ConsoleLog(path, sys.stderr)
    try:
        yield
    finally:
        for log in (sys.stdout, sys.stderr):
            if isinstance(log, ConsoleLog):
                log.file.close()
        sys.stdout, sys.stderr = streams


REPLAY_MATCHES = ("seed", "data", "views", "questions_per_step", "group_size")   # the same questions, in the same groups


def check_replay(run, settings):
    """Refuse a --replay run whose steps did not group the same questions as this run's, or end before it."""
    path = os.path.join(run, "config.json")
    if not os.path.exists(path):
        refuse(f"--replay {run}: it holds no config.json: give the folder of a run that trained")
    saved = json.load(open(path))
    differ = [f"--{k} {saved.get(k)} there, {settings[k]} here" for k in REPLAY_MATCHES if saved.get(k) != settings[k]]
    if differ or (saved.get("steps") or 0) < settings["steps"]:
        refuse(f"--replay {run}: its groups are not this run's ({'; '.join(differ) or 'it trained fewer steps'}): "
               f"replay a run of the same {', '.join(REPLAY_MATCHES)}, at least as long")


def replayed_rewards(run, step):
    """[groups] each group's reward sum at `step` in the --replay run's metrics.jsonl (group_rewards); None: no run."""
    if run is None:
        return None
    found = [r["group_rewards"] for r in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
             if r.get("step") == step and "group_rewards" in r]
    if not found:
        raise InputError(f"--replay {run}: its metrics.jsonl has no group_rewards for step {step}: replay a run that "
                         f"logged them (today's code) and trained that step")
    return found[-1]
