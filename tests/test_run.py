"""The run folder (harness/runfolder.py): a run's folder is its own (two runs never share one, a run's workers stop when their
launcher is gone and keep a resume out until they do), the collapse watch, and wandb only when asked.

Each run is a `train.py` process in a session of its own, as in test_resume.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from harness import checkpoint, runfolder, watches
from conftest import ROOT
from test_resume import _free_port, _state, process_tree, records

SHORT = ["--method", "gt", "--questions_per_step", "8", "--group_size", "4", "--eval_limit", "16", "--eval_every", "100"]


def launch(out, *flags, torchrun=False, log=None):
    """train.py (under torchrun with one worker when `torchrun`) in a new session, logging to `log`."""
    launcher = [sys.executable] if not torchrun else \
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
         f"--rdzv_endpoint=127.0.0.1:{_free_port()}"]
    return subprocess.Popen([*launcher, os.path.join(ROOT, "train.py"), "--out", str(out), *flags], cwd=ROOT,
                            stdout=open(log or f"{out}.log", "a"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.launcher
def test_two_runs_started_on_one_folder_one_is_refused_and_the_others_metrics_are_whole(tmp_path):
    """The second comes within a second, with --overwrite, while the first still loads: the folder
    is locked before anything slow, so it is refused without deleting anything."""
    out = tmp_path / "run"
    first = launch(out, *SHORT, "--steps", "3", log=tmp_path / "first.log")
    time.sleep(0.5)
    second = launch(out, *SHORT, "--steps", "3", "--overwrite", log=tmp_path / "second.log")
    codes = first.wait(timeout=900), second.wait(timeout=900)
    logs = [open(tmp_path / name).read() for name in ("first.log", "second.log")]
    assert sorted(codes) == [0, 2], logs                        # the refused one: a usage error, status 2
    refused = logs[codes.index(2)]
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


@pytest.mark.launcher
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


def _trajectory(unanimous, zero_variance, no_answer=0.0, common_answer=None, truncated=0.0):
    common_answer = common_answer or [0.1] * len(unanimous)
    return [{"step": i + 1, "unanimous": u, "zero_variance": z, "no_answer": no_answer, "common_answer": c,
             "truncated": truncated} for i, (u, z, c) in enumerate(zip(unanimous, zero_variance, common_answer))]


def test_the_collapse_warning_fires_on_a_collapsing_run_and_not_on_a_healthy_one():
    """The rule: a mean over the last 10 steps of unanimous groups, zero-variance groups or
    responses without an answer at 0.8 or more. A run whose groups come to agree (unanimous 0.1 ->
    1.0 over 30 steps) is warned once, at the step where the 10-step mean reaches 0.8; a healthy run
    (a third of its groups unanimous, half without reward spread) never is; a run that stops
    answering is warned too."""
    collapsing = _trajectory([min(1.0, 0.1 + 0.03 * i) for i in range(40)],
                             [min(1.0, 0.2 + 0.03 * i) for i in range(40)])
    watch = watches.CollapseWatch()
    warned = [(r["step"], w) for r in collapsing if (w := watch.update(r))]
    # zero_variance at step s is 0.2 + 0.03 (s - 1): its mean over steps 17..26 is 0.2 + 0.03 x 20.5 = 0.815,
    # the first window at 0.8 or more (steps 16..25: 0.785), printed 0.82; unanimous stays 0.1 lower
    assert [s for s, _ in warned] == [26] and "zero_variance 0.82" in warned[0][1] and "collapsing" in warned[0][1]
    healthy = _trajectory([0.3 + 0.05 * (i % 3) for i in range(60)], [0.5 + 0.1 * (i % 2) for i in range(60)])
    watch = watches.CollapseWatch()
    assert not any(watch.update(r) for r in healthy)
    silent = _trajectory([0.0] * 20, [0.3] * 20, no_answer=0.9)
    watch = watches.CollapseWatch()
    assert [r["step"] for r in silent if watch.update(r)] == [10]
    babbling = _trajectory([0.0] * 20, [0.3] * 20, truncated=0.95)
    watch = watches.CollapseWatch()
    assert [r["step"] for r in babbling if watch.update(r)] == [10]


def test_the_collapse_warning_fires_when_every_question_gets_one_answer():
    """The reward hack of a vote without unanimous groups: the groups still disagree a little, but
    more and more questions get the same majority answer. common_answer rises 0.1 -> 0.7 by 0.02 a
    step; its mean over steps s-9..s is 0.1 + 0.02 (s - 5.5), first >= 0.2 at s = 10.5 -> step 11."""
    rising = [min(0.7, 0.1 + 0.02 * i) for i in range(40)]
    hacked = _trajectory([0.2] * 40, [0.4] * 40, common_answer=rising)
    watch = watches.CollapseWatch()
    warned = [(r["step"], w) for r in hacked if (w := watch.update(r))]
    assert [s for s, _ in warned] == [11] and "common_answer 0.21" in warned[0][1]


def test_wandb_is_not_needed_without_the_flag(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)          # `import wandb` fails
    with pytest.raises(ImportError, match="--wandb needs the wandb package"):
        runfolder.start_wandb("proj", "abc", {})


def _hub_cache(root, repo_id, model_dir):
    """A Hugging Face hub cache at `root` holding `repo_id` as a download leaves it: the files in
    models--org--name/snapshots/<commit>/, and refs/main naming the commit."""
    import shutil
    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return str(repo / "snapshots" / commit)


def test_a_hub_id_is_resolved_from_the_cache_and_a_missing_folder_is_refused_at_once(tmp_path, monkeypatch):
    """--model as users pass it: a cached Hugging Face id becomes its snapshot folder without the network;
    a path that names no folder is refused as one, not looked up on the hub; an id that is neither cached
    nor downloadable (offline) fails at once, naming the fixes."""
    import huggingface_hub.constants
    from harness import world
    snapshot = _hub_cache(tmp_path / "hub", "org/classroom", world.base_model_dir())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert checkpoint.model_folder_for_all_ranks("org/classroom") == snapshot
    assert checkpoint.model_folder_for_all_ranks(world.base_model_dir()) == world.base_model_dir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "notes.txt").write_text("")
    for missing in ("/nonexistent/model", "runs/coreward1/final", "models/smollm2-135m", "./qwen", "notes.txt"):
        t0 = time.perf_counter()
        with pytest.raises(FileNotFoundError, match=f"--model {missing}: no such folder"):
            checkpoint.model_folder_for_all_ranks(missing)
        assert time.perf_counter() - t0 < 1
    with pytest.raises(FileNotFoundError, match="the folder holds no config.json"):
        checkpoint.model_folder_for_all_ranks("models")
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"--model org/other is no folder here, and as a Hugging Face id it "
                                                r"is neither in the cache .* nor could it be downloaded "
                                                r".*hf download org/other"):
        checkpoint.model_folder_for_all_ranks("org/other")
    assert time.perf_counter() - t0 < 5


def test_a_run_from_a_hub_id_offline_trains_on_the_cached_snapshot(tmp_path):
    """train.py --model org/classroom with HF_HUB_OFFLINE=1 and a cache that holds it: the run trains, and
    its fingerprint is the snapshot's files."""
    from harness import world
    from harness.checkpoint import model_fingerprint
    snapshot = _hub_cache(tmp_path / "hub", "org/classroom", world.base_model_dir())
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--model", "org/classroom", "--preset",
                          "classroom", "--out", str(out), *SHORT, "--steps", "1", "--save_every", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
                              "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in records(out) if "reward" in r] == [1]
    from harness.checkpoint import read_trainer_state
    saved = read_trainer_state(str(out / "checkpoints" / "step_1"))
    assert saved["fingerprints"]["model"] == model_fingerprint(snapshot)


