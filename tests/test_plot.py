"""study/plot.py: the series it draws from synthetic runs, and the files it writes."""
import argparse
import json
import os

import pytest

import plot


def _run(tmp_path, name, method, seed, rewards, evals, extra=None):
    """A run folder: config.json, and metrics.jsonl with a record per step and per evaluation."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"method": method, "seed": seed}))
    lines = [{"step": s, "eval_acc": a, "eval_greedy": a + 0.1, "eval_maj": a + 0.2} for s, a in evals]
    lines += [{"step": i + 1, "reward": r, "label_acc": None if method == "entropy" else 0.5, **(extra or {})}
              for i, r in enumerate(rewards)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_the_series_are_the_mean_and_band_over_seeds(tmp_path):
    """Three seeds of one method: mean, min and max per step, by hand; a seed still going limits
    the method to the steps it has reached; another method is its own line; a key a method never
    logged (label_acc of an answer-free method) leaves it out of that panel."""
    runs = [plot.read_run(p) for p in [
        _run(tmp_path, "a0", "coreward1", 0, [0.1, 0.2, 0.3], [(0, 0.2), (3, 0.4)]),
        _run(tmp_path, "a1", "coreward1", 1, [0.3, 0.4, 0.5], [(0, 0.2), (3, 0.6)]),
        _run(tmp_path, "a2", "coreward1", 2, [0.2, 0.9], [(0, 0.2)]),                 # still going: 2 steps
        _run(tmp_path, "b0", "entropy", 0, [-1.0, -0.5, -0.25], [(0, 0.2), (3, 0.1)]),
    ]]
    steps, mean, low, high = plot.series(runs, "reward")["coreward1"]
    assert steps == [1, 2]
    assert mean == pytest.approx([0.2, 0.5]) and low == pytest.approx([0.1, 0.2]) and high == pytest.approx([0.3, 0.9])
    assert plot.series(runs, "reward")["entropy"] == ([1, 2, 3], [-1.0, -0.5, -0.25], [-1.0, -0.5, -0.25],
                                                      [-1.0, -0.5, -0.25])
    steps, mean, low, high = plot.series(runs, "eval_greedy")["coreward1"]
    assert steps == [0] and mean == pytest.approx([0.3])
    assert "entropy" not in plot.series(runs, "label_acc")
    assert plot.series(runs, "unanimous") == {}


def test_the_training_lines_are_each_seeds_trailing_mean(tmp_path):
    """window 2: each seed's value is the mean of its step and the step logged before it (the
    first step alone), and only then the mean and band over seeds are taken:
    seed 0 0.1, 0.2, 0.6 -> 0.1, 0.15, 0.4; seed 1 0.3, 0.1, 0.2 -> 0.3, 0.2, 0.15."""
    runs = [plot.read_run(p) for p in [_run(tmp_path, "a0", "majority", 0, [0.1, 0.2, 0.6], [(0, 0.2)]),
                                       _run(tmp_path, "a1", "majority", 1, [0.3, 0.1, 0.2], [(0, 0.2)])]]
    steps, mean, low, high = plot.series(runs, "reward", window=2)["majority"]
    assert steps == [1, 2, 3]
    assert low == pytest.approx([0.1, 0.15, 0.15]) and high == pytest.approx([0.3, 0.2, 0.4])
    assert mean == pytest.approx([0.2, 0.175, 0.275])
    assert plot.smooth({5: 1.0, 7: 2.0, 9: 6.0}, 10) == pytest.approx({5: 1.0, 7: 1.5, 9: 3.0})
    assert plot.smooth({5: 1.0, 7: 2.0}, 1) == {5: 1.0, 7: 2.0}


def test_plot_writes_the_figures(tmp_path):
    runs = [_run(tmp_path, f"r{s}", "majority", s, [0.1 * s, 0.2, 0.3], [(0, 0.2), (3, 0.3 + 0.1 * s)],
                 extra={"unanimous": 0.1, "zero_variance": 0.2, "distinct_answers": 3.0}) for s in range(3)]
    plot.main([*runs, "--out", str(tmp_path / "fig")])
    for name in ("eval.png", "train.png"):
        path = tmp_path / "fig" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a run folder: no config.json"):
        plot.read_run(str(tmp_path))


def test_the_study_skips_finished_runs_and_resumes_unfinished_ones(tmp_path):
    import study
    fresh, stopped, done = (study.run_dir(str(tmp_path), "majority", s) for s in range(3))
    step = os.path.join(stopped, "checkpoints", "step_20")
    os.makedirs(step)
    for name in ("trainer.pt", "config.json"):
        open(os.path.join(step, name), "w").close()
    os.makedirs(os.path.join(done, "final"))
    open(os.path.join(done, "final", "config.json"), "w").close()
    assert [study.plan(p) for p in (fresh, stopped, done)] == ["start", "resume", "skip"]
    assert study.command(done, "majority", 2, 300, []) is None
    assert study.command(stopped, "majority", 1, 300, ["--lr", "1e-3"])[2:] == ["--out", stopped, "--resume"]
    assert study.command(fresh, "majority", 0, 300, ["--lr", "1e-3"])[2:] == \
        ["--out", fresh, "--method", "majority", "--seed", "0", "--steps", "300", "--overwrite", "--lr", "1e-3"]


def test_a_committed_run_is_finished_and_the_matched_coin_replays_coreward1_of_its_seed(tmp_path):
    """A run a study committed holds its evaluation but no final model: skipped, not started again over it.
    matched_coin's command names the coreward1 run of its seed in the same study, unless --replay is given."""
    import study
    committed = study.run_dir(str(tmp_path), "gt", 4)
    os.makedirs(os.path.join(committed, "eval"))
    open(os.path.join(committed, "eval", "results.json"), "w").close()
    assert study.plan(committed) == "skip" and study.evaluation(committed, 4, 256) is None
    coin = study.run_dir(str(tmp_path), "matched_coin", 3)
    assert study.command(coin, "matched_coin", 3, 60, ["--views", "both"])[-4:] == \
        ["--replay", study.run_dir(str(tmp_path), "coreward1", 3), "--views", "both"]
    assert study.command(coin, "matched_coin", 3, 60, ["--replay", "x"]).count("--replay") == 1


