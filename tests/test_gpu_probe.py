"""bench/gpu_probe.py at its tiny shape on a CPU: a record per step with every field, the memory account as
bench/scale.py computes it, the MFU by the stated formula, the weight gather over every parameter once."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import scale  # noqa: E402


def load_probe():
    spec = importlib.util.spec_from_file_location("gpu_probe", os.path.join(ROOT, "bench", "gpu_probe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("probe") / "probe.json")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_probe.py"), "--tiny", "--steps", "2",
                          "--out", out], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.load(open(out)), res.stdout


STEP_FIELDS = ("step", "seconds", "tokens", "response_tokens", "sequences", "passes", "micro_tokens", "flops", "mfu",
               "peak_flops", "peak_allocated", "peak_reserved", "peak_allocated_passes", "peak_allocated_optimizer",
               "engine_bytes", "account_tensors", "account_parts", "account_training", "gather_seconds",
               "gather_tensors", "gather_bytes", "sync_seconds", "sample", "grad_norm")


def test_one_record_per_step_with_its_fields(tiny_run):
    doc, stdout = tiny_run
    assert "error" not in doc["setup"]
    assert [r["step"] for r in doc["steps"]] == [1, 2]
    probe = load_probe()
    shape = probe.SHAPES["tiny"]
    for r in doc["steps"]:
        assert set(STEP_FIELDS) <= set(r)
        assert r["peak_allocated"] is None                          # no CUDA allocator on a CPU
        assert r["sequences"] == probe.VIEWS * shape["questions"] * shape["group_size"]
        assert 0 < r["micro_tokens"] <= shape["max_tokens_per_micro_batch"]
        assert r["response_tokens"] < r["tokens"]
        assert r["padding_efficiency"] == pytest.approx(r["response_tokens"] / r["tokens"])
        assert r["seconds"] > 0 and r["gather_seconds"] > 0 and r["sync_seconds"] > 0
        s = r["sample"]
        assert s["responses"] == len(s["lengths"]) == shape["sample_prompts"] * shape["sample_n"]
        assert all(1 <= n <= shape["sample_tokens"] for n in s["lengths"]) and s["seconds"] > 0
        assert s["tokens_per_second"] == pytest.approx(sum(s["lengths"]) / s["seconds"])
        assert f"step {r['step']}: train " in stdout
    # the steps draw different batches
    assert doc["steps"][0]["tokens"] != doc["steps"][1]["tokens"]


def test_memory_account_is_scale_py_s(tiny_run):
    doc, _ = tiny_run
    c = doc["setup"]["model_config"]
    for r in doc["steps"]:
        parts = scale.memory_account(c, world_size=1, micro_tokens=r["micro_tokens"], compute_bytes=2, ref_bytes=2,
                                     checkpointing=True, vllm_share=0, weight_sync=False)
        assert r["account_parts"] == pytest.approx(parts)
        assert r["account_tensors"] == pytest.approx(sum(parts.values()))
        phases, _ = scale.gpu_phases(c, world_size=1, micro_tokens=r["micro_tokens"])
        trainer = {k: v for k, v in phases["training"].items() if not k.startswith(("vLLM", "CUDA"))}
        assert r["account_training"] == pytest.approx([sum(v[0] for v in trainer.values()),
                                                       sum(v[1] for v in trainer.values())])
        assert r["account_tensors"] < r["account_training"][0]


def test_mfu_by_the_stated_formula(tiny_run):
    doc, _ = tiny_run
    setup = doc["setup"]
    params, layer = scale.param_count(setup["model_config"])
    assert setup["params"] == params and setup["layer_params"] == setup["model_config"]["num_hidden_layers"] * layer
    assert setup["extra_forwards"] == 1 and setup["checkpointing"] is True         # one update: the reference's pass
    assert setup["peak_flops"] == 989e12
    for r in doc["steps"]:
        flops = r["tokens"] * (6 * params + 2 * params * 1 + 2 * setup["layer_params"])
        assert r["flops"] == flops
        assert r["mfu"] == pytest.approx(flops / (r["seconds"] * 989e12), rel=1e-12)


def test_the_gather_streams_every_parameter_once(tiny_run):
    doc, _ = tiny_run
    c = doc["setup"]["model_config"]
    params, _ = scale.param_count(c)
    for r in doc["steps"]:
        assert r["gather_bytes"] == 2 * params                      # bf16, the tied embedding once
        names = 2 + c["num_hidden_layers"] * 11 + 1                 # embedding and its output-layer alias, layers, norm
        assert r["gather_tensors"] == names


def test_output_path_and_budget():
    probe = load_probe()
    assert probe.output_path("x/probe.json", {"OUT": "/o"}) == os.path.join("/o", "gpu_probe.json")
    assert probe.output_path("x/probe.json", {}) == "x/probe.json"
    assert probe.output_path(None, {}).endswith("gpu_probe.json")
    assert probe.next_step_fits(100, 50, 150) and not probe.next_step_fits(100, 51, 150)
    # the full shape is the official preset's, one rank of eight
    shape, official = probe.SHAPES["qwen3-4b"], probe.config.PRESETS["official"]
    lengths = (shape["max_prompt_len"], shape["max_response_len"], shape["max_tokens_per_micro_batch"])
    assert lengths == (512, 3072, 16384)
    assert shape["questions"] * 8 == official["questions_per_step"] and shape["group_size"] == official["group_size"]
    assert scale.param_count(shape["model"])[0] == 4_022_468_096
