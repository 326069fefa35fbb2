"""train.py whose vLLM engine's weight loads leave every o_proj as it was: each load streams every tensor through the
engine's checks as ever, but vLLM's worker is handed the weights without the o_proj ones (`_freezing_o_proj`), so
it keeps those layers' repacked weights of the start checkpoint and, but for a warning, says nothing.

    python tests/train_frozen_o_proj.py [train.py's flags]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import config  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402


def _freezing_o_proj(worker, weights_iterator):
    """Runs in the vLLM worker in place of its reload_weights: the load without the o_proj tensors."""
    worker.reload_weights(weights_iterator=((name, t) for name, t in weights_iterator if ".o_proj." not in name))


if __name__ == "__main__":
    start = rollout.VLLMEngine.__init__

    def freezing_engine(engine, *args, **kwargs):
        start(engine, *args, **kwargs)
        rpc = engine.llm.collective_rpc
        engine.llm.collective_rpc = lambda method, **kw: rpc(_freezing_o_proj if method == "reload_weights" else
                                                             method, **kw)
    rollout.VLLMEngine.__init__ = freezing_engine
    sys.exit(exit_on_usage_error(train.main, "train.py"))
