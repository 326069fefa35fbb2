"""The README's list of methods is rewards.METHOD_TABLE, row for row. Its shown output is what the default run prints: `python train.py --method coreward1` on 60
steps, its run.log (the console without the progress bar) compared line by line with the README's
block, the seconds of each save masked and the run's folder named as the README names it; and, where
vLLM is not installed, its evaluation lines on transformers' generate compared with the README's second
block. About 3-4 minutes on 2 cores, each."""
import os
import re
import subprocess
import sys

import pytest

import rewards
from config import vllm_installed
from conftest import ROOT


def method_row(method):
    """A method's line of the README's list: its row of rewards.METHOD_TABLE, None shown as '–'."""
    shown = lambda v: "–" if v is None else v
    return (f"| `{method.name}` | {shown(method.labels)} | {method.views} | {shown(method.teacher)} | "
            f"{method.kl_anchor} | {'preset' if method.kl_coef is None else method.kl_coef} | "
            f"`{method.reward.__name__}` |")


def test_the_readme_lists_the_methods_of_the_table():
    text = open(os.path.join(ROOT, "README.md")).read()
    header = "| method | label source | views | teacher answers | KL anchor | β | reward |\n|---|---|---|---|---|---|---|\n"
    assert header in text, "README.md has lost its list of methods (## The algorithm)"
    listed = text.split(header, 1)[1].split("\n\n", 1)[0].splitlines()
    table = [method_row(m) for m in rewards.METHODS.values()]
    assert listed == table, "README.md's list of methods differs from rewards.METHOD_TABLE; its rows should be:\n" \
        + "\n".join(table)


def readme_blocks():
    """The lines of each of the README's blocks of the default run's output: vLLM's, then transformers'."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## What the default run prints", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0].splitlines() for block in section.split("```text\n")[1:]]


def masked(lines):
    return [re.sub(r"\(\d+\.\d s\)", "(T s)", line) for line in lines]


def default_run(out, *flags):
    """The run.log of the default run, its folder named as the README names it."""
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "coreward1", "--out", str(out),
                          *flags], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return (out / "run.log").read_text().replace(str(out), os.path.join("runs", "coreward1")).splitlines()


@pytest.mark.first
@pytest.mark.vllm
def test_the_readme_shows_what_the_default_run_prints(tmp_path):
    assert masked(default_run(tmp_path / "coreward1")) == masked(readme_blocks()[0])


@pytest.mark.first
@pytest.mark.skipif(vllm_installed(), reason="the default run where vLLM is not installed; .ci/run's second pass "
                                             "runs it (PYTHONPATH=tests/without_vllm)")
def test_the_readme_shows_the_evaluations_of_the_default_run_on_transformers(tmp_path):
    printed = default_run(tmp_path / "coreward1")               # --backend auto: transformers' generate
    assert [line for line in printed if line.startswith("eval @")] == readme_blocks()[1]