@pytest.fixture
def small_disk(tmp_path):
    """A 30 MiB tmpfs: room for two of the classroom's checkpoints (12.2 MB each) beside a run's logs, not three."""
    disk = tmp_path / "disk"
    disk.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(disk)], capture_output=True,
                         text=True)
    if res.returncode:
        pytest.skip(f"a small disk needs a tmpfs, which this user cannot mount ({res.stderr.strip()})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


DISK_RUN = ["--method", "gt", "--steps", "3", "--save_every", "1", "--keep_last", "0", "--questions_per_step", "4",
            "--group_size", "2", "--eval_limit", "4", "--eval_k", "0", "--eval_every", "3"]


def assert_stopped_at_step_3_keeping_step_2(out, message):
    from harness import checkpoint
    step_2 = os.path.join(out, "checkpoints", "step_2")
    assert message == (f"out of disk: {checkpoint.disk_of(out)}, which holds --out {out}, has "
                       f"{checkpoint.size(shutil.disk_usage(out).free)} free and a checkpoint needs "
                       f"{checkpoint.size(checkpoint.folder_bytes(step_2))}; the run stopped, the newest complete checkpoint, "
                       f"{step_2}, is kept: free some space, then continue with: python train.py --out {out} --resume")
    assert [s for s, _ in checkpoint.complete(out)] == [1, 2] and checkpoint.is_checkpoint(step_2)
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_1", "step_2"]   # no step_3.partial left


def test_a_disk_too_small_for_the_next_checkpoint_stops_in_one_line_keeping_the_last(small_disk):
    """Before each save the run checks the disk's free space: the third checkpoint does not fit, so the run stops
    with one line that names the disk, what is needed and the checkpoint kept. The summary line's account of a
    checkpoint is what one takes, DCP's records counted (within 1%: the tokenizer and the trainer's state are not)."""
    from harness import checkpoint
    out = str(small_disk / "run")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--out", out, *DISK_RUN], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert_stopped_at_step_3_keeping_step_2(out, res.stderr.splitlines()[-1].removeprefix("train.py: error: "))
    shown = float(re.search(r"checkpoints of ([\d.]+) MB", res.stdout).group(1)) * 1e6
    assert abs(shown / checkpoint.folder_bytes(os.path.join(out, "checkpoints", "step_2")) - 1) < 0.01   # tokenizer


def test_a_save_that_fills_the_disk_stops_in_one_line_and_loses_nothing(small_disk, monkeypatch):
    """A save that runs out of space anyway (the free-space check off, so DCP's writes meet ENOSPC): its partial
    folder is removed, the run stops in one line (OutOfDisk, status 2), and the checkpoints before it are whole."""
    from harness.errors import OutOfDisk
    from test_train import run_in_process
    monkeypatch.setattr(checkpoint, "check_room_on_all_ranks", lambda *args: None)
    out = str(small_disk / "run")
    stopped = run_in_process(out, "gt", *DISK_RUN[2:])
    assert isinstance(stopped.error, OutOfDisk), stopped.error
    assert_stopped_at_step_3_keeping_step_2(out, str(stopped.error))


def test_the_runs_disk_account_by_hand():
    """Checkpoints of 10 bytes, a final model of 3: while the third of three is written beside the two kept, 30;
    keeping all (--keep_last 0, or more than are saved), every checkpoint and the final model."""
    from harness import checkpoint
    assert checkpoint.run_disk_bytes(10, 3, keep_last=2, saves=3) == 30
    assert checkpoint.run_disk_bytes(10, 3, keep_last=1, saves=3) == 20
    assert checkpoint.run_disk_bytes(10, 3, keep_last=0, saves=3) == 33
    assert checkpoint.run_disk_bytes(10, 3, keep_last=5, saves=3) == 33
    assert checkpoint.run_disk_bytes(10, 13, keep_last=1, saves=4) == 23


def test_a_failed_sync_names_the_rank_that_failed_on_every_rank(tmp_path):
    """2 ranks, the engine of rank 1 refusing its weights: both ranks stop, and both messages name rank 1 and its
    words (not each rank its own number with 'another rank failed')."""
    worker = tmp_path / "worker.py"
    worker.write_text(f"""
import sys
sys.path.insert(0, {ROOT!r})
import torch.distributed as dist
from harness.sharding import WeightSyncError, init_distributed, sync_engine_weights

class Engine:
    dtype = None
    def load_weights(self, weights):
        list(weights)
        return "its o_proj was not taken" if dist.get_rank() == 1 else None

import torch
rank, world, _ = init_distributed()
try:
    sync_engine_weights(Engine(), torch.nn.Linear(2, 2))
except WeightSyncError as e:
    open(f"{tmp_path}/rank{{rank}}.txt", "w").write(str(e))
dist.destroy_process_group()
""")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", "29631",
                          str(worker)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    for rank in (0, 1):  # each rank's words in a file of its own: the ranks' stdout and gloo's C++ lines interleave
        words = (tmp_path / f"rank{rank}.txt").read_text()
        assert words.startswith("the weight sync into the rollout engine failed on rank 1: its o_proj was not taken. "
                                "The engine would sample"), words


TINY = ["--steps", "1", "--questions_per_step", "2", "--group_size", "2", "--eval_limit", "4", "--eval_k", "0",
        "--save_every", "0", "--backend", "hf"]


def test_a_run_gives_its_folder_back_when_main_returns(tmp_path):
    """train.main holds --out's locks while its run lives and gives them back when it returns, whether the run
    finished or stopped on an error (whose traceback keeps main's frame alive): a run and its resume can run in one
    process, one after the other."""
    import fcntl
    from harness.errors import MissingInput
    from test_train import run_in_process
    finished = run_in_process(tmp_path / "finished", "gt", *TINY)
    failed = run_in_process(tmp_path / "failed", "gt", *TINY, "--data", str(tmp_path / "missing.parquet"))
    assert finished.error is None and isinstance(failed.error, MissingInput), (finished.error, failed.error)
    for out in ("finished", "failed"):
        for lock in (".run.lock", ".workers.lock"):
            with open(tmp_path / out / lock) as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)     # BlockingIOError while anything holds it


