"""Checkpoints and resume: a run killed and resumed equals the run that was never interrupted.

Each run is a `train.py` process of its own (under torchrun for 2 ranks), started in a session of
its own (setsid). A hard kill must reach every process of the run at once: torchrun starts each
worker in a session of its own too, so SIGKILL to torchrun's process group alone would leave the
workers running; the test sends SIGKILL to every process in the run's tree. A
classroom run of 4 steps saves at steps 2 and 4; the interrupted run is killed once it has logged
step 3, so that resuming from step 2 must also drop step 3's record from metrics.jsonl and
sample step 3 again exactly as before. On this CPU the resumed records and weights are bitwise
equal to the uninterrupted run's; the tests allow 1e-6.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
import train
from conftest import ROOT

STEPS, KILL_AFTER = 4, 3
FLAGS = ["--steps", str(STEPS), "--pairs_per_step", "8", "--group_size", "4", "--eval_limit", "16",
         "--eval_every", "2", "--save_every", "2"]
SAMPLED = ("responses", "reward", "rollout_acc", "label_acc", "no_answer", "response_len",
           "eval_acc", "eval_greedy", "eval_maj")          # what a step's samples alone decide


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out, ranks, *flags, env=None):
    """A train.py run in a new session; its output goes to OUT.log. Several ranks meet through a
    c10d rendezvous endpoint, as the nodes of a multi-node run do (README)."""
    launcher = [sys.executable] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={ranks}",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{_free_port()}"]
    os.makedirs(out, exist_ok=True)
    log = open(f"{out}.log", "a")
    return subprocess.Popen([*launcher, os.path.join(ROOT, "train.py"), "--out", str(out), *flags], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": str(2 // ranks), **(env or {})})


def finish(proc, out, timeout=600):
    rc = proc.wait(timeout=timeout)
    assert rc == 0, open(f"{out}.log").read()[-4000:]


def records(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def logged_steps(out):
    """The steps in metrics.jsonl so far (a line being written is not one yet)."""
    path = os.path.join(out, "metrics.jsonl")
    lines = open(path).read().splitlines(keepends=True) if os.path.exists(path) else []
    return [json.loads(x)["step"] for x in lines if x.endswith("\n") and '"reward"' in x]


def kill_after(proc, out, step, timeout=600):
    """SIGKILL the run's whole process group as soon as it has logged `step`."""
    deadline = time.time() + timeout
    while step not in logged_steps(out):
        assert proc.poll() is None, f"the run ended before step {step}: " + open(f"{out}.log").read()[-4000:]
        assert time.time() < deadline, f"no step {step} in {timeout} s"
        time.sleep(0.05)
    tree = process_tree(proc.pid)
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    while any(_state(pid) not in (None, "Z") for pid in tree):        # until every worker is gone
        time.sleep(0.05)


def _state(pid):
    """A process's state letter from /proc (Z: a zombie), or None when it is gone."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def process_tree(root):
    """root and its living descendants."""
    children = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{name}/stat").read()
        except OSError:                                   # it ended while we looked
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(name))
    tree, todo = [], [root]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def final_weights(out):
    from safetensors.torch import load_file
    return load_file(os.path.join(out, "final", "model.safetensors"))


def saved_teacher(ckpt):
    """The EMA teacher in a checkpoint, read in this process without a process group."""
    return checkpoint.read_model(ckpt, "teacher").state_dict()


def assert_same_run(resumed, uninterrupted):
    """metrics.jsonl record by record (timings aside; floats to 1e-6), and the final weights to 1e-6."""
    a, b = records(resumed), records(uninterrupted)
    assert [(x["step"], "reward" in x) for x in a] == [(x["step"], "reward" in x) for x in b]
    for x, y in zip(a, b):
        x, y = ({k: v for k, v in r.items() if not k.startswith("t_")} for r in (x, y))
        assert sorted(x) == sorted(y)
        for k in x:
            if isinstance(y[k], float):
                assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-12), (x["step"], k)
            else:
                assert x[k] == y[k], (x["step"], k)
    wa, wb = final_weights(resumed), final_weights(uninterrupted)
    assert sorted(wa) == sorted(wb)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each (method, ranks) run of STEPS steps, made once."""
    runs = {}

    def get(method, ranks):
        if (method, ranks) not in runs:
            out = tmp_path_factory.mktemp("whole") / f"{method}-{ranks}"
            finish(start(out, ranks, "--method", method, *FLAGS), out)
            runs[method, ranks] = str(out)
        return runs[method, ranks]
    return get


