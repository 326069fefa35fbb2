"""The settings: presets, methods as argument values, the generated help, and the checks that
refuse what cannot work before any compute."""
import json
import os
import re
import subprocess
import sys

import pytest

import config
from harness import errors
from harness.resume import ADDED_SETTINGS, resume_settings
from conftest import ROOT

from rewards import METHODS


@pytest.mark.parametrize("flags, world_size, message", [
    (["--group_size", "1"], 1, "--group_size 1 must be at least 2"),
    (["--steps", "0"], 1, "--steps 0 must be at least 1"),
    (["--steps", "-3"], 1, "--steps -3 must be at least 1"),
    (["--eval_every", "0"], 1, "--eval_every 0 must be at least 1"),
    (["--questions_per_step", "9"], 2, "--questions_per_step 9 must be divisible by the 2 ranks"),
    (["--questions_per_step", "8", "--group_size", "4", "--mini_batches", "3"], 2,
     "--mini_batches 3 must divide the 32 sequences each rank trains on per step"),
    (["--mini_batches", "0"], 1, "--mini_batches 0 must be at least 1"),
    (["--micro_batch_size", "0"], 1, "--micro_batch_size 0 must be at least 1"),
    (["--questions_per_step", "0"], 1, "--questions_per_step 0 must be at least 1"),
    (["--views", "original"], 1, "--method coreward1 labels each question's responses with its rephrasing's vote: it "
                                 "needs --views both, not --views original"),
    (["--teacher_prompts", "rephrased"], 1, "--teacher_prompts rephrased has the EMA teacher answer the rephrasings "
                                            "of the original questions the policy trains on: it needs a teacher "
                                            "method"),
    (["--eval_k", "-1"], 1, "--eval_k -1 must be 0 or more"),
    (["--sampler_gap_factor", "1"], 1, "--sampler_gap_factor 1.0 must be above 1"),
    (["--max_response_len", "0"], 1, "--max_response_len 0 must be at least 1"),
    (["--max_prompt_len", "0"], 1, "--max_prompt_len 0 must be at least 1"),
    (["--temperature", "0"], 1, "--temperature 0.0 must be positive"),
    (["--gpu_memory_utilization", "1.5"], 1, "--gpu_memory_utilization 1.5 must be between 0 and 1"),
    (["--max_tokens_per_micro_batch", "100"], 1, "--max_tokens_per_micro_batch 100 must hold one sequence of the "
                                                 "longest length, 112 tokens"),
    (["--max_tokens_per_micro_batch", "-1"], 1, "--max_tokens_per_micro_batch -1 must be 0 or more"),
    (["--model", "m", "--epochs", "0"], 1, "--epochs 0.0 must be positive"),
    (["--rollout_correction_cap", "0.5"], 1, "--rollout_correction_cap 0.5 must be at least 1"),
    (["--clip_high", "0"], 1, "--clip_eps 0.2 and --clip_high 0.0 must be positive"),
    (["--overlong", "soft", "--overlong_buffer", "48"], 1, "--overlong soft with --overlong_buffer 48: the buffer must "
                                                           "be at least 1 token and shorter than --max_response_len 48"),
    (["--rephrase_noise", "1.5"], 1, "--rephrase_noise 1.5 must be a share, between 0 and 1"),
])
def test_settings_that_cannot_work_are_refused(flags, world_size, message):
    args = config.parse_args(["--method", "coreward1", *flags])
    with pytest.raises(ValueError, match=re.escape(message)):
        config.check_settings(args, world_size)


