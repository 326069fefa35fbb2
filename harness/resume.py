"""Restarts and resume. A run continues exactly: every request is seeded by the run's seed, the step, the question
and the view (rollout.py), and a checkpoint holds every random state the loop draws from. train.py calls `begin` once:
a launcher's restart (torchrun --max-restarts, a requeued Slurm job) of the run that holds --out continues it from its
newest checkpoint (`as_an_attempt`), with process-group keys of its own (`restart_store`); --resume takes its
checkpoint's settings (`resume_settings`). Once the models are built, `restore` loads the checkpoint (what the run
wrote after it is moved aside). What a checkpoint holds is harness/checkpoint.py's.
"""
import argparse
import dataclasses
import os
import shutil
import time

import torch.distributed as dist

from harness import checkpoint
from harness.errors import DamagedCheckpoint, InputError, MissingInput, refuse
from harness.runfolder import RUN_ID

LATEST = "latest"                # the value of a bare --resume: the newest checkpoint in --out
ARRIVALS = "nanocoreward/arrivals"     # the agents' store's count of the workers that started, over all attempts
_arrivals = {}                        # this process's arrival, by store: taken once


def workers_attempt():
    """Which start of torchrun's workers this is (0: the first), the same on every rank of every node. An agent's
    TORCHELASTIC_RESTART_COUNT leaves out the restart a membership change makes (another node's agent back), so the
    agents' store, which outlives the workers, counts arrivals: attempt a of W workers holds arrivals aW + 1 to
    (a + 1)W. Workers that host their own store (no TORCHELASTIC_USE_AGENT_STORE) keep nothing: the agent's count."""
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
    """A restart of the run that holds --out (its launcher's id in OUT/.run.id, an attempt above 0) continues it:
    `args` gets --resume of its newest complete checkpoint, or --overwrite when it has none yet, whatever the command
    said of either. Returns the line for run.log, or None for any other start (a second run on --out is refused)."""
    run_id, count, allowed = attempt()
    path = os.path.join(args.out, RUN_ID) if args.out else ""
    if not count or not os.path.exists(path) or open(path).read() != str(run_id):
        return None
    latest = checkpoint.latest(args.out)
    args.resume, args.overwrite = (LATEST, None) if latest else (None, True)
    args.given = (args.given - {"resume", "overwrite"}) | ({"resume"} if latest else {"overwrite"})
    which = f"restart {count} of {allowed}" if allowed else f"restart {count}"
    how = f"continued from {latest}" if latest else "no complete checkpoint yet, so the run starts afresh"
    return f"{which} of {run_id}: {how}"


@dataclasses.dataclass
class Start:
    """How a run starts (`begin`)."""
    args: argparse.Namespace      # its settings: the flags, or (--resume, a restart) its checkpoint's
    checkpoint: str | None        # the checkpoint it continues; None: a fresh run
    restart: str | None           # a launcher's restart of the run: the line for run.log
    finished: bool                # --resume of a finished run: nothing to do (`finished` said so)
    store: dict                   # the process group's store (`restart_store`)
    run_id: str | None            # the launcher's id of the run (`attempt`), for OUT/.run.id


def begin(args, presets, not_config):
    """The Start of a run from its parsed flags: a launcher's restart of the run that holds --out continues it
    (`as_an_attempt`), and --resume takes the checkpoint's settings, checked against the flags given again
    (`resume_settings`: presets, config.PRESETS; not_config, config.NOT_CONFIG)."""
    restart = as_an_attempt(args)
    path = None
    if args.resume is not None:
        args, path = resume_settings(args, presets, not_config)
    return Start(args, path, restart, path is not None and finished(path, args), restart_store(), attempt()[0])


def restart_store():
    """The process group's store on a restart of torchrun's workers: {} on a first attempt (env://). The agent's store
    keeps the failed attempt's keys, where a restart's groups of the same names (vLLM's among them) would find the dead
    ranks' addresses: a restart's keys go under a prefix of its own, named by `workers_attempt` (one for all ranks)."""
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


