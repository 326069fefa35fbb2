"""What a run needs beyond the algorithm: its folder, its log, its checkpoints and its stops.

- **The folder** (--out) is the run's own. `lock_out` locks it before anything slow, for as
  long as the process lives, and `earlier_outputs` refuses a folder that holds an earlier run
  unless given --overwrite or --resume (which continues it). --overwrite removes the earlier
  run's outputs (`remove_outputs`) only once every input of the new run has been read and
  checked: a typo in --data or --model loses nothing.
- **Outputs**: metrics.jsonl (a line per step; a line per evaluation), config.json (the resolved
  configuration), checkpoints/step_S/ (every --save_every steps and at the last; see
  checkpoint.py) and final/ (the trained model, loadable by transformers and vLLM).
- **The log** (`MetricsLog`) writes metrics.jsonl on rank 0, and each record to wandb with --wandb.
- **The collapse watch** (`CollapseWatch`) warns when the label-free diagnostics turn.
- **Resume**: `restore` loads a checkpoint into the models and the question order. The run then
  samples exactly what the uninterrupted run would have: every sampled request is seeded by the
  run's seed, the step, the question and the view (rollout.py), and the checkpoint holds every
  random state the loop draws from. What the run wrote after the checkpoint is moved aside.
- **Stops**: SIGTERM or SIGINT (`StopSignals`) makes all ranks finish the step, write a checkpoint
  and exit; so does the end of the launcher. A second signal stops every rank at once, keeping the
  newest complete checkpoint.
- **Ranks**: `python train.py --ranks N` starts N ranks on this machine (`launch_ranks`) once this
  process has checked the settings, as `torchrun --standalone --nproc_per_node N` would, and reports
  a failed rank in one line instead of torchrun's traceback.
"""
import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time

try:
    import fcntl                        # the run folder's locks (lock_out): POSIX file locks, shared and exclusive
except ImportError:                     # native Windows: no fcntl, and no shared locks in msvcrt
    print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: native Windows is not supported (a run's folder "
          f"is locked with POSIX file locks, which Windows lacks): run it in WSL, where the README's install and "
          f"commands work as on Linux", file=sys.stderr, flush=True)
    sys.exit(2)

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from tqdm import tqdm

import checkpoint
import config
from config import DamagedCheckpoint, FolderInUse, InputError, MissingInput, OutOfDisk, config_of
from sharding import GuardStop


RUN_OUTPUTS = ("metrics.jsonl", "config.json", "final", "checkpoints", "run.log", "samples.jsonl")
RUN_LOCK = ".run.lock"           # rank 0 holds it exclusively for the whole run; it names the holder
RUN_ID = ".run.id"               # the launcher's id of the run that holds the folder (`attempt`): its restarts know it
STOPPED = 75                     # the exit status of a run stopped by a signal after its checkpoint (EX_TEMPFAIL, "try
                                 # again"): torchrun restarts a worker that exits with it, a Slurm script requeues
WORKERS_LOCK = ".workers.lock"   # every rank holds it shared while it lives