def test_the_controls_and_restrain_get_what_they_need(tmp_path):
    """matched_coin needs a --replay run of its groups, and no other method takes one; --advantage_std given (a
    method's own advantages) is restrain's, which needs it."""
    def refused(*flags):
        with pytest.raises(ValueError) as e:
            config.check_settings(config.parse_args(list(flags)), 1)
        return str(e.value)
    assert "--method matched_coin replays the rewards of the run given by --replay" in refused("--method", "matched_coin")
    assert "no other method takes one" in refused("--method", "coreward1", "--replay", str(tmp_path))
    assert "it holds no config.json" in refused("--method", "matched_coin", "--replay", str(tmp_path))
    run = {"seed": 0, "data": "classroom", "views": "both", "questions_per_step": 16, "group_size": 8, "steps": 60}
    (tmp_path / "config.json").write_text(json.dumps({**run, "seed": 3}))
    assert "--seed 3 there, 0 here" in refused("--method", "matched_coin", "--replay", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**run, "steps": 20}))
    assert "it trained fewer steps" in refused("--method", "matched_coin", "--replay", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(run))
    config.check_settings(config.parse_args(["--method", "matched_coin", "--replay", str(tmp_path)]), 1)
    assert "as --method restrain does and needs" in refused("--method", "restrain", "--advantage_std", "group")
    assert "as --method restrain does and needs" in refused("--method", "gt", "--advantage_std", "given")
    config.check_settings(config.parse_args(["--method", "restrain"]), 1)


def test_a_replayed_step_is_read_from_the_runs_record(tmp_path):
    """matched_coin reads each step's group_rewards from the --replay run's metrics.jsonl (its last line of that
    step, as a resumed run rewrites it); a step it lacks stops the run in one line."""
    from harness.runfolder import replayed_rewards
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "eval_acc": 0.2}, {"step": 1, "group_rewards": [1.0, 0.0]}, {"step": 1, "group_rewards": [2.0, 3.0]}]))
    assert replayed_rewards(str(tmp_path), 1) == [2.0, 3.0] and replayed_rewards(None, 1) is None
    with pytest.raises(errors.InputError, match="has no group_rewards for step 2"):
        replayed_rewards(str(tmp_path), 2)


def test_settings_that_work_pass():
    config.check_settings(config.parse_args(["--method", "coreward1"]), 1)
    config.check_settings(config.parse_args(["--method", "coreward1", "--questions_per_step", "8", "--group_size", "4",
                                           "--mini_batches", "4"]), 2)
    config.check_settings(config.parse_args(["--method", "coreward1", "--model", "m"]), 8)     # the official preset


def test_unknown_method_is_refused():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "ttrl"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "invalid choice: 'ttrl'" in res.stderr


@pytest.mark.parametrize("method", METHODS)
def test_the_official_preset_takes_one_update_per_step(method):
    """The official scripts set ppo_mini_batch_size = train_batch_size = 128: one optimizer update
    per step, for every method; --mini_batches still sets more."""
    assert config.parse_args(["--method", method, "--model", "m"]).mini_batches == 1
    assert config.parse_args(["--method", method, "--model", "m", "--mini_batches", "2"]).mini_batches == 2


def test_help_shows_each_flags_value_in_each_preset_and_method():
    """`train.py --help` prints, for every flag of PRESET_TABLE, its classroom and official values, and the
    methods that set their own (METHOD_TABLE); none is written into a help string by hand (a help may show a
    table's values, formatted from the table: the policy losses' own clips). The expected text
    is made from the tables, so that a new row or value needs no edit here."""
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "1000"})
    assert res.returncode == 0, res.stderr
    lines, flag = {}, None                    # each flag's help, its continuation lines joined
    for line in res.stdout.split("options:")[1].splitlines():
        if line.strip().startswith("-"):
            flag = line.split()[0].rstrip(",")
            lines[flag] = ""
        lines[flag] = lines.get(flag, "") + " " + line.strip()
    for name, *values, _, _ in config.PRESET_TABLE:       # each preset's value, then each method's that differs
        shown = [f"{preset}: {'none' if v is None else v}" for preset, v in zip(config.PRESET_NAMES, values)]
        shown += [f"{method}: {settings[name]}" for method, settings in config.METHOD_DEFAULTS.items()
                  if name in settings]
        assert f"[{'; '.join(shown)}]" in lines[f"--{name}"], name
    assert "{" + ",".join(METHODS) + "}" in lines["--method"]          # the choices: METHOD_TABLE's rows
    from grpo import POLICY_LOSS_SETTINGS          # a help may show a table's values, made from the table
    from_tables = {"0"} | {str(v) for own in POLICY_LOSS_SETTINGS.values() for v in own.values() if v is not None}
    for name, *_, help in config.FLAGS + config.PRESET_TABLE:
        assert set(re.findall(r"\b\d[\d.e-]*", help)) <= from_tables, f"--{name}'s help states a number: {help}"