def test_the_seeds_a_study_takes():
    import study
    assert list(study.seeds_arg("3")) == [0, 1, 2] and list(study.seeds_arg("5-9")) == [5, 6, 7, 8, 9]
    assert study.seeds_arg("0,2,4") == [0, 2, 4]
    for bad in ("a", "1-", "-2", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            study.seeds_arg(bad)


def test_the_study_table_by_hand(tmp_path):
    """First, best and last evaluation per method: the mean over seeds, the min-max in brackets."""
    import study
    runs = [plot.read_run(p) for p in [
        _run(tmp_path, "a0", "coreward1", 0, [0.1], [(0, 0.2), (20, 0.5), (40, 0.4)]),
        _run(tmp_path, "a1", "coreward1", 1, [0.1], [(0, 0.2), (20, 0.3), (40, 0.6)]),
        _run(tmp_path, "b0", "gt", 0, [0.1], [(0, 0.2), (20, 0.7), (40, 0.6)]),
    ]]
    lines = study.table(runs).splitlines()
    # coreward1 avg@k: first 0.2; best: step 40 (mean 0.5 against 0.4 at step 20); last 0.5; greedy is avg@k + 0.1
    assert lines[2] == ("| `gt` | 1 | 40 | 0.200 / 0.700 / 0.600 | 0.300 / 0.800 / 0.700 | "
                        "0.400 / 0.900 / 0.800 | – |")
    assert lines[3].startswith("| `coreward1` | 2 | 40 | 0.200 (0.200–0.200) / 0.500 (0.400–0.600) / "
                               "0.500 (0.400–0.600) | ")


def test_the_study_table_shows_where_each_seed_was_warned(tmp_path):
    """The collapse warning replayed from the metrics: seed 0 answers one thing to every question
    from step 5 on (common_answer 0.9; the first full 10-step window, steps 1-10, has mean
    6 x 0.9 + 4 x 0.1 = 5.8 / 10, over the 0.2 limit: warned at step 10), seed 1 stays healthy
    (0.1 throughout)."""
    import study
    hacked = {s: 0.9 if s >= 5 else 0.1 for s in range(1, 21)}
    healthy = dict.fromkeys(range(1, 21), 0.1)
    runs = []
    for seed, common in ((1, healthy), (0, hacked)):
        path = tmp_path / f"m{seed}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"method": "majority", "seed": seed}))
        lines = [{"step": 0, "eval_acc": 0.2, "eval_greedy": 0.3, "eval_maj": 0.4}]
        lines += [{"step": s, "reward": 0.5, "unanimous": 0.1, "zero_variance": 0.3, "no_answer": 0.0,
                   "truncated": 0.0, "common_answer": c} for s, c in common.items()]
        (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        runs.append(plot.read_run(str(path)))
    assert study.first_warning(runs[1][2]) == 10 and study.first_warning(runs[0][2]) is None
    assert study.table(runs).splitlines()[2].endswith("| 10, – |")


def test_a_run_still_being_written_is_drawn_without_its_unfinished_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"method": "gt", "seed": 0}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_acc": 0.1}\n{"step": 1, "reward": 0.5}\n'
                                            '{"step": 2, "rew')
    method, seed, records = plot.read_run(str(tmp_path))
    assert (method, seed, [r["step"] for r in records]) == ("gt", 0, [0, 1])
    assert "its last line is unfinished" in capsys.readouterr().out
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_acc": 0.1}\n{"step": 1, "rew\n'
                                            '{"step": 2, "reward": 1}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        plot.read_run(str(tmp_path))


