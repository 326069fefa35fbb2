"""The ten-minute trial (tools/trial.py) on a CPU: the classroom world trains, stops at SIGTERM in step 3 with that
step saved, resumes to its end, and prints what GPUS.md shows ("The ten-minute trial"), times aside."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def shown_in_gpus_md():
    section = open(os.path.join(ROOT, "GPUS.md")).read().split("## The ten-minute trial", 1)[1].split("\n## ", 1)[0]
    return section.split("```text\n")[1].split("```", 1)[0].splitlines()


def masked(lines):
    return [re.sub(r"\(\d+\.\d s\)", "(T s)", line) for line in lines]


@pytest.mark.first
@pytest.mark.vllm
def test_the_trial_passes_on_a_cpu_and_prints_what_gpus_md_shows(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "trial.py"), "--out", str(tmp_path / "trial")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    printed = res.stdout.replace(str(tmp_path / "trial"), os.path.join("runs", "trial")).splitlines()
    assert masked(printed) == masked(shown_in_gpus_md())
    assert sorted(os.listdir(tmp_path / "trial" / "checkpoints"))[-1] == "step_4"
