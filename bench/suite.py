"""Two runs on one machine's cores at once, as the test suite's two xdist workers start them: each run with
as many OpenMP threads as the machine has cores, against each with its share of them (tests/conftest.py,
THREADS), with one run alone for scale. Each row is the wall clock of the same 4-step classroom run
(test_resume's), in alternating rounds; the runs' metrics are checked equal within each setting.

    python bench/suite.py                 # about 4 minutes on 2 idle cores
    python bench/suite.py --rounds 2
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RUN = ["--method", "coreward1", "--steps", "4", "--questions_per_step", "8", "--group_size", "4", "--eval_limit",
       "16", "--eval_every", "2", "--save_every", "2"]


def start(out, threads):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--out", out, *RUN], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def rewards(out):
    return [r["reward"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward" in r]


def timed(work, runs, threads):
    """Seconds until `runs` runs started together at `threads` threads each have finished; their rewards must agree."""
    outs = [os.path.join(work, f"run{i}") for i in range(runs)]
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    procs = [start(out, threads) for out in outs]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a run failed:\n{err[-3000:]}")
    seconds = time.perf_counter() - t0
    got = [rewards(out) for out in outs]
    if any(g != got[0] for g in got):
        raise SystemExit(f"runs started together at {threads} threads differ: {got}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    settings = [("one run alone", 1, cores), (f"two at once, {cores} threads each", 2, cores),
                (f"two at once, {max(1, cores // 2)} thread(s) each", 2, max(1, cores // 2))]
    seconds = {name: [] for name, _, _ in settings}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for name, runs, threads in settings:
                seconds[name].append(timed(work, runs, threads))
    alone = statistics.median(seconds[settings[0][0]])
    print(f"{cores} cores; the median of {args.rounds} rounds of a 4-step classroom run (test_resume's)\n")
    print(f"| {'setting':<34} | wall s | runs done per alone-run's time |")
    print(f"|{'-' * 36}|--------|--------------------------------|")
    for name, runs, _ in settings:
        s = statistics.median(seconds[name])
        print(f"| {name:<34} | {s:6.1f} | {runs * alone / s:30.2f} |")


if __name__ == "__main__":
    main()
