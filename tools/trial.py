"""The ten-minute trial: before a node's hours go to the seed run, prove that it trains, saves, stops at a scheduler's
signal without losing the step in flight, and resumes.

    python tools/trial.py                    # a GPU node: every GPU it shows, Qwen/Qwen3-4B-Base on OpenRS
    python tools/trial.py --out runs/trial -- --lr 1e-6     # flags after -- go to train.py

It runs train.py for 4 steps of the seed recipe (coreward1, the official preset, a checkpoint each step, greedy on
MATH500 at steps 0 and 4) on one rank a GPU, sends the run SIGTERM in step 3 (once step 2's checkpoint is published), checks that it stopped with
the step in flight saved (its newest checkpoint is its last logged step) and its status (75; 143 from --ranks, 128 +
SIGTERM), resumes it with --resume to its end, and prints each phase's time beside what to expect. On a machine
without a GPU: the classroom world (no --model) on one rank, whose figures are known exactly. It passes on the
mechanics; times and scores are shown, not judged. Exit status 0 when it passes, 1 when not (the log: OUT.log).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from harness import checkpoint  # noqa: E402

STEPS, SIGNAL_AFTER = 4, 2
# What to expect, by where the trial runs: its flags for train.py, the evaluation at step 0, and a step's time.
EXPECT = {
    "gpu": (["--model", "Qwen/Qwen3-4B-Base", "--data", "openrs", "--eval_data", "math500"],
            "greedy near 0.71 (Table 8's MATH500 before RL: 71.2%, an avg@8 at 0.8, RECIPE.md)",
            "2.2-2.8 minutes on 8 GPUs (GPUS.md: derived, not measured); fewer GPUs take longer"),
    "cpu": ([], "avg@8 0.189  greedy 0.345  maj@8 0.335 (README.md)",
            "about 3 s on 2 idle cores (bench/default_run.md)"),
}


def gpus():
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(command, log):
    """train.py with `command`, its console appended to `log`, in a session of its own (a scheduler's job step)."""
    with open(log, "a") as f:
        return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *command], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def logged(out):
    """metrics.jsonl's records (its last line whole or skipped)."""
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path).read().splitlines(keepends=True) if line.endswith("\n")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("runs", "trial"), help="the trial's run folder (its console: OUT.log)")
    ap.add_argument("--ranks", type=int, default=None, help="default: one a GPU, or 1 on a machine without")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for train.py")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    where = "gpu" if gpus() else "cpu"
    flags, expected_eval, expected_step = EXPECT[where]
    ranks = args.ranks or gpus() or 1
    launch = ["--ranks", str(ranks)] if ranks > 1 else []
    log = args.out.rstrip("/") + ".log"
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    open(log, "w").close()
    command = ["--method", "coreward1", *flags, "--steps", str(STEPS), "--save_every", "1", "--eval_every", str(STEPS),
               *extra, "--out", args.out, "--overwrite", *launch]
    print(f"trial: train.py {' '.join(command)}  ({ranks} rank(s) on {'GPUs' if where == 'gpu' else 'the CPU'}; "
          f"console: {log})", flush=True)
    failed = []

    began = time.perf_counter()                      # 1. start-up, step 0's evaluation and steps 1-2, then SIGTERM
    job = run(command, log)
    while job.poll() is None and checkpoint.latest(args.out) != os.path.join(args.out, "checkpoints",
                                                                              f"step_{SIGNAL_AFTER}"):
        time.sleep(0.5)                              # until step 2's checkpoint is published: the run is in step 3
    if job.poll() is not None:
        print(f"trial failed: the run ended (status {job.returncode}) before step {SIGNAL_AFTER}; see {log}")
        return 1
    records = logged(args.out)
    step_s = [r["t_rollout"] + r["t_train"] + r["t_sync"] for r in records if "reward" in r]
    evaluation = next(r for r in records if r["step"] == 0 and "eval_greedy" in r)
    shown = f"avg@8 {evaluation['eval_acc']:.3f}  greedy {evaluation['eval_greedy']:.3f}  " \
        f"maj@8 {evaluation['eval_maj']:.3f}" if evaluation.get("eval_acc") is not None else \
        f"greedy {evaluation['eval_greedy']:.3f}"
    print(f"start-up, the evaluation at step 0, steps 1-{SIGNAL_AFTER} ({time.perf_counter() - began:.1f} s)")
    print(f"  eval @ step 0: {shown}; expected: {expected_eval}")
    print(f"  a step ({sum(step_s) / len(step_s):.1f} s); expected: {expected_step}")

    signalled = time.perf_counter()                  # 2. the preemption: the step in flight ends, is saved, and stops
    os.kill(job.pid, signal.SIGTERM)
    status = job.wait()
    last = max(r["step"] for r in logged(args.out) if "reward" in r)
    newest = checkpoint.latest(args.out)
    saved = newest is not None and os.path.basename(newest) == f"step_{last}"
    print(f"SIGTERM in step {SIGNAL_AFTER + 1}: stopped after step {last} with status {status} "
          f"({time.perf_counter() - signalled:.1f} s), step_{last} {'saved' if saved else 'NOT saved'}; expected: "
          f"step {SIGNAL_AFTER + 1} saved, status {143 if launch else 75}")
    if not saved or status != (143 if launch else 75):
        failed.append("the stop")

    resumed = time.perf_counter()                    # 3. the resume, to the end
    status = run(["--out", args.out, "--resume", *launch], log).wait()
    steps = [r["step"] for r in logged(args.out) if "reward" in r]
    finished = status == 0 and steps == list(range(1, STEPS + 1)) and os.path.isdir(os.path.join(args.out, "final"))
    print(f"--resume: from step_{last} to step {max(steps)} with status {status} ({time.perf_counter() - resumed:.1f} "
          f"s), final/ {'written' if finished else 'missing'}; expected: to step {STEPS}, status 0, final/")
    if not finished:
        failed.append("the resume")
    if failed:
        print(f"trial failed: {' and '.join(failed)}; see {log}")
        return 1
    print(f"trial passed ({time.perf_counter() - began:.1f} s): this machine trains, saves, stops at a signal "
          f"keeping its step, and resumes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