def launch_ranks(ranks, program, argv, max_restarts=0, out=None):
    """Start `ranks` processes of `program argv` under torchrun's launcher (its agent, in this process), and
    exit with the status of the first rank that failed. Each rank reports its own failure: a mistake in the
    settings or inputs as one line from the first rank (status 2, to which nothing is added here), anything
    else as its traceback, followed by one line that names the rank. A signal reaches the ranks as under
    torchrun (each finishes its step and writes a checkpoint; a second one, which torchrun's agent passes on as
    SIGTERM, stops them at once: StopSignals); this process then exits with 128 + the signal. With `max_restarts`,
    torchrun starts the ranks again after a failure, up to that many times, and each restart continues the run from
    its newest checkpoint (`as_an_attempt`); when they are spent, one line says so and how to continue by hand."""
    import logging
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    # The agent's own reports repeat what the ranks print, followed by its traceback; and the threads it sets
    # (OMP_NUM_THREADS=1 for each of several ranks) GPUS.md states.
    for logger in [name for name in logging.root.manager.loggerDict if name.startswith("torch.distributed")]:
        logging.getLogger(logger).setLevel(logging.CRITICAL)         # each has its level (torch's LOGLEVEL)
    name = os.path.basename(program)
    try:
        torchrun.run(torchrun.parse_args(["--standalone", f"--nproc_per_node={ranks}", f"--max-restarts={max_restarts}",
                                          program, *argv]))
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()
        if first.exitcode in (2, config.GUARD_STOP, STOPPED):   # a usage error, a guard's stop, a stop with its
                                                                # checkpoint: each said so in its line
            sys.exit(first.exitcode)
        how = f"exit status {first.exitcode}" if first.exitcode > 0 else f"signal {-first.exitcode}"
        spent = f"; torchrun's {max_restarts} restart(s) are spent, and {out} keeps its newest checkpoint: continue " \
                f"by hand with python {name} --out {out} --resume" if max_restarts else ""
        print(f"{name}: rank {rank} stopped with {how}; its message is above{spent}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SignalException as stop:
        sys.exit(128 + stop.sigval)


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
            with open(os.path.join(out, RUN_ID + ".tmp"), "w") as f:          # whole or not at all: its restarts
                f.write(str(attempt()[0]))                                    # read it while this rank writes it
            os.replace(os.path.join(out, RUN_ID + ".tmp"), os.path.join(out, RUN_ID))
        except BlockingIOError:
            error = (f"--out {out} is in use by another run ({holder}), or by a worker of it that is still running; "
                     f"wait for it to end or stop it (its workers stop at their step's end once their launcher is "
                     f"gone), or choose another --out. Nothing was run or deleted")
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise FolderInUse(box[0])
    if rank != 0:
        workers = open(os.path.join(out, WORKERS_LOCK), "a+")
        fcntl.flock(workers, fcntl.LOCK_SH)
        held = [workers]
    return held


def attempt():
    """(the launcher's id of this run, this attempt's number, the restarts the launcher allows): torchrun's elastic
    agent (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS) and Slurm (SLURM_JOB_ID, and
    SLURM_RESTART_COUNT for a requeued job), whose job id stays the run's across requeues. (None, 0, 0) outside both."""
    env = os.environ.get
    slurm, elastic = env("SLURM_JOB_ID"), env("TORCHELASTIC_RUN_ID")
    run_id = f"slurm job {slurm}" if slurm else f"torchrun {elastic}" if elastic else None
    count = int(env("SLURM_RESTART_COUNT", 0) if slurm else 0) + int(env("TORCHELASTIC_RESTART_COUNT", 0))
    return run_id, count, int(env("TORCHELASTIC_MAX_RESTARTS", 0))


def as_an_attempt(argv, out):
    """A restart of the run that holds `out` (its launcher's id in OUT/.run.id, this attempt's number above 0)
    continues it, with nothing typed: (argv with --resume, from its newest complete checkpoint, or with --overwrite
    when it has none yet: the run starts afresh over its own first attempt's outputs; a line for run.log). Any other
    start gets (argv, None): a second run on the folder is refused as before."""
    run_id, count, allowed = attempt()
    path = os.path.join(out, RUN_ID)
    if not count or not os.path.exists(path) or open(path).read() != str(run_id):
        return argv, None
    kept, skip = [], False
    for word in argv:                       # the command's own --resume [CHECKPOINT] or --overwrite give way
        if skip and not word.startswith("--"):
            skip = False
            continue
        skip = word == "--resume"
        if word not in ("--resume", "--overwrite"):
            kept.append(word)
    latest = checkpoint.latest(out)
    which = f"restart {count} of {allowed}" if allowed else f"restart {count}"
    if latest is None:
        return kept + ["--overwrite"], f"{which} of {run_id}: no complete checkpoint yet, so the run starts afresh"
    return kept + ["--resume"], f"{which} of {run_id}: continued from {latest}"


def dropped_note(steps):
    """What a resume dropped from metrics.jsonl: the steps logged after its checkpoint (a failed attempt's)."""
    if not steps:
        return ""
    return f"; the steps after it that the failed attempt had logged ({steps[0]}-{steps[-1]}) are dropped from " \
           f"metrics.jsonl and run again"


def earlier_outputs(out, overwrite, rank):
    """What an earlier run left in --out (RUN_OUTPUTS): refused unless given --overwrite, in which case
    they are returned, for `remove_outputs` to delete once the run's inputs have passed their checks.
    Rank 0 looks and every rank gets its answer, so that all ranks stop or go on together."""
    found = [name for name in RUN_OUTPUTS if os.path.exists(os.path.join(out, name))] if rank == 0 else None
    box = [found]
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
    question: the reward hack of a vote). The study (study/README.md) shows where healthy and collapsing
    classroom runs sit against these limits. It warns when a rule starts to hold, and again only
    after the rules have stopped holding (a resumed run starts watching afresh)."""
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
        self.path, self.active, self.dropped = path, active, []
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

    def write(self, record):
        if self.active:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            self.wandb.log(record, step=record["step"])


class StopSignals:
    """SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) ask the run to stop: every rank
    finishes its step, and at the step's end the ranks agree (an all-reduce: one rank's signal
    stops them all), write a checkpoint and exit cleanly. A second signal stops the process at once,
    without finishing the step or writing a checkpoint: rank 0 says, in one line, which complete
    checkpoint is kept and how to continue from it, and the process exits with 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process a signal ended.

    Who gets the second signal. `python train.py` in a terminal: Ctrl-C reaches its process group,
    this process. Under a launcher (--ranks, torchrun) the workers run in sessions of their own, so
    a terminal's Ctrl-C reaches the launcher alone: its agent sends the first signal on to every
    worker and waits for them; a second one interrupts that wait, and on its way out the agent sends
    every worker SIGTERM, each worker's second signal. A scheduler's SIGTERM to the launcher is sent
    on as the first one was.

    How it stops at once. A Python signal handler runs in the main thread between bytecodes: a rank
    blocked in a C call (a collective waiting for a peer, a long operator, vLLM's forward in this
    process) would not run it until the call returns, which for a collective whose peer has gone may
    be never, and two signals that arrive meanwhile count as one. So the handlers installed here do
    nothing in the main thread; the C-level handler behind them also writes each signal's number to
    a pipe (signal.set_wakeup_fd) the moment it arrives, whatever the main thread is doing, and a
    thread of this class reads the pipe, counts the signals and, at the second, calls os._exit.
    That thread needs the GIL only for a moment, and the calls a step blocks in release it (torch's
    operators, gloo's collectives, file and socket I/O); a C call that held it throughout would
    delay the exit until it returned. os._exit rather than an exception: an exception is raised in
    the main thread, by the same handlers, only once the C call returns; and it would run `finally`
    blocks and atexit hooks, which wait for collectives, the engine and the helper processes.
    os._exit runs none of them, and what it cuts short is safe: a checkpoint being written stays a
    .partial folder, which no resume takes (checkpoint.py); a checkpoint being pruned was renamed to
    one first; metrics.jsonl loses at most the line of the step in progress, which a resume drops
    (MetricsLog.truncate); the grader's helper process (answers.py) ends when its parent is gone.

    So does the end of the launcher: torchrun starts its workers in sessions of their own, so a
    `kill -9` of torchrun (or of its process group) leaves them running, still writing into --out.
    A worker started by torchrun (TORCHELASTIC_RUN_ID is set) remembers its parent; once its
    parent is another process (the launcher died and it was re-parented), it stops as on SIGTERM."""
    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, out, rank):
        self.out, self.rank, self.received, self.count = out, rank, None, 0
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self.pipe = os.pipe()                              # (read end, write end)
        os.set_blocking(self.pipe[1], False)               # the C handler's write never waits
        self.previous_fd = signal.set_wakeup_fd(self.pipe[1])
        self.previous = {s: signal.signal(s, self._in_main_thread) for s in self.SIGNALS}
        self.watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self.watcher.start()

    @staticmethod
    def _in_main_thread(signum, frame):
        """The Python-level handler: nothing to do (the watcher acts); it replaces KeyboardInterrupt."""

    def _watch(self):
        while True:
            for number in os.read(self.pipe[0], 64):      # one byte per signal, as it arrives
                if number == 0:                            # restore(): the loop is over
                    return
                if number in self.SIGNALS:                 # another signal Python handles is not ours
                    self._receive(signal.Signals(number))

    def _receive(self, stop):
        self.count += 1
        if self.count == 1:
            self.received = stop.name
            if self.rank == 0:
                print(f"received {stop.name}: finishing this step, then writing a checkpoint (a second signal "
                      f"stops at once, without them)", flush=True)
            return
        if self.rank == 0:
            newest, world = checkpoint.latest(self.out), int(os.environ.get("WORLD_SIZE", 1))
            kept = f"the newest complete checkpoint, {newest}, is kept: continue with: python train.py --out " \
                   f"{self.out} --resume{f' --ranks {world}' if world > 1 else ''}" if newest else \
                "there is no complete checkpoint yet: start the run again (with --overwrite)"
            print(f"received {stop.name}, a second stop signal: stopped at once; {kept}",
                  flush=True)
            sys.stderr.flush()
        os._exit(128 + stop)

    def agreed_over_ranks(self, device):
        if self.launcher is not None and os.getppid() != self.launcher and self.received is None:
            print(f"the launcher (pid {self.launcher}) is gone: finishing this step, then writing a checkpoint",
                  flush=True)
            self.received = "launcher gone"
        flag = torch.tensor([float(self.received is not None)], device=device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def restore(self):
        """The handlers from before, and the watcher ended (once the loop is over, a signal acts as before it)."""
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self.previous_fd)
        os.write(self.pipe[1], b"\0")
        self.watcher.join()
        for fd in self.pipe:
            os.close(fd)


def load_checkpoint(path, policy, optimizer, teacher):
    """checkpoint.load, or a stop that names the checkpoint that failed and the one before it."""
    try:
        return checkpoint.load(path, policy, optimizer, teacher)
    except checkpoint.LOAD_ERRORS as e:          # any failure to read it; re-raised with what to do
        step = int(checkpoint.STEP_DIR.fullmatch(os.path.basename(os.path.normpath(path))).group(1))
        earlier = [p for s, p in checkpoint.complete(os.path.dirname(os.path.dirname(path))) if s < step]
        instead = f"the previous one is {earlier[-1]}: resume from it with --resume {earlier[-1]}" if earlier else \
            "there is no earlier checkpoint: start the run afresh"
        raise DamagedCheckpoint(f"--resume: the checkpoint {path} cannot be loaded ({first_cause(e)}); {instead}, or "
                                f"move {path} away") from None


def first_cause(error):
    """'Type: the first line of its message' of what went wrong; DCP's CheckpointException unwrapped to its first
    rank's failure."""
    failures = getattr(error, "failures", None)
    if failures:
        wrapped = next(iter(failures.values()))
        error = wrapped[0] if isinstance(wrapped, tuple) else wrapped
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first[:300]}"