def test_the_rollout_correction_is_off_unless_asked_for():
    """Off in both presets (the official code has none); --rollout_correction takes a row of grpo's table."""
    from grpo import ROLLOUT_CORRECTIONS
    assert config.parse_args(["--method", "coreward1"]).rollout_correction == "none"
    assert config.parse_args(["--method", "coreward1", "--model", "m"]).rollout_correction == "none"
    args = config.parse_args(["--method", "coreward1", "--rollout_correction", "mis", "--rollout_correction_cap", "3"])
    assert (args.rollout_correction, args.rollout_correction_cap) == ("mis", 3.0)
    assert set(ROLLOUT_CORRECTIONS) == {"none", "tis", "mis", "seq_tis", "seq_mis"}


def test_rephrase_noise_needs_a_method_that_reads_the_rephrasings():
    args = config.parse_args(["--method", "gt", "--rephrase_noise", "0.5"])
    with pytest.raises(ValueError, match="--rephrase_noise 0.5 mismatches rephrasings, which --method gt --views "
                                         "original never reads"):
        config.check_settings(args, 1)
    config.check_settings(config.parse_args(["--method", "coreward2_rephrased", "--rephrase_noise", "0.5"]), 1)


def test_the_loss_family_is_off_unless_asked_for():
    """Both presets take each table's first row (the official code's)."""
    from grpo import ADVANTAGE_STD_TABLE, LOSS_AGG_TABLE, OVERLONG_TABLE, POLICY_LOSS_TABLE
    for model in ([], ["--model", "m"]):
        args = config.parse_args(["--method", "coreward1", *model])
        assert (args.policy_loss, args.loss_agg, args.advantage_std, args.overlong) == \
            (POLICY_LOSS_TABLE[0][0], LOSS_AGG_TABLE[0][0], ADVANTAGE_STD_TABLE[0][0], OVERLONG_TABLE[0][0])
        assert (args.clip_eps, args.clip_high, args.entropy_coef, args.rephrase_noise) == (0.2, None, 0.0, 0.0)


def test_a_checkpoint_from_before_a_setting_existed_resumes_as_it_ran(tmp_path):
    """A config.json written before --rollout_correction existed lacks it: the resumed run takes the value its run
    had (ADDED_SETTINGS: none, cap 2), and a flag that asks for another is refused as any change is."""
    step = tmp_path / "run" / "checkpoints" / "step_3"
    step.mkdir(parents=True)
    (step / "trainer.pt").write_bytes(b"")
    saved = config.config_of(config.parse_args(["--method", "gt", "--out", str(tmp_path / "run")]))
    for name in ADDED_SETTINGS:
        del saved[name]
    (step / "config.json").write_text(json.dumps(saved))
    resumed = lambda flags: resume_settings(config.parse_args(["--resume", str(step), *flags]), config.PRESETS,
                                            config.NOT_CONFIG)
    args, path = resumed([])
    assert (args.rollout_correction, args.rollout_correction_cap) == ("none", 2.0) and path == str(step)
    with pytest.raises(errors.RefusedSetting, match="--rollout_correction tis differs from the checkpoint's none"):
        resumed(["--rollout_correction", "tis"])


def test_default_out_tells_the_documented_runs_apart():
    """The README's classroom run, GPUS.md's SmolLM2 run and the seed run: three folders."""
    assert config.default_out("coreward1", None) == os.path.join("runs", "coreward1")
    assert config.default_out("coreward1", "models/smollm2-135m") == os.path.join("runs", "coreward1-smollm2-135m")
    assert config.default_out("coreward1", "Qwen/Qwen3-4B-Base") == os.path.join("runs", "coreward1-Qwen3-4B-Base")
    assert config.default_out("gt", "runs/coreward1/final/") == os.path.join("runs", "gt-coreward1")
    assert config.default_out("gt", "runs/mine/checkpoints/step_40") == os.path.join("runs", "gt-mine")
    assert config.parse_args(["--method", "gt", "--model", "Qwen/Qwen3-4B-Base"]).out == \
        os.path.join("runs", "gt-Qwen3-4B-Base")