def test_a_runs_name_is_its_folders_name_without_the_seed(tmp_path):
    """coreward1_s0 -> coreward1, coreward1-gspo_s2 -> coreward1-gspo (the seed from config.json, a trailing
    slash or not); a folder without the _sSEED suffix is named by config.json's method."""
    import study
    assert plot.read_run(_run(tmp_path, "coreward1_s0", "coreward1", 0, [0.1], [(0, 0.2)]))[:2] == ("coreward1", 0)
    variant = _run(tmp_path, "coreward1-gspo_s2", "coreward1", 2, [0.1], [(0, 0.2)])
    assert plot.read_run(variant)[:2] == plot.read_run(variant + os.sep)[:2] == ("coreward1-gspo", 2)
    assert plot.read_run(_run(tmp_path, "lr1e.3_s10", "gt", 10, [0.1], [(0, 0.2)]))[:2] == ("lr1e.3", 10)
    assert plot.read_run(_run(tmp_path, "a0", "majority", 1, [0.1], [(0, 0.2)]))[:2] == ("majority", 1)
    assert study.run_dir("out", "coreward1", 2, "gspo") == os.path.join("out", "runs", "coreward1-gspo_s2")
    assert study.run_dir("out", "coreward1", 2) == os.path.join("out", "runs", "coreward1_s2")


def test_a_variant_comes_right_after_its_method_in_its_own_colour():
    """Rows: the methods in rewards.METHOD_TABLE's order, each followed by its variants by label, any other
    name last; the methods keep tab10's colour at their place in the table (the committed figures' colours),
    and the other names take colours none of the methods nor each other has."""
    import matplotlib
    from rewards import METHODS
    names = ["entropy", "coreward1-gspo", "zzz", "gt", "coreward1", "coreward1-clip0.28", "majority-gspo",
             "majority", "nomethod-gspo"]
    assert sorted(names, key=plot.method_order) == ["gt", "majority", "majority-gspo", "coreward1",
                                                    "coreward1-clip0.28", "coreward1-gspo", "entropy",
                                                    "nomethod-gspo", "zzz"]
    color = plot.colors(names)
    tab10 = matplotlib.colormaps["tab10"]
    assert all(color[m] == tab10(i) for i, m in enumerate(METHODS) if i < 10)
    assert len(set(color.values())) == len(color) == len(set(names) | set(METHODS))
    assert color == plot.colors(reversed(names))


