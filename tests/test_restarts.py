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


def settled(args):
    """(settings, checkpoint) as resume.begin and config.settings make them of a restart's flags (as_an_attempt's)."""
    path = None
    if args.resume is not None:
        args, path = resume.resume_settings(args, config.PRESETS, config.NOT_CONFIG)
    return config.settings(args, resumed=path is not None), path


@pytest.mark.parametrize("words", FORMS, ids=lambda w: " ".join(w) or "plain")
def test_a_restart_continues_from_the_newest_checkpoint_whatever_the_command_said(tmp_path, monkeypatch, words):
    out, args, line = restart_of(tmp_path, monkeypatch, words, with_checkpoint=True)
    assert line == f"restart 1 of 2 of torchrun abc: continued from {os.path.join(out, 'checkpoints', 'step_2')}"
    settings, path = settled(args)          # not refused: --resume and --overwrite are no longer both there
    assert path == os.path.join(out, "checkpoints", "step_2") and settings.out == out and not settings.overwrite


@pytest.mark.parametrize("words", FORMS, ids=lambda w: " ".join(w) or "plain")
def test_a_restart_before_the_first_checkpoint_starts_afresh_whatever_the_command_said(tmp_path, monkeypatch, words):
    _, args, line = restart_of(tmp_path, monkeypatch, words, with_checkpoint=False)
    assert line == "restart 1 of 2 of torchrun abc: no complete checkpoint yet, so the run starts afresh"
    settings, path = settled(args)
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


def test_every_rank_names_the_same_attempt_whatever_its_agents_count(monkeypatch):
    """Two nodes, one worker each, sharing the agents' store (a real TCPStore here). Node B's worker dies; B's agent
    restarts it as its restart 1, and A's agent restarts its own for the membership change, which it does not count
    (TORCHELASTIC_RESTART_COUNT 0). Both new workers take attempt 1, and the process group's keys of attempt 1 (the
    same prefix); both see a restart of the run (as_an_attempt's count), not a second run on its folder."""
    import torch.distributed as dist
    from test_resume import _free_port
    port = _free_port()
    host = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)      # the agents' store
    for name, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "two-nodes", "TORCHELASTIC_MAX_RESTARTS": "1"}.items():
        monkeypatch.setenv(name, value)

    def worker(rank, agents_count):
        """A new worker process: its own arrival, under the count its agent gives it."""
        monkeypatch.setattr(resume, "_arrivals", {})
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(agents_count))
        store = resume.restart_store()
        return resume.attempt()[1], store and store["store"]

    first = [worker(0, 0), worker(1, 0)]
    assert [count for count, _ in first] == [0, 0] and [store for _, store in first] == [{}, {}]
    restarted = [worker(1, 1), worker(0, 0)]                       # B's counted restart, then A's uncounted one
    assert [count for count, _ in restarted] == [1, 1]
    restarted[0][1].set("key", "from rank 1")
    assert restarted[1][1].get("key") == b"from rank 1"            # one prefix: attempt_1/
    assert host.num_keys() == 2                                    # the arrivals, and that key