def test_wandb_without_the_package_is_refused_before_anything_runs(monkeypatch):
    import importlib.util
    import sys
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    args = config.parse_args(["--method", "gt", "--wandb", "proj"])
    with pytest.raises(errors.UsageError, match="--wandb proj needs the wandb package: pip install wandb"):
        config.check_settings(args, 1)


WITHOUT_VLLM = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests", "without_vllm")}   # as on macOS


def test_the_engine_is_vllm_where_it_is_installed_and_transformers_elsewhere():
    """--backend auto (the default) takes vLLM where it is installed, transformers' generate (hf) where it is
    not; an explicit choice stands; the run records the engine it took, not 'auto'."""
    code = "import config; print(config.choose_backend('auto'), config.choose_backend('hf'))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=WITHOUT_VLLM)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "('hf', 'auto: vLLM is not installed') ('hf', '--backend hf')"
    assert config.PRESETS["classroom"]["backend"] == config.PRESETS["official"]["backend"] == "auto"
    if config.vllm_installed():
        assert config.choose_backend("auto") == ("vllm", "auto: vLLM is installed")
    args = config.settings(config.parse_args(["--method", "gt"]))
    assert args.backend in ("vllm", "hf") and args.backend_reason.startswith("auto: ")
    assert "backend_reason" not in config.config_of(args)


