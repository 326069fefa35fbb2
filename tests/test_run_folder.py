"""A run's folder is its own: two runs never share one, a run's workers stop when their launcher is
gone and keep a resume out until they do.

Each run is a `train.py` process in a session of its own, as in test_resume.py."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT
from test_resume import _free_port, _state, process_tree, records

SHORT = ["--method", "gt", "--pairs_per_step", "8", "--group_size", "4", "--eval_limit", "16", "--eval_every", "100"]


def launch(out, *flags, torchrun=False, log=None):
    """train.py (under torchrun with one worker when `torchrun`) in a new session, logging to `log`."""
    launcher = [sys.executable] if not torchrun else \
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
         f"--rdzv_endpoint=127.0.0.1:{_free_port()}"]
    return subprocess.Popen([*launcher, os.path.join(ROOT, "train.py"), "--out", str(out), *flags], cwd=ROOT,
                            stdout=open(log or f"{out}.log", "a"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_two_runs_started_on_one_folder_one_is_refused_and_the_others_metrics_are_whole(tmp_path):
    """The second comes within a second, with --overwrite, while the first still loads: the folder
    is locked before anything slow, so it is refused without deleting anything."""
    out = tmp_path / "run"
    first = launch(out, *SHORT, "--steps", "3", log=tmp_path / "first.log")
    time.sleep(0.5)
    second = launch(out, *SHORT, "--steps", "3", "--overwrite", log=tmp_path / "second.log")
    codes = first.wait(timeout=900), second.wait(timeout=900)
    logs = [open(tmp_path / name).read() for name in ("first.log", "second.log")]
    assert sorted(codes) == [0, 1], logs
    refused = logs[codes.index(1)]
    assert f"--out {out} is in use by another run (pid " in refused and "Nothing was run or deleted" in refused
    lines = open(out / "metrics.jsonl").read().splitlines()
    assert all(line.startswith("{") and line.endswith("}") for line in lines)
    assert [(r["step"], "reward" in r) for r in map(json.loads, lines)] == \
        [(0, False), (1, True), (2, True), (3, True), (3, False)]
    assert json.load(open(out / "config.json"))["steps"] == 3 and os.path.isdir(out / "final")


def _worker(launcher_pid):
    """The train.py worker under a torchrun launcher."""
    for pid in process_tree(launcher_pid):
        cmdline = open(f"/proc/{pid}/cmdline").read().split("\0")
        if pid != launcher_pid and any(arg.endswith("train.py") for arg in cmdline):
            return pid
    raise AssertionError("no train.py worker under the launcher")


def test_a_worker_whose_launcher_is_killed_stops_and_keeps_a_resume_out(tmp_path):
    """kill -9 of torchrun at step 1 of 6 leaves its worker running. Until it ends, a --resume is
    refused (the worker is frozen meanwhile, so that it surely lives); then it finishes its step,
    sees its launcher gone, writes a checkpoint and exits, without a final model."""
    out = tmp_path / "run"
    launcher = launch(out, *SHORT, "--steps", "6", "--save_every", "1", torchrun=True)
    deadline = time.time() + 900
    while not os.path.isdir(out / "checkpoints" / "step_1"):        # saved after step 1: a resume would start
        assert launcher.poll() is None and time.time() < deadline, open(f"{out}.log").read()[-3000:]
        time.sleep(0.05)
    worker = _worker(launcher.pid)
    os.kill(worker, signal.SIGSTOP)
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        resume = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--out", str(out), "--resume"],
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert resume.returncode != 0 and "is in use by another run" in resume.stderr, resume.stderr[-3000:]
    while _state(worker) not in (None, "Z"):
        assert time.time() < deadline, open(f"{out}.log").read()[-3000:]
        time.sleep(0.1)
    log = open(f"{out}.log").read()
    assert "the launcher (pid" in log and "is gone: finishing this step, then writing a checkpoint" in log
    steps = [r["step"] for r in records(out) if "reward" in r]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < 6
    assert os.path.isdir(out / "checkpoints" / f"step_{steps[-1]}") and not os.path.exists(out / "final")
