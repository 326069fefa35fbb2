"""tools/rehearse.py, the seed run rehearsed on a CPU: its short form runs over real rows of OpenRS that include row
4303, the row without gold that stopped every label method (`pytest -m slow`; CI runs `tools/rehearse.py --short` as a
step of its own, .ci/run); GPUS.md holds the whole rehearsal's output, whose figures that follow from the data and the
script alone are recomputed here."""
import os
import re
import subprocess
import sys

import pytest

import rehearse
from conftest import ROOT

GPUS = open(os.path.join(ROOT, "GPUS.md")).read()


def rehearsal_block():
    """The output of `python tools/rehearse.py` that GPUS.md shows: the text block after its command."""
    return re.search(r"```text\n(rehearsal of the seed run.*?)```", GPUS, re.S).group(1)


@pytest.mark.vllm                          # the seed run samples with vLLM
@pytest.mark.slow                          # two minutes; CI runs the script itself (.ci/run)
def test_the_short_rehearsal_trains_over_row_4303_and_evaluates_its_checkpoint_as_its_final_model(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "rehearse.py"), "--short", "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=1200)
    out = proc.stdout
    assert proc.returncode == 0 and "NOT HELD" not in out, out + proc.stderr[-3000:]
    assert out.splitlines()[-1].startswith("rehearsal passed")
    assert f"held: row {rehearse.ROW} (no gold) drawn in step 1" in out
    assert re.search(r"held: gt on openrs \(--seed \d+\): status 0, .*; step 1 draws row 4303: label_acc 1\.0", out)
    assert "held: identical results on final/ and the checkpoint" in out
    assert "held: the data's notices printed once (rank 0), not once a rank" in out


def test_gpus_md_shows_the_whole_rehearsal_as_the_script_runs_it():
    """Every check held, within 30 minutes; the settings it names are CPU_SETTINGS; its step count is the steps by
    which every one of OpenRS's 6,999 rows is drawn from seed 0 (train.Questions: only the count of pairs matters,
    and none is over --max_prompt_len for the stand-in), the step that first draws row 4303 and the seed of gt's run
    are those the script computes; every other run is there."""
    block = rehearsal_block()
    checks = re.findall(r"^   (held|NOT HELD): ", block, re.M)
    assert len(checks) >= 15 and set(checks) == {"held"}
    minutes = float(re.search(r"^rehearsal passed \((\S+) min\)", block, re.M).group(1))
    assert minutes <= 30
    assert f"changed for a CPU: {rehearse.changed(rehearse.CPU_SETTINGS['full'])};" in block
    assert "changed for a CPU: --group_size 2 (the seed's 8), --eval_limit 128 (the seed's all 5,000);" in block
    assert "0 pairs over --max_prompt_len 512" in block
    pairs = [None] * 6999
    steps = rehearse.steps_to_draw_every_row(pairs, 0, 128)
    first = min(s for s, rows in enumerate(rehearse.drawn_by_step(pairs, 0, 128, steps), 1) if 4303 in rows)
    assert f"--steps {steps} (the seed's --epochs 3, 162 steps)" in block
    assert f"every one of the 6,999 OpenRS rows drawn, row 4303 (no gold) first in step {first}" in block
    assert f"gt on openrs (--seed {rehearse.first_seed_drawing(pairs, 4303, 128)}):" in block
    for method, source in rehearse.OTHER_RUNS:
        assert re.search(rf"^   held: {method} on {source} \(--seed \d+\): status 0, rewards ", block, re.M)