def test_a_label_that_could_be_misread_in_a_folder_name_is_refused(tmp_path, capsys):
    import study
    for bad in ("gspo-2", "clip_s1", "token_mean", "a b", "x/y", ""):
        with pytest.raises(SystemExit) as stopped:
            study.main(["--out", str(tmp_path), "--plot-only", "--label", bad])
        assert stopped.value.code == 2
        assert f"argument --label: {bad!r} is not a label: use letters, digits and dots only" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no run in .* has logged anything yet"):    # a good label goes through
        study.main(["--out", str(tmp_path), "--plot-only", "--label", "clip0.28"])


def test_a_labelled_study_starts_its_runs_in_their_own_folders(tmp_path, monkeypatch):
    """--label: each (method, seed) starts in OUT/runs/METHOD-LABEL_sSEED with the flags after --, and the
    study beside them (an unlabelled run already there) is drawn whole afterwards."""
    import study
    started = []

    def train(cmd, check):                 # train.py, as far as the study sees it: config.json and metrics.jsonl
        started.append(cmd[2:])
        args = dict(zip(cmd[2::2], cmd[3::2]))
        path = tmp_path / args["--out"]
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"method": args["--method"], "seed": int(args["--seed"])}))
        (path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_acc": 0.1, "eval_greedy": 0.2,
                                                        "eval_maj": 0.3}) + "\n")
    monkeypatch.setattr(study.subprocess, "run", train)
    out = tmp_path / "study"
    (out / "runs").mkdir(parents=True)
    _run(out / "runs", "coreward1_s0", "coreward1", 0, [0.1], [(0, 0.2)])
    study.main(["--out", str(out), "--methods", "coreward1", "--seeds", "2", "--steps", "5", "--label", "gspo",
                "--", "--policy_loss", "gspo"])
    assert started == [["--out", str(out / "runs" / f"coreward1-gspo_s{seed}"), "--method", "coreward1", "--seed",
                        str(seed), "--steps", "5", "--overwrite", "--policy_loss", "gspo"] for seed in (0, 1)]
    rows = (out / "table.md").read_text().splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows] == [["| `coreward1`", "1"], ["| `coreward1-gspo`", "2"]]


def test_plot_only_draws_every_run_of_the_study_folder(tmp_path):
    """Several labelled invocations filled one folder: --plot-only tabulates and draws every run folder that has
    a metrics.jsonl, whatever --methods and --seeds say (a folder that has logged nothing is left out), each
    variant right after its method; a variant's numbers are its own seeds' (avg@k mean over seeds by hand)."""
    import study
    runs = tmp_path / "study" / "runs"
    runs.mkdir(parents=True)
    _run(runs, "gt_s0", "gt", 0, [0.1], [(0, 0.2), (10, 0.6)])
    for seed in range(2):
        _run(runs, f"coreward1_s{seed}", "coreward1", seed, [0.1], [(0, 0.2), (10, 0.3 + 0.1 * seed)])
        _run(runs, f"coreward1-gspo_s{seed}", "coreward1", seed, [0.2], [(0, 0.2), (10, 0.4 + 0.2 * seed)])
    _run(runs, "coreward1-clip0.28_s5", "coreward1", 5, [0.3], [(0, 0.2), (10, 0.5)])
    (runs / "majority-gspo_s0").mkdir()                                   # started, nothing logged yet
    (runs / "majority-gspo_s0" / "config.json").write_text(json.dumps({"method": "majority", "seed": 0}))
    study.main(["--out", str(tmp_path / "study"), "--plot-only", "--methods", "gt", "--seeds", "1"])
    rows = (tmp_path / "study" / "table.md").read_text().splitlines()[2:]
    assert [row.split(" | ")[:3] for row in rows] == [["| `gt`", "1", "10"], ["| `coreward1`", "2", "10"],
                                                      ["| `coreward1-clip0.28`", "1", "10"],
                                                      ["| `coreward1-gspo`", "2", "10"]]
    assert rows[3].split(" | ")[3] == "0.200 (0.200–0.200) / 0.500 (0.400–0.600) / 0.500 (0.400–0.600)"
    for name in ("eval.png", "train.png"):
        assert (tmp_path / "study" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
