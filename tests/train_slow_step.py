"""train.py whose step S lasts SLOW_S seconds longer: a step in flight, long enough for a scheduler's signal to land in
it, as a seed step of minutes does on a GPU node.

    SLOW_STEP=S SLOW_S=SECONDS python tests/train_slow_step.py [train.py's flags]

At step S (before its rollout) rank 0 prints "in step S" and sleeps; a stop signal sets the run's flag and the sleep
goes on (PEP 475), so the step ends as it would have, and the run then stops as train.py stops at a signal.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import train  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402

if __name__ == "__main__":
    slow_in, seconds = int(os.environ["SLOW_STEP"]), float(os.environ["SLOW_S"])
    step = train.training_step

    def slow_step(args, step_number, *rest):
        if step_number == slow_in and int(os.environ.get("RANK", 0)) == 0:
            print(f"in step {step_number}", flush=True)
            time.sleep(seconds)
        return step(args, step_number, *rest)
    train.training_step = slow_step
    train.__file__ = os.path.abspath(__file__)          # --ranks starts this script as each worker
    sys.exit(exit_on_usage_error(train.main, "train.py"))