def restore(path, trained, questions, args, rank):
    """Continue from the checkpoint `path`: its weights, optimizer and schedule go into `trained` (checkpoint.Trained),
    its question order into `questions` (data.Questions); rank 0 moves aside what the run wrote after it. Returns (its
    step, its wandb run id, its first steps' sampler gaps: [] from before the watch kept them, measured afresh)."""
    state = load_checkpoint(path, trained.policy, trained.optimizer, trained.teacher)
    trained.scheduler.load_state_dict(state["scheduler"])
    questions.load_state(state)
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
    """--resume of a run that is done (its checkpoint `path` of the last step, final/ holding its model): says so (first
    rank) and returns True. A run is not extended, as its length sets its schedules: a longer one starts from final/."""
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
    """Rank 0, on resume: move what the run wrote after the checkpoint (later checkpoints, a final/ model) into
    OUT/superseded/TIME/, not deleted, and say so."""
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


# Settings added since runs were saved: a checkpoint's config.json from before lacks them, and its run ran as its
# preset's values of them say (resume_settings fills them in, and says which).
ADDED_SETTINGS = ("rollout_correction", "rollout_correction_cap", "hf_kv_budget_gib", "group_filter", "policy_loss",
                  "loss_agg", "advantage_std", "clip_high", "overlong", "overlong_buffer", "entropy_coef",
                  "rephrase_noise", "refill_rounds", "replay")
# Methods renamed when `coreward3` became the authors' Co-rewarding-III: (the name a run was saved under, the
# --teacher_prompts its runs saved, the name now). Its resume, or --method with the old name, is refused with the new.
RENAMED_METHODS = [
    ("coreward3_both", "same",      "coreward3"),
    ("coreward3",      "rephrased", "coreward2_rephrased"),
]
# What a resumed run may change; every other flag must agree with the checkpoint's configuration.
MAY_CHANGE_ON_RESUME = ("eval_every", "save_every", "keep_last", "max_sampler_gap", "sampler_gap_factor", "wandb",
                        "eval_samples", "hf_kv_budget_gib")


def renamed(method, teacher_prompts=None):
    """The name a method has now, of a run saved under its old name (teacher_prompts: the run's), or None."""
    return next((new for old, prompts, new in RENAMED_METHODS if method == old and teacher_prompts in (prompts, None)),
                None)


def resume_settings(args, presets, not_config):
    """(settings, checkpoint path) of `--resume`: the checkpoint's configuration, with the flags given now (`args.given`
    but `not_config`) checked against it. A flag outside MAY_CHANGE_ON_RESUME that differs stops the run."""
    given = args.given
    if args.overwrite:
        refuse("--resume continues the run in its folder and --overwrite would delete it: give one or the other")
    if args.resume == LATEST:
        if args.out is None:
            refuse("--resume needs --out (the run's folder), or --method for the default runs/METHOD")
        path = checkpoint.latest(args.out)
        if path is None:
            raise MissingInput(f"--resume: {args.out} holds no complete checkpoint (checkpoints/step_S); "
                               f"nothing to continue. Start the run without --resume")
        out = args.out
    else:
        path = os.path.normpath(args.resume)
        if not checkpoint.is_checkpoint(path):
            raise MissingInput(f"--resume {args.resume}: not a complete checkpoint folder (one holds trainer.pt "
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
    saved = checkpoint.read_config(path)
    filled = {k: presets[saved.get("preset", "classroom")][k] for k in ADDED_SETTINGS if k not in saved}
    if filled:
        print(f"resume: {path} was saved before " + ", ".join(f"--{k}" for k in filled) + " existed; its run continues "
              f"with the value it ran under: " + ", ".join(f"--{k} {v}" for k, v in filled.items()))
    settings = {**filled, **saved}
    new = renamed(settings["method"], settings.get("teacher_prompts", "same"))     # a config from before the flag
    if new and args.method != new:
        refuse(f"--resume {path}: its run trained --method {settings['method']}, which is now called {new}; add "
               f"--method {new} to continue it under that name")
    if new:
        print(f"resume: --method {settings['method']} is now called {new}")
        settings["method"] = new
    for name in sorted(given - {"resume", "out", *not_config}):
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
    kept = {"out": out, "resume": path, "overwrite": None, "ranks": args.ranks, "max_restarts": args.max_restarts,
            "given": given}
    return argparse.Namespace(**{**settings, **kept}), path
