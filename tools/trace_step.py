"""The recipe functions one training step passes through, traced: how much a reader follows to read a step.

    python tools/trace_step.py                          # the default classroom step (coreward1)
    python tools/trace_step.py --method coreward2 --json

Runs train.py's first two steps in this process and, during the second (the first may set things up once), records
every function of the recipe files (the top level: rollout.py, rewards.py, teacher.py, grpo.py, train.py, eval.py,
config.py) that is called, from `training_step`'s call to its return (sys.setprofile). Comprehensions and generator
expressions are not counted; lambdas are. Prints their count and names, file by file.
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = ("rollout.py", "rewards.py", "teacher.py", "grpo.py", "train.py", "eval.py", "config.py")
NOT_COUNTED = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def traced_step(train_args):
    """{file: sorted function names} of the recipe functions the second step of `train_args` calls."""
    sys.path.insert(0, ROOT)
    import train
    seen, inner = set(), train.training_step
    recipe = {os.path.join(ROOT, name) for name in RECIPE}

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename in recipe and code.co_name not in NOT_COUNTED:
            seen.add((os.path.basename(code.co_filename), code.co_qualname, code.co_firstlineno))

    def step(*args, **kwargs):
        if args[1] != 2:                  # the step number: trace the second
            return inner(*args, **kwargs)
        seen.add(("train.py", "training_step", inner.__code__.co_firstlineno))
        sys.setprofile(profile)
        try:
            return inner(*args, **kwargs)
        finally:
            sys.setprofile(None)

    train.training_step = step
    train.main(train_args)
    by_file = {}
    for name, qualname, _ in sorted(seen):
        by_file.setdefault(name, []).append(qualname)
    return by_file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="coreward1")
    parser.add_argument("--json", action="store_true", help="print {file: [functions]} as JSON")
    known, rest = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as out:
        by_file = traced_step(["--method", known.method, "--steps", "2", "--eval_every", "1000", "--eval_k", "0",
                               "--eval_limit", "1", "--save_every", "0", "--out", out, *rest])
    if known.json:
        print(json.dumps(by_file))
        return
    total = sum(map(len, by_file.values()))
    print(f"a {known.method} step passes through {total} recipe functions")
    for name, functions in by_file.items():
        print(f"  {name} ({len(functions)}): {', '.join(functions)}")


if __name__ == "__main__":
    main()
