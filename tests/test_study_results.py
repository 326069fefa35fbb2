"""The committed study results redraw from their committed runs: in each study folder whose
runs/ holds the runs' metrics.jsonl and config.json, `study/study.py --plot-only` writes the same
table.md and the same figures (pixel for pixel) as the ones committed beside them; and every study table a
document shows is one of those table.md files, whole."""
import glob
import os
import re
import shutil

import matplotlib.image
import numpy as np
import pytest

import study
from conftest import ROOT

STUDIES = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "study", "**", "runs"), recursive=True)
                 if glob.glob(os.path.join(p, "*", "metrics.jsonl")) and os.path.exists(os.path.join(p, "..", "table.md")))


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


STUDY_TABLE = re.compile(r"^\| method \| seeds \| step \(last\) \|.*?(?=\n(?!\|)|\Z)", re.M | re.S)
DOCUMENTS = sorted(glob.glob(os.path.join(ROOT, "study", "**", "*.md"), recursive=True)
                   + glob.glob(os.path.join(ROOT, "*.md")))


def test_each_study_table_a_document_shows_is_a_committed_table_whole():
    """A document pastes a study's table.md by hand: it must be the committed file, row for row."""
    committed = {open(t).read().strip(): os.path.relpath(t, ROOT)
                 for t in glob.glob(os.path.join(ROOT, "study", "**", "table.md"), recursive=True)}
    shown = [(os.path.relpath(doc, ROOT), m.group(0).strip()) for doc in DOCUMENTS
             if not doc.endswith("table.md") for m in STUDY_TABLE.finditer(open(doc).read())]
    assert len(shown) >= 4, shown
    stale = [(doc, table.splitlines()[2][:60]) for doc, table in shown if table not in committed]
    assert not stale, f"these documents show a study table that no committed table.md holds: {stale}; paste the " \
                      f"table.md of the study they describe (one of {sorted(committed.values())})"


# The studies study/review.py judges: each folder, and the official loss its loss table compares with.
REVIEWS = {os.path.join(ROOT, "study", "seeded"): [],
           os.path.join(ROOT, "study", "reviewed"): ["--loss_base", "coreward1-mb4"]}   # commit da4bcc6's, re-judged


@pytest.mark.parametrize("folder", REVIEWS, ids=[os.path.relpath(s, ROOT) for s in REVIEWS])
def test_a_reviewed_study_redraws_its_statistics_from_its_committed_evaluations(folder, tmp_path):
    """study/review.py on the committed runs' final evaluations (RUN/eval/results.json), their metrics.jsonl and the
    start model's evaluations writes the committed review.md (every interval and p-value, its bootstrap and simulation
    seeded) and passk.png, pixel for pixel."""
    import review
    if not os.path.exists(os.path.join(folder, "review.md")):
        pytest.skip(f"{os.path.relpath(folder, ROOT)}: no review.md committed")
    for path in glob.glob(os.path.join(folder, "runs", "*", "eval", "results.json")) + \
            glob.glob(os.path.join(folder, "runs", "*", "metrics.jsonl")) + \
            glob.glob(os.path.join(folder, "start", "*", "results.json")):
        copy = tmp_path / os.path.relpath(path, folder)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
    review.main([str(tmp_path), *REVIEWS[folder]])
    assert (tmp_path / "review.md").read_text() == open(os.path.join(folder, "review.md")).read()
    redrawn, committed = (matplotlib.image.imread(p) for p in (tmp_path / "passk.png",
                                                                os.path.join(folder, "passk.png")))
    assert redrawn.shape == committed.shape and np.array_equal(redrawn, committed)


INTERVAL = re.compile(r"([+−-]\d\.\d{3}) \[([+−-]\d\.\d{3}), ([+−-]\d\.\d{3})\]")


def test_each_interval_the_study_readme_quotes_is_one_a_review_md_holds():
    """study/README.md quotes differences as `+0.105 [+0.091, +0.119]`: each must be a difference and interval of a
    study's review.md (which the test above redraws), not a figure copied by hand and left behind."""
    computed = {match.groups() for folder in REVIEWS if os.path.exists(os.path.join(folder, "review.md"))
                for match in INTERVAL.finditer(open(os.path.join(folder, "review.md")).read())}
    quoted = [match.group(0) for match in INTERVAL.finditer(open(os.path.join(ROOT, "study", "README.md")).read())]
    assert len(quoted) >= 5, quoted
    stale = [q for q in quoted if tuple(v.replace("−", "-") for v in INTERVAL.fullmatch(q).groups()) not in computed]
    assert not stale, f"study/README.md quotes intervals that no study's review.md holds: {stale}"