def test_a_run_without_vllm_samples_with_transformers_and_says_why(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "gt", "--steps", "1",
                          "--questions_per_step", "2", "--group_size", "2", "--eval_limit", "4", "--eval_k", "0",
                          "--save_every", "0", "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=WITHOUT_VLLM)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "; rollouts by transformers' generate (auto: vLLM is not installed); " in res.stdout.splitlines()[0]
    assert json.load(open(tmp_path / "run" / "config.json"))["backend"] == "hf"


@pytest.mark.parametrize("program", ["train.py", "eval.py"])
def test_backend_vllm_without_vllm_is_one_line_and_status_2(program, tmp_path):
    flags = ["--method", "gt"] if program == "train.py" else ["--model", "classroom/base"]
    res = subprocess.run([sys.executable, os.path.join(ROOT, program), *flags, "--backend", "vllm",
                          "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=WITHOUT_VLLM)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"{program}: error: --backend vllm: vLLM is not installed here "
                                       f"(requirements.txt installs it on {config.VLLM_PLATFORMS}); use --backend hf, "
                                       f"or auto; nothing was run"]
    assert not (tmp_path / "out").exists()


def test_native_windows_is_one_line_that_points_to_wsl():
    """Windows has no fcntl (the run folder's locks): train.py says to use WSL, in one line, with status 2."""
    code = ("import runpy, sys; sys.modules['fcntl'] = None; sys.argv = ['train.py', '--method', 'gt']; "
            "runpy.run_path('train.py', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("train.py: error: native Windows is not "
                                                                       "supported") and "WSL" in res.stderr


def test_the_run_length_is_the_official_trainers():
    """len(dataloader) x epochs with drop_last, as the official ray_trainer counts: OpenRS 6,999 pairs at 128 a step
    are 54 steps an epoch, 162 in 3 (not int(3 x 6,999 / 128) = 164, whose last 2 would start a fourth shuffle);
    MATH's 7,500 are 58 x 3 = 174, DAPO-14k's 14,109 are 110 x 3 = 330."""
    import train
    assert [train.run_length(3, n, 128) for n in (6_999, 7_500, 14_109)] == [162, 174, 330]
    assert train.run_length(0.5, 6_999, 128) == 27 and train.run_length(1, 100, 128) == 1


def test_a_policy_loss_brings_its_own_clips_and_aggregation_unless_given():
    """GSPO's row brings its paper's clips and the mean over responses (verl's gspo); CISPO's its clips and no
    aggregation (the preset's). Given flags win, both clips together."""
    gspo = config.parse_args(["--method", "gt", "--policy_loss", "gspo"])
    assert (gspo.clip_eps, gspo.clip_high, gspo.loss_agg) == (3e-4, 4e-4, "seq_mean_token_mean")
    cispo = config.parse_args(["--method", "gt", "--policy_loss", "cispo"])
    assert (cispo.clip_eps, cispo.clip_high, cispo.loss_agg) == (1.0, 4.0, "view_token_mean")
    given = config.parse_args(["--method", "gt", "--policy_loss", "gspo", "--loss_agg", "token_mean", "--clip_eps",
                               "0.1", "--clip_high", "0.2"])
    assert (given.clip_eps, given.clip_high, given.loss_agg) == (0.1, 0.2, "token_mean")
    clip = config.parse_args(["--method", "gt", "--clip_high", "0.28"])      # clip-higher on the token clip
    assert (clip.clip_eps, clip.clip_high, clip.loss_agg) == (0.2, 0.28, "view_token_mean")


@pytest.mark.parametrize("loss, flag", [("gspo", "--clip_eps"), ("gspo", "--clip_high"), ("cispo", "--clip_eps")])
def test_one_clip_beside_a_rows_own_clips_is_refused(loss, flag):
    """--policy_loss gspo --clip_eps 0.2 would have kept GSPO's upper clip at 4e-4 without a word: refused, naming
    the row's clips."""
    with pytest.raises(errors.UsageError, match=f"--policy_loss {loss} brings its own clips .*--clip_eps .*: give both "
                                                f"--clip_eps and --clip_high, or neither, not {flag} alone"):
        config.parse_args(["--method", "gt", "--policy_loss", loss, flag, "0.2"])


@pytest.mark.parametrize("launch, env, said", [
    (["--ranks", "8"], {}, "--ranks 8, but this node shows 2 GPU(s)"),
    ([], {"WORLD_SIZE": "16", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"},
     "torchrun started 8 ranks on this node, but this node shows 2 GPU(s)"),
], ids=["--ranks", "torchrun"])
def test_more_ranks_than_the_node_has_gpus_is_one_line_naming_both(launch, env, said, tmp_path):
    """On a node that shows 2 GPUs, 8 ranks a node are refused before anything starts, in one line with status 2 (not
    CUDA's "invalid device ordinal" traceback in each extra rank). The GPUs are stood in for: torch.cuda says 2."""
    code = ("import runpy, sys, torch; torch.cuda.is_available = lambda: True; torch.cuda.device_count = lambda: 2; "
            f"sys.argv = ['train.py', '--method', 'gt', '--out', {str(tmp_path / 'out')!r}, *{launch!r}]; "
            "runpy.run_path('train.py', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", **env})
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [f"train.py: error: {said} (CUDA_VISIBLE_DEVICES=0,1): one rank a GPU, so "
                                       f"give at most 2; nothing was run"]
    assert not (tmp_path / "out").exists()


def test_the_first_line_names_each_setting_a_run_changes_from_its_preset():
    """DAPO as the study runs it: each of its flags off the preset is in the run's first line, and a run on the preset
    names none."""
    dapo = ["--mini_batches", "4", "--loss_agg", "token_mean", "--clip_high", "0.28", "--overlong", "soft",
            "--group_filter", "zero_variance", "--refill_rounds", "3"]
    args = config.parse_args(["--method", "coreward1", *dapo])
    args.backend = "hf"
    line = config.summary(args, (1, 2), "run/config.json")
    for named in ("--mini_batches 4", "--loss_agg token_mean", "--clip_high 0.28", "--overlong soft",
                  "--group_filter zero_variance", "--refill_rounds 3"):
        assert named in line
    args = config.parse_args(["--method", "coreward1"])
    args.backend = "hf"
    assert ", --" not in config.summary(args, (1, 2), "run/config.json")
