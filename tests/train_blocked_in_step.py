"""train.py whose main thread, in one step, blocks for ever in a C call that signals do not interrupt: what a
rank waiting in a collective for a peer, or inside a long operator, looks like to a signal.

    BLOCKED_IN_STEP=S python tests/train_blocked_in_step.py [train.py's flags]

At step S (before its rollout) it prints "blocked in step S" and reads, through ctypes (which releases the GIL),
from a pipe that nothing writes to, with SA_RESTART set on SIGINT and SIGTERM: the kernel resumes the read after
each signal's C-level handler, so the main thread never returns to Python. With --ranks the workers run this
script too (the variable is inherited), each blocking in step S: rank 0 in the read, the others wherever they
wait for it.
"""
import ctypes
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import config  # noqa: E402
import train  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402

if __name__ == "__main__":
    blocked_in = int(os.environ["BLOCKED_IN_STEP"])
    step = train.training_step

    def blocked_in_step(args, step_number, *rest):
        if step_number == blocked_in and int(os.environ.get("RANK", 0)) == 0:
            for stop in (signal.SIGINT, signal.SIGTERM):
                signal.siginterrupt(stop, False)
            print(f"blocked in step {step_number}", flush=True)
            never, _ = os.pipe()
            ctypes.CDLL(None).read(never, ctypes.create_string_buffer(1), 1)
        return step(args, step_number, *rest)
    train.training_step = blocked_in_step
    train.__file__ = os.path.abspath(__file__)          # --ranks starts this script as each worker
    sys.exit(exit_on_usage_error(train.main, "train.py"))