@pytest.mark.parametrize("method, ranks", [("coreward1", 1), ("coreward1", 2), ("coreward2", 1)])
def test_a_killed_run_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted, method, ranks):
    out = str(tmp_path / "killed")
    kill_after(start(out, ranks, "--method", method, *FLAGS), out, KILL_AFTER)
    assert KILL_AFTER in logged_steps(out)
    assert checkpoint.latest(out).endswith("step_2") and not os.path.exists(os.path.join(out, "final"))
    finish(start(out, ranks, "--resume"), out)
    log = open(f"{out}.log").read()
    assert f"resumed from {out}/checkpoints/step_2 (step 2 of {STEPS})" in log
    assert log.count("eval @ step 0") == 1                   # the step-0 evaluation is not repeated
    whole = uninterrupted(method, ranks)
    assert_same_run(out, whole)
    assert [x["step"] for x in records(out) if "reward" in x] == [1, 2, 3, 4]
    # the newest --keep_last 2 checkpoints, each complete
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_2", "step_4"]
    if method == "coreward2":                                # the EMA teacher was restored, not restarted
        resumed, straight = saved_teacher(checkpoint.latest(out)), saved_teacher(checkpoint.latest(whole))
        assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) <= 1e-6
        earlier = saved_teacher(os.path.join(out, "checkpoints", "step_2"))
        assert max((resumed[k] - earlier[k]).abs().max().item() for k in straight) > 0     # and it moved since


def test_a_question_gets_the_same_samples_at_one_and_two_ranks(uninterrupted):
    """Request seeds leave the rank out: before any update, step 1's samples and the step-0
    evaluation are the same whether one rank or two draw them."""
    one, two = records(uninterrupted("coreward1", 1)), records(uninterrupted("coreward1", 2))
    for x, y in zip(one[:2], two[:2]):                        # the step-0 evaluation, step 1
        assert {k: x[k] for k in SAMPLED if k in x} == pytest.approx({k: y[k] for k in SAMPLED if k in y}, rel=1e-12)
    assert one[1]["responses"] == two[1]["responses"] == 8 * 2 * 4            # 8 pairs x 2 views x G=4, over the ranks
    assert all(x["sampler_gap"] < 1e-3 for x in two if "reward" in x)        # both engines run the trainer's weights
    assert [x["step"] for x in two if "eval_acc" in x] == [0, 2, 4]


def test_a_kill_during_a_save_resumes_from_the_previous_checkpoint(tmp_path, uninterrupted):
    out = str(tmp_path / "torn")
    proc = start(out, 1, "--method", "coreward1", *FLAGS, env={checkpoint.KILL_DURING_SAVE: str(STEPS)})
    assert proc.wait(timeout=600) == -signal.SIGKILL
    names = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert names == ["step_2", f"step_{STEPS}.partial"]       # the half-written save is left under its temporary name
    assert checkpoint.latest(out).endswith("step_2")
    finish(start(out, 1, "--resume"), out)
    assert f"resumed from {out}/checkpoints/step_2" in open(f"{out}.log").read()
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_2", f"step_{STEPS}"]
    assert_same_run(out, uninterrupted("coreward1", 1))


def test_sigterm_saves_and_exits_cleanly_and_the_run_resumes(tmp_path, uninterrupted):
    """A scheduler's preemption: the run finishes the step it is in, writes a checkpoint there
    (between the --save_every ones) and exits 0; --resume then completes the same run."""
    out = str(tmp_path / "preempted")
    proc = start(out, 1, "--method", "coreward1", *FLAGS)
    while 1 not in logged_steps(out):
        assert proc.poll() is None, open(f"{out}.log").read()[-4000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    finish(proc, out)
    log = open(f"{out}.log").read()
    stopped = max(logged_steps(out))
    assert stopped < STEPS and f"stopped after step {stopped} of {STEPS}" in log
    assert checkpoint.latest(out).endswith(f"step_{stopped}") and not os.path.exists(os.path.join(out, "final"))
    finish(start(out, 1, "--resume"), out)
    assert_same_run(out, uninterrupted("coreward1", 1))


# --------------------------------------------------------------------------------------------
# What --resume refuses, before any compute

@pytest.fixture
def saved_run(tmp_path):
    """A run folder with a checkpoint of step 2 holding the classroom coreward1 configuration."""
    args = train.parse_args(["--method", "coreward1", "--out", str(tmp_path), "--steps", "10"])
    ckpt = tmp_path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(train.config_of(args)))
    torch.save({}, ckpt / "trainer.pt")
    return tmp_path, train.config_of(args)


