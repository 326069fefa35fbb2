"""train.py, killed (SIGKILL, as a crash would end it) in the checkpoint of one step, once every part of the
checkpoint is written and before it is published: what a kill during a save leaves behind.

    python tests/train_killed_in_save.py STEP [train.py's flags]
"""
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness import checkpoint  # noqa: E402
import config  # noqa: E402
import train  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402

if __name__ == "__main__":
    step = sys.argv.pop(1)
    publish = checkpoint.publish

    def killed_before_publishing(partial, final):
        if os.path.basename(final) == f"step_{step}":
            os.kill(os.getpid(), signal.SIGKILL)
        publish(partial, final)
    checkpoint.publish = killed_before_publishing
    sys.exit(exit_on_usage_error(train.main, "train.py"))
