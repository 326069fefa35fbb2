"""End to end: a short `train.py` run of each method on the shipped classroom base model."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

STEP_KEYS = {"step", "reward", "rollout_acc", "label_acc", "kl", "entropy", "response_len", "t_rollout", "t_train"}
EVAL_KEYS = {"step", "eval_acc", "eval_greedy"}


def run_train(*args, timeout=600):
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("method", ["gt", "majority", "coreward1"])
def test_short_run_writes_metrics_and_a_loadable_model(tmp_path, method):
    out = tmp_path / method
    res = run_train("--method", method, "--steps", "2", "--pairs_per_step", "8", "--group_size", "4",
                    "--eval_limit", "16", "--eval_every", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr[-4000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward" in x]
    evals = [x for x in lines if "eval_acc" in x]
    assert [x["step"] for x in steps] == [1, 2]
    assert [x["step"] for x in evals] == [0, 1, 2]
    for x in steps:
        assert STEP_KEYS <= set(x) and x["responses"] == 64
        assert 0 <= x["reward"] <= 1 and 0 <= x["label_acc"] <= 1 and x["response_len"] > 5
        assert x["sampler_gap"] < 1e-3          # the engine runs the trainer's weights
        if method == "gt":                       # with gold labels, reward is accuracy
            assert x["reward"] == pytest.approx(x["rollout_acc"])
    for x in evals:
        assert EVAL_KEYS <= set(x) and 0 <= x["eval_acc"] <= 1
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == method and config["lr"] == 1e-4

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert model.config.num_hidden_layers == 4


def test_unknown_method_is_refused():
    res = run_train("--method", "ttrl", timeout=60)
    assert res.returncode == 2 and "invalid choice: 'ttrl'" in res.stderr


def test_prompt_limit_too_small_is_refused(tmp_path):
    res = run_train("--method", "coreward1", "--max_prompt_len", "10", "--out", str(tmp_path), timeout=120)
    assert res.returncode != 0 and "every pair's prompt exceeds --max_prompt_len 10" in res.stderr


def test_two_ranks_each_sample_and_train_their_share(tmp_path):
    out = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", "29655",
           os.path.join(ROOT, "train.py"), "--method", "coreward1", "--steps", "2", "--pairs_per_step", "8",
           "--group_size", "4", "--eval_limit", "16", "--eval_every", "2", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-4000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward" in x]
    assert [x["step"] for x in steps] == [1, 2]
    # 8 pairs x 2 views x 4 responses over both ranks; both ranks' engines run the trainer's weights
    assert all(x["responses"] == 64 and x["sampler_gap"] < 1e-3 for x in steps)
    assert [x["step"] for x in lines if "eval_acc" in x] == [0, 2]
    assert (out / "final" / "model.safetensors").exists()
