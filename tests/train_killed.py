"""train.py with one rank killed (SIGKILL, as a lost node or a crash ends it) at a chosen point of the run, for the
tests of torchrun's restarts:

    KILL_RANK=R KILL_AT=saved:S|step:S [KILL_ATTEMPTS=first|every] python tests/train_killed.py [train.py's flags]

`saved:S` kills rank R right after step S's checkpoint is complete; `step:S` at the start of step S. `first` (the
default) kills once in the run (a file OUT.killed marks it), so that a restart runs on; `every` in each
attempt, so that the restarts are spent. With --ranks the workers run this script too (the variables are inherited).
HOLD_S=SECONDS: rank 0 sleeps that long at the start of the step where rank R is killed, once in the run (a rollout's
minutes away from any collective, when the kill lands).
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import config  # noqa: E402
from harness import checkpoint  # noqa: E402
import train  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402


def killed_here(where, step, out):
    """SIGKILL this process if it is the rank, the point and the attempt asked for (the first: no kill in this run
    folder yet, OUT.killed, whatever the agent's count says)."""
    first_only = os.environ.get("KILL_ATTEMPTS", "first") == "first"
    if (os.environ["KILL_AT"] == f"{where}:{step}" and int(os.environ.get("RANK", 0)) == int(os.environ["KILL_RANK"])
            and not (first_only and os.path.exists(f"{out}.killed"))):
        open(f"{out}.killed", "w").close()
        print(f"rank {os.environ.get('RANK', 0)} killed at {where} {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    save, step = checkpoint.save_checkpoint, train.training_step

    def saved_then_killed(args, configuration, step_number, *rest, **kwargs):
        save(args, configuration, step_number, *rest, **kwargs)
        killed_here("saved", step_number, args.out)

    def killed_in_step(args, step_number, *rest):
        held = f"{args.out}.held"
        if (os.environ["KILL_AT"] == f"step:{step_number}" and "HOLD_S" in os.environ
                and int(os.environ.get("RANK", 0)) == 0 and not os.path.exists(held)):
            open(held, "w").close()
            print(f"rank 0 holds at step {step_number}", flush=True)
            time.sleep(float(os.environ["HOLD_S"]))
        killed_here("step", step_number, args.out)
        return step(args, step_number, *rest)
    checkpoint.save_checkpoint, train.training_step = saved_then_killed, killed_in_step
    train.__file__ = os.path.abspath(__file__)          # --ranks starts this script as each worker
    sys.exit(exit_on_usage_error(train.main, "train.py"))