def finished(path, args):
    """--resume of a run that is done: its checkpoint `path` is of the last step and final/ holds its model.
    Says so (first rank) and returns True; nothing is changed. A run cannot be extended, as its length sets
    its learning-rate and EMA schedules: a longer run starts from its final/ with --model."""
    step = checkpoint.read_trainer_state(path).get("step")
    final = os.path.join(args.out, "final")
    if step is None or step < args.steps or not os.path.isdir(final):
        return False                              # not finished, or a checkpoint the resume's own checks judge
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"--resume: the run in {args.out} is finished (its checkpoint {path} is of step {step} of {args.steps}, "
              f"and {final} holds its model); nothing to do. A run's length sets its schedules, so it is not "
              f"extended: train further from {final} with --model, into another --out")
    return True


def check_fingerprints(path, now):
    """Refuse to resume checkpoint `path` on other training questions or another start model."""
    changes = checkpoint.fingerprint_changes(checkpoint.read_trainer_state(path)["fingerprints"], now)
    if changes:
        raise InputError(f"--resume {path}: the run's inputs changed since the checkpoint: " + "; ".join(changes)
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


def model_folder_for_all_ranks(model):
    """The local folder of --model: a folder as given, or a Hugging Face id (`org/name`) resolved through
    the hub's cache, downloading it if it is not there yet: once per node (the node's first rank
    downloads, the other ranks wait, then read the cache). The fingerprint, vLLM and the trainer all
    read the folder this returns. Refused at once: a path that names no folder (one that starts with /,
    ./, ../ or ~, has more than one /, or whose first part is a folder here), a folder that holds no
    config.json, and an id that is neither cached nor downloadable (no network): each with what to do."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise MissingInput(f"--model {model}: the folder holds no config.json, so it is not a Hugging Face "
                               f"model folder (one from save_pretrained, or a hub download). Nothing was run")
        return path
    parts = model.split("/")
    if model.startswith(("/", "./", "../", "~")) or len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0])) \
            or os.path.exists(path):
        raise MissingInput(f"--model {model}: no such folder{' (it is a file)' if os.path.exists(path) else ''}. "
                           f"Give a model folder, or a Hugging Face id such as Qwen/Qwen3-4B-Base. Nothing was run")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError
    first_on_node = int(os.environ.get("LOCAL_RANK", 0)) == 0
    failed = None
    try:
        if first_on_node:
            try:
                snapshot_download(model, local_files_only=True)       # cached: no network needed
            except LocalEntryNotFoundError:
                print(f"--model {model}: not in the Hugging Face cache; downloading it", flush=True)
                snapshot_download(model)
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HFValidationError, OSError) as e:
        failed = e
    if dist.is_initialized():                      # the other ranks wait here for their node's download
        outcomes = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, None if failed is None else f"{type(failed).__name__}: {failed}")
        failed = next((o for o in outcomes if o is not None), None)
    if failed is not None:
        raise MissingInput(
            f"--model {model} is no folder here, and as a Hugging Face id it is neither in the cache "
            f"(HF_HUB_CACHE, ~/.cache/huggingface/hub) nor could it be downloaded "
            f"({str(failed).splitlines()[0][:200]}). "
            f"Download it where there is a network (huggingface-cli download {model}) and use that cache, or give "
            f"the model's folder. Nothing was run") from None
    return snapshot_download(model, local_files_only=True)


ENGINE_NAMES = {"vllm": "vLLM", "hf": "transformers' generate"}


def write_config(args, rank, disk, weight_check):
    """Write the run's configuration to config.json and print its summary (rank 0), with `disk`: (a
    checkpoint's bytes, the most the run's folder holds at once) (disk_bytes), then the engine's line on
    what its weight syncs check (`weight_check_report`)."""
    if rank == 0:
        path = os.path.join(args.out, "config.json")
        with open(path, "w") as f:
            json.dump(config_of(args), f, indent=1)
        views = "2 views" if args.views == "both" else "1 view"
        evaluation = f"greedy and avg@{args.eval_k}" if args.eval_k else "greedy"
        correction = "" if args.rollout_correction == "none" else \
            f", rollout correction {args.rollout_correction} (cap {args.rollout_correction_cap})"
        preset = config.PRESETS[args.preset]
        correction += "".join(f", --{k} {getattr(args, k)}" for k in config.LOSS_FAMILY
                              if getattr(args, k, preset[k]) != preset[k])
        print(f"{args.method} on {args.data}, preset {args.preset} "
              f"({getattr(args, 'preset_reason', 'as the checkpoint it resumes')}): {args.steps} steps of "
              f"{args.questions_per_step} questions x {views} x G={args.group_size}, lr {args.lr}, KL {args.kl_coef}, "
              f"{args.dtype}{correction}; {evaluation} on {args.eval_data} every {args.eval_every} steps; rollouts by "
              f"{ENGINE_NAMES[args.backend]} ({getattr(args, 'backend_reason', 'as the checkpoint it resumes')}); "
              f"checkpoints of {size(disk[0])}, at most {size(disk[1])} on disk; every setting in {path}",
              flush=True)
        print(weight_check, flush=True)


def write_samples(out, step, examples, tokenizer):
    """Append an evaluation's example responses (eval.eval_counts) to OUT/samples.jsonl, a line each:
    the step, the question's place in the evaluation set, greedy or sample, the prompt and the response
    as text, the extracted answer, the gold answer and the reward. Reading them is how a reward hack
    shows before the numbers do."""
    if not examples:
        return
    with open(os.path.join(out, "samples.jsonl"), "a") as f:
        for e in examples:
            prompt = tokenizer.decode(e["prompt_ids"], skip_special_tokens=True)
            f.write(json.dumps({"step": step, "question": e["question"], "kind": e["kind"], "prompt": prompt,
                                **{k: e[k] for k in ("response", "answer", "gold", "reward")}}) + "\n")


class ConsoleLog:
    """Rank 0's console, also written to OUT/run.log: what the console showed, without progress bars
    (tqdm redraws its bar on stderr with carriage returns; those writes are left out of the file)."""
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


def restore(path, models, questions, args, rank):
    """Continue from the checkpoint `path`: its weights, optimizer and schedule go into `models`, its
    question order into `questions`, the engine gets the resumed policy, and rank 0 moves aside what
    the run wrote after it. Returns (the step it was written at, its wandb run id, its first steps' sampler
    gaps: none in a checkpoint from before the watch kept them, whose resumed run measures them afresh)."""
    state = load_checkpoint(path, models.policy, models.optimizer, models.teacher)
    models.scheduler.load_state_dict(state["scheduler"])
    questions.load_state(state)
    models.sync_engine()                                  # the engine samples from the resumed policy
    if rank == 0:
        prepare_resume(args.out, state["step"], args.steps)
        print(f"resumed from {path} (step {state['step']} of {args.steps})")
    return state["step"], state.get("wandb_id"), state.get("sampler_gap_first", [])


def disk_bytes(models, args):
    """(one checkpoint's bytes, the most the run's folder holds at once): the run's disk account, in its
    summary line (checkpoint.checkpoint_bytes, checkpoint.run_disk_bytes)."""
    one = checkpoint.checkpoint_bytes(models.policy, models.teacher)
    saves = -(-args.steps // args.save_every) if args.save_every else 0
    return one, checkpoint.run_disk_bytes(one, checkpoint.final_model_bytes(models.policy), args.keep_last, saves)


def size(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def out_of_disk(out, need, what):
    """The one line of a run that stops because the disk of --out cannot hold `what` (`need` bytes)."""
    newest = checkpoint.latest(out)
    then = f"the newest complete checkpoint, {newest}, is kept: free some space, then continue with: python " \
           f"train.py --out {out} --resume" if newest else \
        "there is no complete checkpoint yet: free some space, then start the run again"
    return (f"out of disk: {checkpoint.disk_of(out)}, which holds --out {out}, has {size(shutil.disk_usage(out).free)} "
            f"free and {what} needs {size(need)}; the run stopped, {then}")


def check_room_on_all_ranks(out, need, what, rank):
    """Before a save: stop every rank, in one line (OutOfDisk), when the disk of --out has less free space than
    `what` needs; rank 0 looks and broadcasts its verdict."""
    box = [out_of_disk(out, need, what) if rank == 0 and shutil.disk_usage(out).free < need else None]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise OutOfDisk(box[0])


@contextlib.contextmanager
def stop_cleanly_if_the_disk_fills(out, need, what, partial, rank):
    """A save that fails for want of space anyway (ENOSPC, or torch's write error on a full disk, which names no
    errno): its partial folder is removed and the run stops in one line (OutOfDisk). Nothing saved before it
    is touched: a save writes into its own .partial folder, and prunes older checkpoints only once published."""
    try:
        yield
    except (OSError, RuntimeError, dcp.api.CheckpointException) as e:
        if getattr(e, "errno", None) != errno.ENOSPC and shutil.disk_usage(out).free >= need:
            raise
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise OutOfDisk(out_of_disk(out, need, what)) from None


def save_checkpoint(args, step, models, questions, wandb_id, fingerprints, tokenizer, rank, first_gaps=()):
    """checkpoint.save of everything the loop needs to go on exactly: weights, optimizer, schedule, the
    question order and its random state, what a resume checks (the fingerprints), and the sampler gaps
    of the run's first steps (SamplerGapWatch.first). First the disk's room for it: the size of the newest
    checkpoint, or before the first the estimate of checkpoint.checkpoint_bytes."""
    trainer_state = {"scheduler": models.scheduler.state_dict(), **questions.state(), "wandb_id": wandb_id,
                     "fingerprints": fingerprints, "sampler_gap_first": list(first_gaps)}
    newest = checkpoint.latest(args.out)
    need = checkpoint.folder_bytes(newest) if newest else checkpoint.checkpoint_bytes(models.policy, models.teacher)
    check_room_on_all_ranks(args.out, need, "a checkpoint", rank)
    t0 = time.perf_counter()
    with stop_cleanly_if_the_disk_fills(args.out, need, "a checkpoint", checkpoint.step_dir(args.out, step) +
                                        ".partial", rank):
        path = checkpoint.save(args.out, step, models.policy, models.optimizer, models.teacher, trainer_state,
                               config_of(args), tokenizer, args.keep_last)
    if rank == 0:
        tqdm.write(f"saved {path} ({time.perf_counter() - t0:.1f} s)")


def save_final(policy, model_dir, tokenizer, out, rank, preset):
    """The trained policy as a Hugging Face model in OUT/final: the full fp32 weights, gathered into
    rank 0's CPU memory only, written as final.partial/ and then renamed, so that a crash never leaves
    a final/ that is not whole. Its RUN_MARK names the run's preset, which a run from it keeps."""
    from transformers import AutoModelForCausalLM
    final = os.path.join(out, "final")
    need = checkpoint.final_model_bytes(policy)
    check_room_on_all_ranks(out, need, "the final model", rank)
    weights = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with stop_cleanly_if_the_disk_fills(out, need, "the final model", final + ".partial", rank):
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            model.load_state_dict(weights)
            shutil.rmtree(final + ".partial", ignore_errors=True)
            model.save_pretrained(final + ".partial")
            tokenizer.save_pretrained(final + ".partial")
            checkpoint.mark_model_folder(final + ".partial", preset)
            checkpoint.fsync_files(final + ".partial")
            checkpoint.publish(final + ".partial", final)
        print(f"saved {final}")


