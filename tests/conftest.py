import fcntl
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The cores shared out among xdist's workers: each worker, and every process it starts, computes on its share
# (OMP_NUM_THREADS, set before torch is imported; torch, train.py and vLLM's CPU worker read it). Two workers of
# two OpenMP threads each on 2 cores wait on each other's spinning threads: twice the time for the same work
# (bench/suite.md).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, len(os.sched_getaffinity(0)) // WORKERS)
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
# The loop's modules, then the tools' folders, so that a test imports a tool as the tool's script imports its
# neighbours (study.py imports plot). `import study` is study/study.py: a module wins over a folder without
# __init__.py.
sys.path[:0] = [ROOT] + [os.path.join(ROOT, folder) for folder in ("classroom", "study", "tools")]


# The quick tier (`python -m pytest -m quick`, the loop of an edit to the algorithm): the tests of these files, the
# algorithm's and its settings', but those that start an engine (marked vllm) or several processes or compile
# (marked full). Engines and whole runs are in the full suite only.
QUICK_FILES = ("test_grpo.py", "test_rewards.py", "test_teacher.py", "test_logprobs.py", "test_answers.py",
               "test_data.py", "test_config.py", "test_exercises.py", "test_scale.py")


# The tests of documents (marked docs): each keeps a document true, to the code's tables or to what a command prints.
# They run in the full suite and CI; a change to the code (a new method row) passes the quick tier before the documents
# follow, and `pytest -m docs` then says which document and which line.
DOC_FILES = ("test_readme.py", "test_documented_commands.py", "test_study_results.py", "test_figures.py", "test_links.py")


def pytest_collection_modifyitems(config, items):
    """Puts the tests marked `first` first: the suite's longest, so that xdist's other worker runs the rest beside
    them instead of waiting on one at the end. Marks the quick tier (QUICK_FILES). Tests marked `vllm` start vLLM's
    engine or check what it samples: where vLLM is not installed (macOS; or tests/without_vllm on PYTHONPATH) they
    are skipped, with the reason. Every other test runs either way, but those marked `launcher` (restarts, signals,
    the run folder's locks: no engine in what they check) run once in CI, in its pass with vLLM."""
    from config import VLLM_PLATFORMS, vllm_installed
    items.sort(key=lambda item: item.get_closest_marker("first") is None)      # stable: the rest keep their order
    for item in items:
        if item.path.name in DOC_FILES:
            item.add_marker(pytest.mark.docs)
        if item.path.name in QUICK_FILES and not any(item.get_closest_marker(m) for m in ("vllm", "full", "docs")):
            item.add_marker(pytest.mark.quick)
    if vllm_installed():
        return
    skip = pytest.mark.skip(reason=f"needs vLLM, which is not installed here (requirements.txt installs it on "
                                   f"{VLLM_PLATFORMS})")
    stood_in = sys.modules.get("vllm", "absent") is None        # tests/without_vllm: CI's second pass, after the first
    again = pytest.mark.skip(reason="the launcher's and the signals' machinery, the same on either engine: CI's first "
                                    "pass ran it (.ci/run)")
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(skip)
        elif stood_in and item.get_closest_marker("launcher"):
            item.add_marker(again)


@pytest.fixture(scope="session")
def shared_folder(tmp_path_factory):
    """shared_folder(name, make) -> a folder `make(folder)` fills once per test session, for what several tests read
    and none changes (a whole run): under xdist the first worker to ask makes it while the others wait on its lock,
    then every worker reads the same folder. A make that fails leaves nothing, and the next test to ask tries again."""
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if WORKERS > 1 else root) / "shared"       # pytest-N/shared: above each worker's popen-gwK/
    root.mkdir(exist_ok=True)

    def get(name, make):
        folder = root / name
        with open(f"{folder}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(f"{folder}.done"):
                shutil.rmtree(folder, ignore_errors=True)
                make(folder)
                open(f"{folder}.done", "w").close()
        return folder
    return get


@pytest.fixture
def dist_world():
    """A process group of one (gloo), as train.py has under `python train.py`. Per test: closing
    a vLLM engine tears down the process group it shares."""
    from harness.sharding import init_distributed
    return init_distributed()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised classroom-sized Qwen3 with the classroom tokenizer, saved to disk."""
    import torch
    from transformers import Qwen3ForCausalLM
    from harness import world
    out = str(tmp_path_factory.mktemp("tiny"))
    tok = world.build_tokenizer()
    torch.manual_seed(0)
    Qwen3ForCausalLM(world.model_config(len(tok))).save_pretrained(out)
    tok.save_pretrained(out)
    return out
