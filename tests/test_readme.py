"""The README's shown output is what the default run prints: `python train.py --method coreward1` on 60
steps, its run.log (the console without the progress bar) compared line by line with the README's
block, the seconds of each save masked and the run's folder named as the README names it.
About 3-4 minutes on 2 cores."""
import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_block():
    """The lines of the README's block of the default run's output."""
    text = open(os.path.join(ROOT, "README.md")).read()
    block = text.split("## What the default run prints", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def masked(lines):
    return [re.sub(r"\(\d+\.\d s\)", "(T s)", line) for line in lines]


def test_the_readme_shows_what_the_default_run_prints(tmp_path):
    out = tmp_path / "coreward1"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "coreward1", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    printed = (out / "run.log").read_text().replace(str(out), os.path.join("runs", "coreward1")).splitlines()
    assert masked(printed) == masked(readme_block())