# The sampler gap a correct run of each precision cannot reach (mean |engine - trainer| log-prob per token), and
# how it was set: fp32 on a CPU stayed at or under 5.1e-7 in every step of the committed classroom studies (47
# runs, up to 300 steps); bf16 stayed at or under 0.003 in the runs of study/bf16 (the classroom, 300
# steps, vLLM and transformers' engine), and public reports for 4B models give 0.01-0.04, rising slowly over
# training. Each ceiling is far above what its precision showed (2,000x for fp32, about 7x the public 4B
# figures for bf16) and below what an engine left on stale weights reaches within a few steps at a learning
# rate that moves the weights (study/bf16/README.md).
SAMPLER_GAP_CEILING = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.25}


class SamplerGapStop(GuardStop):
    """The sampler gap passed its ceiling: the engine does not run the trainer's weights."""


class SamplerGapWatch:
    """The sampler gap (`sampler_gap`: the mean |engine - trainer| log-prob per token of the engine's own
    samples) as a health signal. The exact check of each sync is the engine's own (rollout.py: every tensor
    sent and taken, a sample read back bit for bit); this watch reads what the samples show.

    - A warning when the gap jumps: above --sampler_gap_factor times the mean of the run's first
      BASELINE_STEPS steps, and again each time it doubles past the last warning. bf16 kernels differ by a
      gap that may grow as training goes on, so a jump alone does not stop the run.
    - A stop when the gap passes the ceiling of the run's precision (SAMPLER_GAP_CEILING, or
      --max_sampler_gap): an engine on other weights than the trainer's. A skipped or partial sync passes it
      once the weights it left out have moved far enough; at a small learning rate that may take many steps,
      and only the read-back sees it sooner (GPUS.md, the weight sync).

    `first` (the first steps' gaps) goes into checkpoints, so that a resumed run keeps its baseline."""
    BASELINE_STEPS = 3

    def __init__(self, ceiling, factor, first=()):
        self.ceiling, self.factor, self.first, self.warned = ceiling, factor, list(first), None

    @property
    def baseline(self):
        return sum(self.first) / len(self.first) if len(self.first) == self.BASELINE_STEPS else None

    def check(self, step, record):
        """Raises SamplerGapStop past the ceiling; returns a warning (a line) or None."""
        gap = record["sampler_gap"]
        if not gap <= self.ceiling:
            raise SamplerGapStop(f"step {step}: the rollout engine's log-probs differ from the trainer's by {gap:.3g} "
                               f"per token (> {self.ceiling:g}, the ceiling of a correct run in this precision: "
                               f"--max_sampler_gap): the engine is not running the trainer's weights. Check the "
                               f"weight sync (names and dtypes the engine expects); the run's metrics.jsonl shows "
                               f"the gap step by step")
        if self.baseline is None:
            self.first.append(gap)
            return None
        if gap > self.factor * self.baseline and (self.warned is None or gap > 2 * self.warned):
            self.warned = gap
            return (f"step {step}: the sampler gap is {gap:.3g} per token, {gap / self.baseline:.1f}x the mean of the "
                    f"run's first steps ({self.baseline:.3g}); the run goes on (it stops above {self.ceiling:g}). "
                    f"A gap that keeps growing suggests the engine misses part of the weights")
        return None
