"""Restarts and resume. A run continues exactly: every request is seeded by the run's seed, the step, the question
and the view (rollout.py), and a checkpoint holds every random state the loop draws from. `restore` loads one (what
the run wrote after it is moved aside); a launcher's restart (torchrun --max-restarts, a requeued Slurm job) of the
run that holds --out continues it from its newest checkpoint (`as_an_attempt`), with process-group keys of its own.
"""
import os
import shutil
import time

import torch.distributed as dist

from harness import checkpoint
from harness.errors import DamagedCheckpoint, InputError

RUN_ID = ".run.id"               # the launcher's id of the run that holds the folder (`attempt`): its restarts know it
LATEST = "latest"                # the value of a bare --resume: the newest checkpoint in --out


ARRIVALS = "nanocoreward/arrivals"     # the agents' store's count of the workers that started, over all attempts
_arrivals = {}                        # this process's arrival, by store: taken once


def workers_attempt():
    """Which start of torchrun's workers this is (0: the first), the same on every rank of every node. Each agent
    counts its own restarts (TORCHELASTIC_RESTART_COUNT), but not the one it makes when another node's agent comes
    back (a membership change): after a node loses its worker, the two nodes' new workers hold different counts. The
    agents' store, which every node's workers reach and which outlives their restarts, counts arrivals instead: each
    start of W workers takes the next W, so attempt a holds arrivals aW + 1 to (a + 1)W. A launcher whose workers host
    their own store (no TORCHELASTIC_USE_AGENT_STORE) keeps nothing between attempts: there the agent's count."""
    env = os.environ.get
    if env("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return int(env("TORCHELASTIC_RESTART_COUNT", 0))
    where = (env("MASTER_ADDR"), int(env("MASTER_PORT")), env("TORCHELASTIC_RUN_ID"))
    if where not in _arrivals:
        store = dist.TCPStore(where[0], where[1], is_master=False)
        _arrivals[where] = store.add(ARRIVALS, 1)
    return (_arrivals[where] - 1) // int(env("WORLD_SIZE"))


def attempt():
    """(the launcher's id of this run, this attempt's number, the restarts the launcher allows): torchrun's elastic
    agent (TORCHELASTIC_RUN_ID, `workers_attempt`, TORCHELASTIC_MAX_RESTARTS) and Slurm (SLURM_JOB_ID, and
    SLURM_RESTART_COUNT for a requeued job), whose job id stays the run's across requeues. (None, 0, 0) outside both."""
    env = os.environ.get
    slurm, elastic = env("SLURM_JOB_ID"), env("TORCHELASTIC_RUN_ID")
    run_id = f"slurm job {slurm}" if slurm else f"torchrun {elastic}" if elastic else None
    count = int(env("SLURM_RESTART_COUNT", 0) if slurm else 0) + (workers_attempt() if elastic else 0)
    return run_id, count, int(env("TORCHELASTIC_MAX_RESTARTS", 0))


def as_an_attempt(args):
    """A restart of the run that holds --out (its launcher's id in OUT/.run.id, this attempt's number above 0)
    continues it, with nothing typed: `args` (parsed) gets --resume, from its newest complete checkpoint, or
    --overwrite when it has none yet (the run starts afresh over its own first attempt's outputs), whatever the
    command said of either (--over, --resume=PATH, a --resume carried from the first attempt). Returns the line for
    run.log, or None for any other start: a second run on the folder is then refused as before."""
    run_id, count, allowed = attempt()
    path = os.path.join(args.out, RUN_ID) if args.out else ""
    if not count or not os.path.exists(path) or open(path).read() != str(run_id):
        return None
    latest = checkpoint.latest(args.out)
    args.resume, args.overwrite = (LATEST, None) if latest else (None, True)
    args.given = (args.given - {"resume", "overwrite"}) | ({"resume"} if latest else {"overwrite"})
    which = f"restart {count} of {allowed}" if allowed else f"restart {count}"
    if latest is None:
        return f"{which} of {run_id}: no complete checkpoint yet, so the run starts afresh"
    return f"{which} of {run_id}: continued from {latest}"


def claim(out):
    """Rank 0, once it holds --out: write the launcher's id of this run into OUT/.run.id, whole or not at all (its
    restarts read it while this rank writes it)."""
    with open(os.path.join(out, RUN_ID + ".tmp"), "w") as f:
        f.write(str(attempt()[0]))
    os.replace(os.path.join(out, RUN_ID + ".tmp"), os.path.join(out, RUN_ID))


def restart_store():
    """The process group's store on a restart of torchrun's workers: {} on a first attempt (env://, as torchrun says).
    torchrun's agent hosts the store its workers share and keeps it across restarts, with the keys of the failed
    attempt's groups in it: a restart's new groups (vLLM's among them) have the same names and would read the dead
    ranks' addresses. A restart's keys go under a prefix of its own, named by `workers_attempt`: every rank names
    the same one, whichever node's agent counted the restart."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not (attempt := workers_attempt()):
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    return {"store": dist.PrefixStore(f"attempt_{attempt}/", store), "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


def dropped_note(steps):
    """What a resume dropped from metrics.jsonl: the steps logged after its checkpoint (a failed attempt's)."""
    if not steps:
        return ""
    return f"; the steps after it that the failed attempt had logged ({steps[0]}-{steps[-1]}) are dropped from " \
           f"metrics.jsonl and run again"


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
