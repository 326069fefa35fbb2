"""Errors and exit codes: how a run stops, in one line and with one status. train.py and eval.py run under
`exit_on_usage_error`, which prints the message alone, without a traceback, from the first rank.

    2   USAGE: a UsageError, a mistake in what was asked for, found before anything ran, or a stop the user can act
        on (a damaged checkpoint, a full disk). The message says what to do.
    3   GUARD_STOP: a guard stopped every rank together (a failed weight sync, the sampler gap past its ceiling, a
        non-finite value, groups out of order). The message says what happened and the likely cause.
    75  STOPPED: a signal asked the run to stop, and it wrote a checkpoint first (EX_TEMPFAIL): torchrun restarts
        a worker that exits with it, a Slurm script requeues.
"""
import math
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
    """A loss, sampler log-prob gap or gradient norm that is NaN or infinite, found before the optimizer steps."""


class GroupOrderError(GuardStop):
    """The rollout engine returned groups that do not answer the prompts asked, in their order."""


class SamplerGapStop(GuardStop):
    """The sampler gap passed its ceiling: the engine does not run the trainer's weights."""


def check_groups(groups, prompt_ids, ids, group_size, who):
    """Each group holds `group_size` responses to its prompt, in the order asked: a group out of place would be
    labelled by another question's vote (rewards.twin pairs groups by place). ids: each prompt's (question, view)."""
    if len(groups) != len(prompt_ids):
        raise GroupOrderError(f"{who}: the rollout engine returned {len(groups)} groups for {len(prompt_ids)} prompts")
    for group, prompt, (index, view) in zip(groups, prompt_ids, ids):
        if len(group) != group_size or any(list(s.prompt_ids) != list(prompt) for s in group):
            raise GroupOrderError(
                f"{who}: the group for question {index} ({'its rephrasing' if view else 'the original'}) holds "
                f"{len(group)} responses, not all to its prompt, where {group_size} were asked: the rollout engine "
                f"returned its groups out of the order of their prompts. The step stopped before any label was "
                f"computed; the engine (rollout.py) is at fault, not the data")


def stop_if_non_finite(nonfinite, norm, update, updates):
    """Raise NonFiniteError, before the optimizer steps, when any rank's losses or sampler gaps (`nonfinite`, summed
    over ranks) or the gradient norm is NaN or infinite."""
    if nonfinite.any() or not math.isfinite(norm):
        raise NonFiniteError(
            f"update {update + 1} of {updates}: {int(nonfinite[0])} non-finite loss(es), {int(nonfinite[1])} "
            f"non-finite sampler log-prob gap(s), gradient norm {norm}. The update was not applied: the weights are "
            f"those before it. Look for NaN or infinite rewards or advantages, a rollout engine returning NaN "
            f"log-probs (its weights), or a learning rate too high for the dtype.")


def refuse(message):
    """Stop before anything ran: a setting that cannot work."""
    raise RefusedSetting(f"{message}; nothing was run")


def exit_on_usage_error(main, program):
    """Run main(); a UsageError or a GuardStop becomes one line on stderr from the first rank, and its status. The
    other ranks wait (at most USAGE_ERROR_WAIT_S): torchrun stops every worker at the first exit, mid-line perhaps."""
    try:
        return main()
    except (UsageError, GuardStop) as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"{program}: {'error' if isinstance(e, UsageError) else 'stopped'}: {e}", file=sys.stderr,
                  flush=True)
        else:
            time.sleep(USAGE_ERROR_WAIT_S)
        sys.exit(USAGE if isinstance(e, UsageError) else GUARD_STOP)
