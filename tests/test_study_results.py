"""The committed study results redraw from their committed runs: in each study folder whose
runs/ holds the runs' metrics.jsonl and config.json, `study/study.py --plot-only` writes the same
table.md and the same figures (pixel for pixel) as the ones committed beside them."""
import glob
import os
import shutil

import matplotlib.image
import numpy as np
import pytest

import study
from conftest import ROOT

STUDIES = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "study", "**", "runs"), recursive=True)
                 if glob.glob(os.path.join(p, "*", "metrics.jsonl")))


def test_there_are_committed_studies_to_redraw():
    assert len(STUDIES) >= 3, STUDIES


@pytest.mark.parametrize("folder", STUDIES, ids=[os.path.relpath(s, ROOT) for s in STUDIES])
def test_a_study_redraws_from_its_committed_runs(folder, tmp_path):
    out = tmp_path / "study"
    for run in glob.glob(os.path.join(folder, "runs", "*")):
        os.makedirs(out / "runs" / os.path.basename(run))
        for name in ("metrics.jsonl", "config.json"):
            shutil.copy(os.path.join(run, name), out / "runs" / os.path.basename(run) / name)
    study.main(["--out", str(out), "--plot-only"])
    assert (out / "table.md").read_text() == open(os.path.join(folder, "table.md")).read()
    for figure in ("eval.png", "train.png"):
        redrawn = matplotlib.image.imread(out / figure)
        committed = matplotlib.image.imread(os.path.join(folder, figure))
        assert redrawn.shape == committed.shape and np.array_equal(redrawn, committed), figure