def _resume(argv):
    return train.resume_settings(train.parse_args(argv), train.given_flags(argv))


def _other_value(action, value):
    if value is None:
        return "3" if action.type in (int, float) else "something-else"
    if action.choices:
        return next(c for c in action.choices if c != value)
    if action.type is int:
        return str(value + 1)
    if action.type is float:
        return str(value * 2 + 1)
    return "something-else"


FIXED = [a for a in train.build_parser()._actions
         if a.option_strings and a.dest not in ("help", "out", "resume", "overwrite", *train.MAY_CHANGE_ON_RESUME)]


@pytest.mark.parametrize("action", FIXED, ids=[a.dest for a in FIXED])
def test_a_flag_that_differs_from_the_checkpoint_is_refused(saved_run, action):
    out, config = saved_run
    flag, value = f"--{action.dest}", config[action.dest]
    if isinstance(action, argparse.BooleanOptionalAction):         # --x / --no-x
        other, same = ([f"--no-{action.dest}"], [flag]) if value else ([flag], [f"--no-{action.dest}"])
        message = f"^{flag} {not value} differs from the checkpoint's {value}"
    else:
        other_value = _other_value(action, value)
        other, same = [flag, other_value], None if value is None else [flag, str(value)]
        message = f"^{flag} {other_value}.* differs from the checkpoint's"
    with pytest.raises(ValueError, match=message):
        _resume(["--resume", "--out", str(out), *other])
    if same is not None:
        _resume(["--resume", "--out", str(out), *same])                # the same value is fine


def test_steps_names_the_schedules_it_sets(saved_run):
    out, _ = saved_run
    with pytest.raises(ValueError, match=r"--steps 20 differs from the checkpoint's 10 \(it sets the LR and EMA schedules\)"):
        _resume(["--resume", "--out", str(out), "--steps", "20"])


def test_flags_that_may_change_are_taken_and_printed(saved_run, capsys):
    out, config = saved_run
    args, path = _resume(["--resume", "--out", str(out), "--eval_every", "5", "--save_every", "3", "--keep_last", "0",
                          "--max_sampler_gap", "0.5"])
    assert (args.eval_every, args.save_every, args.keep_last, args.max_sampler_gap) == (5, 3, 0, 0.5)
    assert path == str(out / "checkpoints" / "step_2") and args.out == str(out) and args.method == "coreward1"
    assert args.lr == config["lr"] and args.steps == 10
    assert "resume: --eval_every changes from 20 to 5" in capsys.readouterr().out


def test_resume_finds_its_run_from_the_method_or_the_path(saved_run, monkeypatch):
    out, _ = saved_run
    path = str(out / "checkpoints" / "step_2")
    args, found = _resume(["--resume", path])
    assert found == path and args.out == str(out)
    with pytest.raises(ValueError, match="is not the run that holds"):
        _resume(["--resume", path, "--out", str(out / "elsewhere")])
    monkeypatch.chdir(out.parent)
    with pytest.raises(FileNotFoundError, match="runs/coreward1 holds no complete checkpoint"):
        _resume(["--resume", "--method", "coreward1"])


def test_what_resume_cannot_start_from(saved_run, tmp_path_factory):
    out, _ = saved_run
    with pytest.raises(ValueError, match="--resume continues the run in its folder and --overwrite would delete it"):
        _resume(["--resume", "--out", str(out), "--overwrite"])
    with pytest.raises(ValueError, match="--resume needs --out"):
        _resume(["--resume"])
    empty = tmp_path_factory.mktemp("empty")
    torn = empty / "checkpoints" / "step_3.partial"                         # a killed save is not a checkpoint,
    torn.mkdir(parents=True)                                                # even with its trainer state written
    (torn / "config.json").write_text("{}")
    torch.save({}, torn / "trainer.pt")
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        _resume(["--resume", "--out", str(empty)])
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint folder"):
        _resume(["--resume", str(empty / "checkpoints" / "step_3.partial")])


def test_a_refused_resume_runs_nothing(saved_run, monkeypatch):
    out, _ = saved_run
    monkeypatch.setattr(train, "init_distributed", lambda: pytest.fail("started a process group"))
    with pytest.raises(ValueError, match="--lr 0.5 differs"):
        train.main(["--resume", "--out", str(out), "--lr", "0.5"])