def test_the_closing_line_gives_each_metric_from_the_first_evaluation_to_the_last(tmp_path):
    """By hand: evaluations at steps 0 and 60 (a step record between, skipped), each metric rounded as the evaluation
    line prints it, then the change of the printed figures; greedy alone at --eval_k 0; none with one evaluation."""
    from harness.runfolder import MetricsLog
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "eval_acc": 0.18875, "eval_greedy": 0.345, "eval_maj": 0.335},
        {"step": 1, "reward": 0.2},
        {"step": 60, "eval_acc": 0.296875, "eval_greedy": 0.495, "eval_maj": 0.46}]))
    log = MetricsLog(str(path), active=False)
    assert log.learned(8, 190.26) == ("learned over steps 0-60 (190.3 s): avg@8 0.189 -> 0.297 (+0.108), greedy "
                                      "0.345 -> 0.495 (+0.150), maj@8 0.335 -> 0.460 (+0.125)")
    assert log.learned(0, 12.0, resumed_at=30) == ("learned over steps 0-60 (12.0 s since the resume at step 30): "
                                                   "greedy 0.345 -> 0.495 (+0.150)")
    path.write_text(json.dumps({"step": 0, "eval_acc": 0.2, "eval_greedy": 0.3, "eval_maj": 0.3}) + "\n")
    assert MetricsLog(str(path), active=False).learned(8, 1.0) is None
