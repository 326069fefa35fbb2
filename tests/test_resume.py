"""Checkpoints and resume: a run killed and resumed equals the run that was never interrupted.

Each run is a `train.py` process of its own (starting 2 ranks with --ranks 2), started in a session
of its own (setsid). A hard kill must reach every process of the run at once: torchrun's launcher starts
each worker in a session of its own too, so SIGKILL to the launcher's process group alone would leave the
workers running; the test sends SIGKILL to every process in the run's tree. A
classroom run of 4 steps saves at steps 2 and 4; the interrupted run is killed once it has logged
step 3, so that resuming from step 2 must also drop step 3's record from metrics.jsonl and
sample step 3 again exactly as before. On this CPU the resumed records and weights are bitwise
equal to the uninterrupted run's; the tests allow 1e-6.
"""
import argparse
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from harness import checkpoint
import config
from harness import errors, resume, runfolder
import train
from conftest import ROOT, THREADS

STEPS, KILL_AFTER = 4, 3
FLAGS = ["--steps", str(STEPS), "--questions_per_step", "8", "--group_size", "4", "--eval_limit", "16",
         "--eval_every", "2", "--save_every", "2"]
SAMPLED = ("responses", "reward", "rollout_acc", "label_acc", "no_answer", "response_len",
           "eval_acc", "eval_greedy", "eval_maj", "eval_boxed")          # what a step's samples alone decide


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out, ranks, *flags, env=None, program=None):
    """A train.py run (or `program`: a script and its arguments, which runs train.py) in a new session; its output
    goes to OUT.log, as a user's console shows it (VLLM_LOGGING_LEVEL unset). Several ranks are started by train.py
    itself (--ranks), each on its share of this worker's cores."""
    os.makedirs(out, exist_ok=True)
    log = open(f"{out}.log", "a")
    ranks_flag = ["--ranks", str(ranks)] if ranks > 1 else []
    program = program or [os.path.join(ROOT, "train.py")]
    return subprocess.Popen([sys.executable, *program, "--out", str(out), *flags, *ranks_flag], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**{k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"},
                                 "OMP_NUM_THREADS": str(max(1, THREADS // ranks)), **(env or {})})


def finish(proc, out, timeout=600, status=0):
    rc = proc.wait(timeout=timeout)
    assert rc == status, open(f"{out}.log").read()[-4000:]


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


def uninterrupted_run(shared_folder, method, ranks):
    """The (method, ranks) run of STEPS steps, never interrupted: made once in a test session and read by the tests
    of several workers (conftest.shared_folder). Its console is the folder's .log."""
    make = lambda out: finish(start(out, ranks, "--method", method, *FLAGS), out)
    return str(shared_folder(f"whole-{method}-{ranks}", make))


@pytest.fixture
def uninterrupted(shared_folder):
    return functools.partial(uninterrupted_run, shared_folder)


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


def test_a_preempted_run_then_a_kill_during_a_save_each_resume_to_the_uninterrupted_run(tmp_path, uninterrupted):
    """Two interruptions of one run, each resumed. A scheduler's preemption (SIGTERM): the run finishes the step it
    is in, writes a checkpoint there (between the --save_every ones) and exits with errors.STOPPED (75: a launcher's
    restart or a requeue continues it). Its resume is then killed (SIGKILL,
    tests/train_killed_in_save.py) in the save of the last step, once every part is written and before it is
    published: the half-written save is left under its temporary name, and --resume goes on from the newest
    complete checkpoint. The run that comes out is the uninterrupted one."""
    out = str(tmp_path / "interrupted")
    killed_in_last_save = [os.path.join(ROOT, "tests", "train_killed_in_save.py"), str(STEPS)]
    proc = start(out, 1, "--method", "coreward1", *FLAGS, program=killed_in_last_save)
    while 1 not in logged_steps(out):
        assert proc.poll() is None, open(f"{out}.log").read()[-4000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    finish(proc, out, status=errors.STOPPED)
    log = open(f"{out}.log").read()
    stopped = max(logged_steps(out))
    assert stopped < STEPS and f"stopped after step {stopped} of {STEPS}" in log
    assert checkpoint.latest(out).endswith(f"step_{stopped}") and not os.path.exists(os.path.join(out, "final"))

    proc = start(out, 1, "--resume", program=killed_in_last_save)
    assert proc.wait(timeout=600) == -signal.SIGKILL
    complete = sorted({f"step_{stopped}", "step_2"}, key=lambda name: int(name[5:]))     # --keep_last 2
    names = sorted(os.listdir(os.path.join(out, "checkpoints")), key=lambda name: int(name[5:].split(".")[0]))
    assert names == [*complete, f"step_{STEPS}.partial"]
    assert checkpoint.latest(out).endswith(complete[-1])

    finish(start(out, 1, "--resume"), out)
    assert f"resumed from {out}/checkpoints/{complete[-1]} (step {complete[-1][5:]} of {STEPS})" in \
        open(f"{out}.log").read()
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == sorted([complete[-1], f"step_{STEPS}"])
    assert_same_run(out, uninterrupted("coreward1", 1))


BLOCKED_IN_STEP = [os.path.join(ROOT, "tests", "train_blocked_in_step.py")]


def stopped_twice(out, ranks):
    """A run whose rank 0 blocks in step 3 in a C call that signals do not interrupt (tests/train_blocked_in_step.py),
    given two SIGINTs to its process group, as a terminal's Ctrl-C twice: (its exit status, the seconds from the
    second signal to the end of every process of the run, its console). A run that does not end within a minute
    is killed, and counted as never."""
    proc = start(out, ranks, "--method", "coreward1", *FLAGS, program=BLOCKED_IN_STEP, env={"BLOCKED_IN_STEP": "3"})
    while "blocked in step 3" not in open(f"{out}.log").read():
        assert proc.poll() is None, open(f"{out}.log").read()[-4000:]
        time.sleep(0.05)
    tree = process_tree(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(1)
    assert proc.poll() is None                               # the first signal waits for the step's end
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.time()
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    while any(_state(pid) not in (None, "Z") for pid in tree) and time.time() < t0 + 60:
        time.sleep(0.05)
    took = time.time() - t0 if rc is not None and all(_state(pid) in (None, "Z") for pid in tree) else float("inf")
    for pid in process_tree(proc.pid) + tree:               # what is left of a run that did not stop
        if _state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return rc, took, open(f"{out}.log").read()


def assert_stopped_in_step_3_keeping_step_2(out, log, world):
    """The one line, last on the console, naming step 2's checkpoint, which is whole; metrics.jsonl whole up to it."""
    ranks = f" --ranks {world}" if world > 1 else ""
    line = (f"a second stop signal: stopped at once; the newest complete checkpoint, "
            f"{out}/checkpoints/step_2, is kept: continue with: python train.py --out {out} --resume{ranks}")
    assert log.count(line) == 1 and log.rstrip().endswith(line), log[-3000:]
    assert os.listdir(os.path.join(out, "checkpoints")) == ["step_2"] and checkpoint.is_checkpoint(checkpoint.latest(out))
    assert logged_steps(out) == [1, 2] and open(os.path.join(out, "metrics.jsonl")).read().endswith("}\n")


def test_a_second_signal_stops_a_run_blocked_in_a_step_at_once_and_it_resumes_to_the_uninterrupted_run(
        tmp_path, uninterrupted):
    """Ctrl-C twice while the run's main thread is blocked in a C call in step 3 (as in a collective, or in a long
    operator): the first asks for the end of the step, the second stops the run at once, with status 130 and one
    line naming the newest complete checkpoint; resumed from it, the run is the uninterrupted one."""
    out = str(tmp_path / "stopped")
    rc, took, log = stopped_twice(out, 1)
    assert rc == 128 + signal.SIGINT and took < 30, (rc, took, log[-3000:])
    assert "received SIGINT: finishing this step, then writing a checkpoint" in log
    assert_stopped_in_step_3_keeping_step_2(out, log, 1)
    finish(start(out, 1, "--resume"), out)
    assert f"resumed from {out}/checkpoints/step_2 (step 2 of {STEPS})" in open(f"{out}.log").read()
    assert_same_run(out, uninterrupted("coreward1", 1))


@pytest.mark.launcher
def test_a_second_signal_to_the_launcher_stops_every_rank_at_once(tmp_path):
    """--ranks 2, Ctrl-C twice: the launcher alone gets them (its workers are in sessions of their own); it sends
    the first on, and on the second it sends SIGTERM, which stops each worker at once, rank 0 blocked in its C
    call and rank 1 waiting for it in a collective: every process ends within seconds (not the agent's 30 s
    shutdown timeout), the launcher with 130, and rank 0 says the one line."""
    out = str(tmp_path / "stopped")
    rc, took, log = stopped_twice(out, 2)
    assert rc == 128 + signal.SIGINT and took < 20, (rc, took, log[-3000:])
    assert_stopped_in_step_3_keeping_step_2(out, log, 2)


# --------------------------------------------------------------------------------------------
# A run that restarts itself: torchrun's restarts (--max-restarts; train.py --ranks N --max_restarts K)

KILLED = [os.path.join(ROOT, "tests", "train_killed.py")]


def killed_run(out, at, attempts="first", torchrun=False, restarts=1):
    """A 2-rank run of FLAGS whose rank 1 is SIGKILLed `at` (tests/train_killed.py), under restarts: torchrun's own
    launcher, or train.py --ranks 2 --max_restarts. Returns (its exit status, its console)."""
    env = {"KILL_RANK": "1", "KILL_AT": at, "KILL_ATTEMPTS": attempts, "OMP_NUM_THREADS": str(max(1, THREADS // 2))}
    if torchrun:
        program = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--max-restarts={restarts}",
                   *KILLED]
        proc = start(out, 1, "--method", "coreward1", *FLAGS, env=env, program=program)
    else:
        proc = start(out, 2, "--method", "coreward1", *FLAGS, "--max_restarts", str(restarts), env=env,
                     program=KILLED)
    return proc.wait(timeout=900), open(f"{out}.log").read()


@pytest.mark.full
@pytest.mark.launcher
def test_torchrun_restarts_a_run_that_lost_a_rank_and_it_ends_as_the_uninterrupted_run(tmp_path, uninterrupted):
    """torchrun --max-restarts 1, rank 1 SIGKILLed right after the step-2 checkpoint of a 4-step run: torchrun starts
    the ranks again, the restart continues from step 2 with nothing typed (the folder's run id is its own), and the
    run finishes; metrics.jsonl and the final weights are the uninterrupted run's, and run.log names the restart."""
    out = str(tmp_path / "restarted")
    rc, log = killed_run(out, "saved:2", torchrun=True)
    assert rc == 0 and "rank 1 killed at saved 2" in log, log[-4000:]
    line = f"restart 1 of 1 of torchrun "
    run_log = open(os.path.join(out, "run.log")).read()
    assert line in run_log and f": continued from {out}/checkpoints/step_2" in run_log, run_log[-3000:]
    assert_same_run(out, uninterrupted("coreward1", 2))


@pytest.mark.full
@pytest.mark.launcher
def test_a_restart_before_the_first_checkpoint_starts_the_run_afresh(tmp_path, uninterrupted):
    """train.py --ranks 2 --max_restarts 1, rank 1 killed at the start of step 1: no checkpoint yet, so the restart
    starts the run afresh over its first attempt's outputs, says so, and ends as the uninterrupted run."""
    out = str(tmp_path / "restarted")
    rc, log = killed_run(out, "step:1")
    assert rc == 0 and "rank 1 killed at step 1" in log, log[-4000:]
    assert "restart 1 of 1 of torchrun " in log and "no complete checkpoint yet, so the run starts afresh" in log
    assert_same_run(out, uninterrupted("coreward1", 2))


@pytest.mark.full
@pytest.mark.launcher
def test_spent_restarts_say_so_in_one_line_and_leave_the_folder_to_resume_by_hand(tmp_path):
    """Rank 1 killed at the start of step 3 in every attempt, one restart allowed: the restart continues from step 2
    and is killed again; the launcher says in one line that the restarts are spent and how to continue, and the
    folder holds the step-2 checkpoint, whole, and metrics.jsonl up to it."""
    out = str(tmp_path / "spent")
    rc, log = killed_run(out, "step:3", attempts="every")
    assert rc == 1 and log.count("rank 1 killed at step 3") == 2, log[-4000:]
    assert (f"train_killed.py: rank 1 stopped with signal 9; its message is above; torchrun's 1 restart(s) are spent, "
            f"and {out} keeps its newest checkpoint: continue by hand with python train_killed.py --out {out} "
            f"--resume") in log, log[-3000:]
    assert checkpoint.latest(out).endswith("step_2") and checkpoint.is_checkpoint(checkpoint.latest(out))
    assert logged_steps(out) == [1, 2]


@pytest.mark.slow
def test_two_nodes_restart_a_run_that_lost_a_rank_and_it_ends_as_the_uninterrupted_run(tmp_path, uninterrupted):
    """Two torchrun agents, one rank each, meeting at a c10d rendezvous on 127.0.0.1 (--nnodes 2, as two nodes do),
    --max-restarts 1; rank 1 SIGKILLed right after the step-2 checkpoint: both agents restart their worker, the
    rendezvous forms again, the run continues from step 2 and ends as the uninterrupted 2-rank run."""
    out, port = str(tmp_path / "two-nodes"), _free_port()
    env = {"KILL_RANK": "1", "KILL_AT": "saved:2", "OMP_NUM_THREADS": str(max(1, THREADS // 2))}
    agent = ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes", "--max-restarts=1", *KILLED]
    nodes = [start(out, 1, "--method", "coreward1", *FLAGS, env=env, program=agent) for _ in range(2)]
    codes = [node.wait(timeout=900) for node in nodes]
    log = open(f"{out}.log").read()
    assert codes == [0, 0] and "rank 1 killed at saved 2" in log, log[-4000:]
    assert f"restart 1 of 1 of torchrun two-nodes: continued from {out}/checkpoints/step_2" in \
        open(os.path.join(out, "run.log")).read()
    assert_same_run(out, uninterrupted("coreward1", 2))


@pytest.mark.slow
def test_two_nodes_go_on_by_themselves_when_a_node_loses_its_worker_mid_step(tmp_path, uninterrupted):
    """Two torchrun agents on 127.0.0.1 as two nodes (--max-restarts 1). Rank 1 is SIGKILLed at the start of step 3
    while rank 0 is in that step away from any collective (it holds there 20 s, as a rollout does): node B's agent
    restarts its worker (its restart 1), node A's restarts its own for the membership change without counting it.
    Both new workers name one attempt (the agents' store counts their arrivals), so they form one process group, take
    the run for a restart, continue from step 2, and end as the uninterrupted 2-rank run; run.log says so."""
    out, port = str(tmp_path / "two-nodes"), _free_port()
    env = {"KILL_RANK": "1", "KILL_AT": "step:3", "HOLD_S": "20", "OMP_NUM_THREADS": str(max(1, THREADS // 2))}
    agent = ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes", "--max-restarts=1", *KILLED]
    nodes = [start(out, 1, "--method", "coreward1", *FLAGS, env=env, program=agent) for _ in range(2)]
    try:
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    log = open(f"{out}.log").read()
    assert codes == [0, 0] and "rank 0 holds at step 3" in log and "rank 1 killed at step 3" in log, log[-4000:]
    assert f"restart 1 of 1 of torchrun two-nodes: continued from {out}/checkpoints/step_2" in \
        open(os.path.join(out, "run.log")).read()
    assert_same_run(out, uninterrupted("coreward1", 2))


# --------------------------------------------------------------------------------------------
# What --resume refuses, before any compute

@pytest.fixture
def saved_run(tmp_path):
    """A run folder with a checkpoint of step 2 holding the classroom coreward1 configuration."""
    args = config.parse_args(["--method", "coreward1", "--out", str(tmp_path), "--steps", "10"])
    ckpt = tmp_path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(config.config_of(args)))
    torch.save({}, ckpt / "trainer.pt")
    return tmp_path, config.config_of(args)


def _resume(argv):
    return resume.resume_settings(config.parse_args(argv), config.PRESETS, config.NOT_CONFIG)


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


FIXED = [a for a in config.build_parser()._actions
         if a.option_strings and a.dest not in ("help", "out", *config.NOT_CONFIG, *resume.MAY_CHANGE_ON_RESUME)]


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
    with pytest.raises(ValueError,
                       match=r"--steps 20 differs from the checkpoint's 10 \(it sets the LR and EMA schedules\)"):
        _resume(["--resume", "--out", str(out), "--steps", "20"])


def test_flags_that_may_change_are_taken_and_printed(saved_run, capsys):
    out, config = saved_run
    args, path = _resume(["--resume", "--out", str(out), "--eval_every", "5", "--save_every", "3", "--keep_last", "0",
                          "--max_sampler_gap", "0.5"])
    assert (args.eval_every, args.save_every, args.keep_last, args.max_sampler_gap) == (5, 3, 0, 0.5)
    assert path == str(out / "checkpoints" / "step_2") and args.out == str(out) and args.method == "coreward1"
    assert args.lr == config["lr"] and args.steps == 10
    assert "resume: --eval_every changes from 20 to 5" in capsys.readouterr().out


def test_a_checkpoint_from_before_a_setting_was_added_resumes_with_its_presets_value(saved_run):
    """A run saved before --hf_kv_budget_gib existed: its configuration lacks it, and the resume takes the preset's
    value (0: from the free memory), or the one given, which may differ."""
    out, saved = saved_run
    ckpt = out / "checkpoints" / "step_2" / "config.json"
    ckpt.write_text(json.dumps({k: v for k, v in saved.items() if k not in resume.ADDED_SETTINGS}))
    args, _ = _resume(["--resume", "--out", str(out)])
    assert args.hf_kv_budget_gib == config.PRESETS["classroom"]["hf_kv_budget_gib"] == 0.0
    args, _ = _resume(["--resume", "--out", str(out), "--hf_kv_budget_gib", "2"])
    assert args.hf_kv_budget_gib == 2.0


@pytest.mark.parametrize("old, teacher_prompts, views, new", [
    ("coreward3_both", "same", "both", "coreward3"),                    # the authors' Co-rewarding-III, renamed
    ("coreward3", "rephrased", "original", "coreward2_rephrased"),       # the older combined path, renamed
])
def test_a_run_saved_under_a_methods_old_name_is_refused_with_its_new_name(saved_run, capsys, old, teacher_prompts,
                                                                           views, new):
    out, saved = saved_run
    ckpt = out / "checkpoints" / "step_2" / "config.json"
    ckpt.write_text(json.dumps({**saved, "method": old, "teacher_prompts": teacher_prompts, "views": views,
                                "kl_coef": 0.001}))
    with pytest.raises(ValueError, match=f"trained --method {old}, which is now called {new}; add --method {new} "):
        _resume(["--resume", "--out", str(out)])
    args, _ = _resume(["--resume", "--out", str(out), "--method", new])
    assert (args.method, args.teacher_prompts, args.views) == (new, teacher_prompts, views)
    assert f"--method {old} is now called {new}" in capsys.readouterr().out


def test_a_method_name_that_is_no_longer_one_is_refused_with_the_new_name(capsys):
    with pytest.raises(SystemExit):
        config.parse_args(["--method", "coreward3_both"])
    assert "argument --method: coreward3_both is now called coreward3;" in capsys.readouterr().err
    assert config.parse_args(["--method", "coreward3"]).teacher_prompts == "same"      # the current coreward3


def test_a_checkpoint_from_before_the_group_filter_resumes_without_it_and_says_so(saved_run, capsys):
    """A config.json written before --group_filter existed: the resume fills in the value that run ran under (none),
    names the flag it filled in, and takes no other value for it than the one given, which must agree."""
    out, saved = saved_run
    ckpt = out / "checkpoints" / "step_2"
    (ckpt / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "group_filter"}))
    args, _ = _resume(["--resume", "--out", str(out)])
    assert args.group_filter == "none"
    assert f"resume: {ckpt} was saved before --group_filter existed; its run continues with the value it ran " \
           f"under: --group_filter none" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--group_filter zero_variance differs from the checkpoint's none"):
        _resume(["--resume", "--out", str(out), "--group_filter", "zero_variance"])


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
    monkeypatch.setattr(train, "init_distributed", lambda *a: pytest.fail("started a process group"))
    with pytest.raises(ValueError, match="--lr 0.5 differs"):
        train.main(["--resume", "--out", str(out), "--lr", "0.5"])


def test_a_copied_checkpoint_resumes_only_into_a_folder_named_with_out(saved_run, tmp_path_factory):
    """backup/step_2 is not in a run's checkpoints/: its parent's parent is no run folder, whose
    final/ a resume would take for the run's. It is refused without --out, before anything is
    touched; with --out it continues that folder."""
    out, _ = saved_run
    (out / "final").mkdir()
    backup = tmp_path_factory.mktemp("backup") / "step_2"
    shutil.copytree(out / "checkpoints" / "step_2", backup)
    (backup.parent.parent / "final").mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=r"is not in a run's checkpoints/ folder \(a copy\?\): say which run folder"):
        _resume(["--resume", str(backup)])
    assert (backup.parent.parent / "final").is_dir() and (out / "final").is_dir()
    args, found = _resume(["--resume", str(backup), "--out", str(out)])
    assert found == str(backup) and args.out == str(out)


def test_resuming_an_older_checkpoint_moves_what_came_after_it_aside(tmp_path, capsys):
    """Checkpoints of later steps and final/ belong to the future the resume rewrites: moved into
    superseded/, with a message, never deleted."""
    for step in (2, 4, 6):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step}" / "trainer.pt").write_text(str(step))
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_text("the model of step 6")
    resume.prepare_resume(str(tmp_path), 2, 6)
    assert [name for name in os.listdir(tmp_path / "checkpoints")] == ["step_2"]
    (aside,) = (tmp_path / "superseded").iterdir()
    assert sorted(os.listdir(aside)) == ["final", "step_4", "step_6"]
    assert (aside / "final" / "model.safetensors").read_text() == "the model of step 6"
    assert (aside / "step_6" / "trainer.pt").read_text() == "6"
    assert f"moved step_4, step_6, final, written after it, into {aside}" in capsys.readouterr().out


def test_a_resume_on_other_questions_or_another_start_model_is_refused(saved_run, monkeypatch):
    """The checkpoint's data order indexes the question list, and the frozen reference is reloaded
    from --model: a resume checks both fingerprints before loading any model, and names what changed."""
    from harness import world
    out, _ = saved_run
    model = checkpoint.model_fingerprint(world.base_model_dir())
    torch.save({"fingerprints": {"questions": {"questions": 3, "sha256": "0" * 64},
                                 "model": {**model, "model.safetensors": "f" * 64}}},
               out / "checkpoints" / "step_2" / "trainer.pt")
    monkeypatch.setattr(train, "load_sharded", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError) as refused:
        train.main(["--resume", "--out", str(out)])
    message = str(refused.value)
    assert "the training questions: 3 questions (sha256 000000000000) when saved, 1500" in message
    assert "the start model's files (model.safetensors)" in message and "nothing was run" in message


def test_fingerprints_by_hand(tmp_path):
    """A model file changed in one sampled block, and a question list with one answer changed, are told apart."""
    from harness.data import Pair
    (tmp_path / "config.json").write_text("{}")
    big = bytearray(checkpoint.FULL_HASH_BYTES + (8 << 20))
    (tmp_path / "model.safetensors").write_bytes(big)
    before = checkpoint.model_fingerprint(tmp_path)
    big[-1] = 1                                                       # in the last sampled block
    (tmp_path / "model.safetensors").write_bytes(big)
    after = checkpoint.model_fingerprint(tmp_path)
    assert before["config.json"] == after["config.json"] and before["model.safetensors"] != after["model.safetensors"]
    pairs = [Pair("1+1?", None, "2"), Pair("2+2?", None, "4")]
    changed = [pairs[0], Pair("2+2?", None, "5")]
    assert checkpoint.questions_fingerprint(pairs) != checkpoint.questions_fingerprint(changed)
    assert checkpoint.questions_fingerprint(pairs)["questions"] == 2


def test_a_resume_that_crosses_an_epoch_boundary_equals_the_uninterrupted_run(tmp_path):
    """12 questions, 8 a step: step 2 starts a new epoch, with a new shuffle drawn from the generator
    the checkpoint of step 1 restored. Killed after step 2 and resumed from step 1, the run samples
    steps 2 and 3 as the uninterrupted one did."""
    from harness import data
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"problem": p.original, "answer": p.answer}) + "\n"
                                 for p in data.classroom_pairs("train")[:12]))
    flags = ["--method", "gt", "--data", str(questions), "--steps", "3", "--questions_per_step", "8", "--group_size", "4",
             "--eval_limit", "16", "--eval_every", "100", "--save_every", "1", "--keep_last", "0"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    finish(start(whole, 1, *flags), whole)
    kill_after(start(killed, 1, *flags), killed, 2)
    shutil.rmtree(killed / "checkpoints" / "step_2", ignore_errors=True)  # resume from step 1: before the boundary
    assert checkpoint.latest(str(killed)).endswith("step_1")
    finish(start(killed, 1, "--resume"), killed)
    assert_same_run(killed, whole)


def test_metrics_lines_stay_whole_when_one_was_cut_before_its_newline(tmp_path):
    """A kill that cut the last record exactly before its newline left valid JSON without one: the
    resumed log gives it its newline, so that the next record does not join it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval_acc": 0.1}\n{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6}')
    log = runfolder.MetricsLog(str(path), True, resume_step=2)
    log.write({"step": 3, "reward": 0.7})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]


def test_a_process_killed_while_pruning_a_checkpoint_leaves_no_torn_one(tmp_path, monkeypatch):
    """prune stops (as a process stopped at once by a second signal would) after removing one file of the oldest
    checkpoint: what is left of it is no complete checkpoint, and the next prune removes it."""
    for step in (1, 2, 3):
        folder = tmp_path / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "trainer.pt").write_bytes(b"state")
        (folder / "config.json").write_text("{}")
    real_rmtree = shutil.rmtree

    def killed_midway(path, **kwargs):
        os.remove(os.path.join(path, "config.json"))
        raise SystemExit("killed")
    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(SystemExit):
        checkpoint.prune(str(tmp_path), keep_last=2)
    assert [step for step, _ in checkpoint.complete(str(tmp_path))] == [2, 3]
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    checkpoint.prune(str(tmp_path), keep_last=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_2", "step_3"]


def test_a_checkpoint_that_cannot_be_loaded_stops_the_resume_naming_the_one_before(tmp_path, uninterrupted):
    """A torn weights file in the newest checkpoint: the resume says which one failed and names the
    previous checkpoint, instead of falling back to it silently."""
    out = tmp_path / "run"
    shutil.copytree(uninterrupted("coreward1", 1), out)               # its checkpoints: step_2 and step_4
    for name in os.listdir(out / "checkpoints" / "step_4" / "weights"):
        if name.endswith(".distcp"):
            (out / "checkpoints" / "step_4" / "weights" / name).write_bytes(b"torn")
    shutil.rmtree(out / "final")                  # not a finished run, which a resume would leave as it is
    proc = start(out, 1, "--resume", str(out / "checkpoints" / "step_4"))
    assert proc.wait(timeout=600) == 2                       # a stop the user acts on: one line, status 2
    log = open(f"{out}.log").read()
    assert "Traceback" not in log
    [line] = [x for x in log.splitlines() if "cannot be loaded" in x]
    assert line.startswith(f"train.py: error: --resume: the checkpoint {out / 'checkpoints' / 'step_4'} cannot be "
                           f"loaded (") and len(line) < 800
    assert f"the previous one is {out / 'checkpoints' / 'step_2'}: resume from it with --resume" in line


def test_a_checkpoint_is_on_disk_before_its_rename_publishes_it(dist_world, tmp_path, monkeypatch):
    """Every file and folder of step_S.partial/ is fsynced before the rename to step_S/, and the
    checkpoints/ folder after it: a crash of the machine never leaves a step_S/ with a torn file."""
    from transformers import AutoTokenizer
    from harness import world
    from harness.sharding import shard
    from test_grpo import _tiny_model
    events, real_fsync, real_rename = [], os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", str(src), str(dst)))
        return real_rename(src, dst)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    policy = shard(_tiny_model())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    path = checkpoint.save(str(tmp_path), 3, policy, optimizer, None, {"order": [0]}, {"method": "gt"},
                           AutoTokenizer.from_pretrained(world.base_model_dir()), keep_last=0)
    partial = path + ".partial"
    published = events.index(("rename", partial, path))
    synced = {name for event, name, *_ in events[:published] if event == "fsync"}
    on_disk = {os.path.join(d, f).replace(path, partial) for d, _, names in os.walk(path) for f in names}
    folders = {d.replace(path, partial) for d, _, _ in os.walk(path)}
    assert on_disk and on_disk <= synced, on_disk - synced
    assert folders <= synced, folders - synced
    assert ("fsync", os.path.join(str(tmp_path), "checkpoints")) in events[published:]
