"""A launcher's restart of the run that holds --out continues it, decided on the parsed flags (resume.as_an_attempt):
whatever the first attempt's command said of --resume and --overwrite, abbreviated or with its value after `=`."""
import json
import os

import pytest

import config
from harness import resume

RESTART = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "2"}


def folder_of_a_run(out, with_checkpoint):
    """A run folder as its first attempt left it: its launcher's id, and a complete checkpoint of step 2 or none."""
    os.makedirs(out)
    with open(os.path.join(out, resume.RUN_ID), "w") as f:
        f.write("torchrun abc")
    if with_checkpoint:
        step = os.path.join(out, "checkpoints", "step_2")
        os.makedirs(step)
        open(os.path.join(step, "trainer.pt"), "wb").close()
        with open(os.path.join(step, "config.json"), "w") as f:
            json.dump(config.config_of(config.parse_args(["--method", "gt", "--out", out])), f)
    return out


# Each command a first attempt may have been started with: its words after --method gt --out OUT (PATH: a checkpoint
# of another run).
FORMS = [[], ["--overwrite"], ["--overw"], ["--overwr"], ["--resume"], ["--resume=PATH"], ["--resume", "PATH"],
         ["--res=PATH"]]


def restart_of(tmp_path, monkeypatch, words, with_checkpoint):
    """(the run's folder, the restart's parsed flags, as_an_attempt's line): restart 1 of 2 of the run that holds the
    folder, its command the first attempt's `words` (PATH: a checkpoint of another run)."""
    for name, value in RESTART.items():
        monkeypatch.setenv(name, value)
    out = folder_of_a_run(str(tmp_path / "run"), with_checkpoint)
    words = [w.replace("PATH", str(tmp_path / "elsewhere" / "checkpoints" / "step_1")) for w in words]
    args = config.parse_args(["--method", "gt", "--out", out, *words])
    return out, args, resume.as_an_attempt(args)


@pytest.mark.parametrize("words", FORMS, ids=lambda w: " ".join(w) or "plain")
def test_a_restart_continues_from_the_newest_checkpoint_whatever_the_command_said(tmp_path, monkeypatch, words):
    out, args, line = restart_of(tmp_path, monkeypatch, words, with_checkpoint=True)
    assert line == f"restart 1 of 2 of torchrun abc: continued from {os.path.join(out, 'checkpoints', 'step_2')}"
    settings, path = config.settings(args)          # not refused: --resume and --overwrite are no longer both there
    assert path == os.path.join(out, "checkpoints", "step_2") and settings.out == out and not settings.overwrite


@pytest.mark.parametrize("words", FORMS, ids=lambda w: " ".join(w) or "plain")
def test_a_restart_before_the_first_checkpoint_starts_afresh_whatever_the_command_said(tmp_path, monkeypatch, words):
    _, args, line = restart_of(tmp_path, monkeypatch, words, with_checkpoint=False)
    assert line == "restart 1 of 2 of torchrun abc: no complete checkpoint yet, so the run starts afresh"
    settings, path = config.settings(args)
    assert path is None and settings.overwrite and settings.resume is None


def test_a_first_attempt_and_another_runs_folder_are_no_restart(tmp_path, monkeypatch):
    """Attempt 0 keeps its command; so does a restart whose launcher is not the one that holds the folder."""
    out = folder_of_a_run(str(tmp_path / "run"), with_checkpoint=True)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    args = config.parse_args(["--method", "gt", "--out", out, "--overwrite"])
    assert resume.as_an_attempt(args) is None and args.overwrite and args.resume is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "other")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume.as_an_attempt(args) is None and args.overwrite and args.resume is None
