import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The loop's modules, then the tools' folders, so that a test imports a tool as the tool's script imports its
# neighbours (study.py imports plot). `import study` is study/study.py: a module wins over a folder without
# __init__.py.
sys.path[:0] = [ROOT] + [os.path.join(ROOT, folder) for folder in ("classroom", "study", "tools")]


# The quick tier (`python -m pytest -m quick`, the loop of an edit to the algorithm): the tests of these files, the
# algorithm's and its settings', but those that start an engine (marked vllm) or several processes or compile
# (marked full). Engines and whole runs are in the full suite only.
QUICK_FILES = ("test_grpo.py", "test_rewards.py", "test_teacher.py", "test_logprobs.py", "test_answers.py",
               "test_data.py", "test_config.py", "test_exercises.py", "test_scale.py")


def pytest_collection_modifyitems(config, items):
    """Marks the quick tier (QUICK_FILES). Tests marked `vllm` start vLLM's engine or check what it samples: where
    vLLM is not installed (macOS; or tests/without_vllm on PYTHONPATH) they are skipped, with the reason. Every
    other test runs either way."""
    from config import VLLM_PLATFORMS, vllm_installed
    for item in items:
        if item.path.name in QUICK_FILES and not (item.get_closest_marker("vllm") or item.get_closest_marker("full")):
            item.add_marker(pytest.mark.quick)
    if vllm_installed():
        return
    skip = pytest.mark.skip(reason=f"needs vLLM, which is not installed here (requirements.txt installs it on "
                                   f"{VLLM_PLATFORMS})")
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(skip)


@pytest.fixture
def dist_world():
    """A process group of one (gloo), as train.py has under `python train.py`. Per test: closing
    a vLLM engine tears down the process group it shares."""
    from sharding import init_distributed
    return init_distributed()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised classroom-sized Qwen3 with the classroom tokenizer, saved to disk."""
    import torch
    from transformers import Qwen3ForCausalLM
    import world
    out = str(tmp_path_factory.mktemp("tiny"))
    tok = world.build_tokenizer()
    torch.manual_seed(0)
    Qwen3ForCausalLM(world.model_config(len(tok))).save_pretrained(out)
    tok.save_pretrained(out)
    return out
