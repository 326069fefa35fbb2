"""Errors and exit codes: how a run stops, in one line and with one status. train.py and eval.py run under
`exit_on_usage_error`, which prints the message alone, without a traceback, from the first rank.

    2   USAGE: a UsageError, a mistake in what was asked for, found before anything ran, or a stop the user can act
        on (a damaged checkpoint, a full disk). The message says what to do.
    3   GUARD_STOP: a guard stopped every rank together (a failed weight sync, the sampler gap past its ceiling, a
        non-finite value, groups out of order). The message says what happened and the likely cause.
    75  STOPPED: a signal asked the run to stop, and it wrote a checkpoint first (EX_TEMPFAIL): torchrun restarts
        a worker that exits with it, a Slurm script requeues.
"""
import os
import sys
import time

USAGE = 2
GUARD_STOP = 3
STOPPED = 75
USAGE_ERROR_WAIT_S = 10       # how long a rank other than 0 waits, after a stop, for its launcher to stop it


class UsageError(Exception):
    """A mistake in what was asked for, or a stop the user can act on (subclasses keep the built-in types)."""


class RefusedSetting(UsageError, ValueError):
    pass


class InputError(UsageError, ValueError):
    pass


class MissingInput(UsageError, FileNotFoundError):
    pass


class FolderInUse(UsageError, FileExistsError):
    pass


class DamagedCheckpoint(UsageError):
    """--resume of a checkpoint that cannot be read: the message names it and the one before it."""


class OutOfDisk(UsageError):
    """The disk of --out cannot hold the next save: the message names the disk, the need and the checkpoint kept."""


class GuardStop(RuntimeError):
    """A guard stopped the run, every rank together: its message says what happened, why and what to do."""


class WeightSyncError(GuardStop):
    """A rollout engine does not hold the weights it was sent."""


class NonFiniteError(GuardStop, FloatingPointError):
    """A loss, sampler log-prob gap or gradient norm that is NaN or infinite: the step stops before the optimizer
    touches the weights."""


class GroupOrderError(GuardStop):
    """The rollout engine returned groups that do not answer the prompts asked, in their order."""


class SamplerGapStop(GuardStop):
    """The sampler gap passed its ceiling: the engine does not run the trainer's weights."""


def refuse(message):
    """Stop before anything ran: a setting that cannot work."""
    raise RefusedSetting(f"{message}; nothing was run")


def exit_on_usage_error(main, program):
    """Run main(); a UsageError or a GuardStop becomes one line on stderr, from the first rank only, and its status.
    The other ranks wait (at most USAGE_ERROR_WAIT_S) for the launcher to stop them: torchrun's agent stops every
    worker at the first one's exit, and a rank that exited before rank 0 had printed would cut its line off."""
    try:
        return main()
    except (UsageError, GuardStop) as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"{program}: {'error' if isinstance(e, UsageError) else 'stopped'}: {e}", file=sys.stderr,
                  flush=True)
        else:
            time.sleep(USAGE_ERROR_WAIT_S)
        sys.exit(USAGE if isinstance(e, UsageError) else GUARD_STOP)
