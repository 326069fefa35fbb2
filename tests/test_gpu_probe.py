"""bench/gpu_probe.py at its tiny shape on a CPU: every phase in order, a record per step with every field, the
memory account as bench/scale.py computes it, the MFU by the stated formula, the weight gather over every
parameter once, the all-reduce's bandwidth, the sampling's figures, a model checkpoint loaded back bit for bit; the
per-pass windows of a step's memory; and bench/gpu_check.py's comparison of a resumed run with a straight one."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import scale  # noqa: E402


def load_bench(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
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


PHASES = ["all-reduce", "random model", "save_pretrained", "load the policy", "load the reference", "the engine",
          "step 1: train", "step 1: gather", "step 1: sync", "sample", "checkpoint save", "checkpoint load",
          "step 2: train", "step 2: gather", "step 2: sync"]
STEP_FIELDS = ("step", "seconds", "tokens", "response_tokens", "sequences", "passes", "micro_tokens", "flops", "mfu",
               "peak_flops", "mfu_measured", "measured_flops", "peak_allocated", "peak_reserved",
               "peak_allocated_reference", "peak_allocated_passes", "peak_allocated_optimizer", "pass_shapes",
               "pass_peaks", "account_tensors", "account_parts", "account_training", "account_optimizer",
               "gather_seconds", "gather_tensors", "gather_bytes", "sync_seconds", "grad_norm")


def test_every_phase_in_order_each_announced_and_summed_up(tiny_run):
    doc, stdout = tiny_run
    assert "error" not in doc and doc["skipped"] == []
    assert [p["name"] for p in doc["phases"]] == PHASES
    for p in doc["phases"]:
        assert p["seconds"] >= 0 and p["peak_allocated"] is None          # no CUDA allocator on a CPU
        assert f"] {p['name']} ...\n" in stdout and f"] {p['name']}: " in stdout
    assert stdout.index("] gpu_probe: importing torch") < stdout.index("] all-reduce ...")


def test_one_record_per_step_with_its_fields(tiny_run):
    doc, stdout = tiny_run
    assert [r["step"] for r in doc["steps"]] == [1, 2]
    probe = load_bench("gpu_probe")
    shape = probe.SHAPES["tiny"]
    for r in doc["steps"]:
        assert set(STEP_FIELDS) <= set(r)
        assert r["sequences"] == probe.VIEWS * shape["questions"] * shape["group_size"]
        assert 0 < r["micro_tokens"] <= shape["max_tokens_per_micro_batch"]
        assert r["micro_tokens"] == max(n * w for n, w in r["pass_shapes"]) and r["passes"] == len(r["pass_shapes"])
        assert r["tokens"] == sum(n * w for n, w in r["pass_shapes"])
        assert r["response_tokens"] < r["tokens"]
        assert r["padding_efficiency"] == pytest.approx(r["response_tokens"] / r["tokens"])
        assert r["seconds"] > 0 and r["gather_seconds"] > 0 and r["sync_seconds"] > 0
        assert f"step {r['step']}: train " in stdout
    assert doc["steps"][0]["tokens"] != doc["steps"][1]["tokens"]           # the steps draw different batches


def test_the_all_reduce_s_bandwidth(tiny_run):
    doc, _ = tiny_run
    (r,) = [p for p in doc["phases"] if p["name"] == "all-reduce"]
    assert r["backend"] == "gloo" and r["bytes"] == 2**20 and r["ops"] > 0
    assert r["loop_seconds"] >= 0.5
    assert r["algbw_GBps"] == pytest.approx(r["ops"] * r["bytes"] / r["loop_seconds"] / 1e9)
    assert r["busbw_GBps"] == 0                                            # a world of one sends nothing


def test_the_sampling_s_figures(tiny_run):
    doc, _ = tiny_run
    shape = load_bench("gpu_probe").SHAPES["tiny"]
    (s,) = [p for p in doc["phases"] if p["name"] == "sample"]
    assert s["responses"] == shape["sample_prompts"] * shape["sample_n"] and len(s["prompt_lengths"]) == 4
    assert all(shape["min_prompt_len"] <= n <= shape["max_prompt_len"] for n in s["prompt_lengths"])
    assert len(set(s["prompt_lengths"])) > 1                               # prompts of varied lengths
    assert all(1 <= n <= shape["sample_tokens"] for n in s["response_lengths"])
    assert s["logprobs"] == s["tokens"] > 0 and s["nonfinite_logprobs"] == 0
    assert s["tokens_per_second"] == pytest.approx(s["tokens"] / s["generate_seconds"])
    c = shape["model"]            # 8 rows x (longest prompt + 8) positions x layers x K and V x kv heads x head_dim x bf16
    assert s["kv_cache_whole_batch"] == 8 * (max(s["prompt_lengths"]) + 8) * c["num_hidden_layers"] * 2 * 2 * 16 * 2


def test_the_checkpoint_loads_back_every_tensor(tiny_run):
    doc, stdout = tiny_run
    (r,) = [p for p in doc["phases"] if p["name"] == "checkpoint load"]
    assert r["tensors"] == 1 + 2 * 11 + 1 and r["differ"] == []             # embedding, 2 layers of 11, norm
    assert "24 tensors, each equal bit for bit to the saved one" in stdout
    (saved,) = [p for p in doc["phases"] if p["name"] == "checkpoint save"]
    params = scale.param_count(doc["setup"]["model_config"])[0]
    assert saved["bytes"] > 4 * params                                     # the fp32 weights, and DCP's metadata


def test_memory_account_is_scale_py_s(tiny_run):
    doc, _ = tiny_run
    c = doc["setup"]["model_config"]
    params = scale.param_count(c)[0]
    for r in doc["steps"]:
        parts = scale.memory_account(c, world_size=1, micro_tokens=r["micro_tokens"], compute_bytes=2, ref_bytes=2,
                                     checkpointing=True, vllm_share=0, weight_sync=False)
        assert r["account_parts"] == pytest.approx(parts)
        assert r["account_tensors"] == pytest.approx(sum(parts.values()))
        phases, _ = scale.gpu_phases(c, world_size=1, micro_tokens=r["micro_tokens"])
        trainer = {k: v for k, v in phases["training"].items() if not k.startswith(("vLLM", "CUDA", "fragmentation"))}
        less = 0 if r["moments_exist"] else 8 * params                      # step 1's passes: no AdamW moments yet
        assert r["account_training"] == pytest.approx([sum(v[0] for v in trainer.values()) - less,
                                                       sum(v[1] for v in trainer.values()) - less])
        # AdamW's step: fp32 parameters, gradients, two moments and the sqrt of one, the bf16 reference
        assert r["account_optimizer"] == pytest.approx([(4 + 4 + 8 + 4 + 2) * params] * 2)
    assert [r["moments_exist"] for r in doc["steps"]] == [False, True]


def test_mfu_by_the_stated_formula(tiny_run):
    doc, _ = tiny_run
    setup = doc["setup"]
    params, layer = scale.param_count(setup["model_config"])
    assert setup["params"] == params and setup["layer_params"] == setup["model_config"]["num_hidden_layers"] * layer
    assert setup["extra_forwards"] == 1 and setup["checkpointing"] is True         # one update: the reference's pass
    assert setup["peak_flops"] == 989e12 and setup["measured_flops"] == 790e12
    for r in doc["steps"]:
        flops = r["tokens"] * (6 * params + 2 * params * 1 + 2 * setup["layer_params"])
        assert r["flops"] == flops
        assert r["mfu"] == pytest.approx(flops / (r["seconds"] * 989e12), rel=1e-12)
        assert r["mfu_measured"] == pytest.approx(flops / (r["seconds"] * 790e12), rel=1e-12)


def test_the_gather_streams_every_parameter_once(tiny_run):
    doc, _ = tiny_run
    c = doc["setup"]["model_config"]
    params, _ = scale.param_count(c)
    for r in doc["steps"]:
        assert r["gather_bytes"] == 2 * params                      # bf16, the tied embedding once
        names = 2 + c["num_hidden_layers"] * 11 + 1                 # embedding and its output-layer alias, layers, norm
        assert r["gather_tensors"] == names


def test_a_step_s_memory_windows_are_the_reference_each_pass_and_adamw(dist_world):
    """StepWindows opens a window at each forward of the policy: the reference's scoring, one per pass, AdamW's
    step. A stand-in allocator whose peak is the mark's count shows which window each peak came from."""
    import grpo
    from harness.sharding import shard
    from transformers import Qwen3Config, Qwen3ForCausalLM
    probe = load_bench("gpu_probe")

    class Counting:
        count = 0

        def mark(self):
            self.count += 1
            return self.count, None
    tiny = lambda: Qwen3ForCausalLM(Qwen3Config(**probe.TINY))
    policy, ref = shard(tiny()), shard(tiny().requires_grad_(False))
    optimizer = torch.optim.AdamW(policy.parameters())
    windows = probe.StepWindows(Counting(), policy, optimizer)
    shape = probe.SHAPES["tiny"]
    batch = probe.synthetic_batch(shape, 1, torch.device("cpu"))
    cfg = probe.step_config()
    cfg.max_tokens_per_micro_batch = shape["max_tokens_per_micro_batch"]
    passes = grpo.micro_batches_for_all_ranks(grpo.sequence_lengths(batch.mask), cfg)
    assert len(passes) > 1
    windows.start()                                                              # mark 1
    grpo.train_step(policy, ref, optimizer, batch, cfg, 1, order=torch.arange(len(batch)))
    peaks = windows.finish()
    assert peaks["reference scoring"] == 2                                       # closed by the first pass's forward
    assert peaks["passes"] == list(range(3, 3 + len(passes)))                    # the last closed by AdamW's step
    assert peaks["optimizer"] == 3 + len(passes)
    grpo.train_step(policy, ref, optimizer, batch, cfg, 1, order=torch.arange(len(batch)))
    assert windows.windows == [] and windows.finish()["passes"] == []           # no window outside start..finish


def test_line_fit_and_the_budget():
    probe = load_bench("gpu_probe")
    assert probe.line_fit([1, 2, 4], [5, 7, 11]) == pytest.approx((3, 2))
    assert probe.line_fit([3, 3], [1, 2]) is None
    assert probe.fits(0, 1e9) and not probe.fits(1e9, 1e9)
    assert probe.output_path("x/probe.json", {"OUT": "/o"}) == os.path.join("/o", "gpu_probe.json")
    assert probe.output_path("x/probe.json", {}) == "x/probe.json"
    assert probe.output_path(None, {}).endswith("gpu_probe.json")
    # the full shape is the official preset's, one rank of eight
    shape, official = probe.SHAPES["qwen3-4b"], probe.config.PRESETS["official"]
    lengths = (shape["max_prompt_len"], shape["max_response_len"], shape["max_tokens_per_micro_batch"])
    assert lengths == (512, 3072, 16384)
    assert shape["questions"] * 8 == official["questions_per_step"] and shape["group_size"] == official["group_size"]
    assert (shape["sample_prompts"], shape["sample_n"], shape["sample_tokens"]) == (32, 8, 256)
    assert scale.param_count(shape["model"])[0] == 4_022_468_096


def _run_folder(path, records, weight):
    from safetensors.torch import save_file
    os.makedirs(os.path.join(path, "final"))
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    save_file({"w": weight}, os.path.join(path, "final", "model.safetensors"))
    return str(path)


@pytest.mark.parametrize("change, verdict", [
    ({}, "bitwise"),
    ({"kl": 0.25 * (1 + 1e-8)}, "within tolerance"),                 # test_resume.py allows 1e-6, relative
    ({"kl": 0.25 * (1 + 1e-5)}, "differs"),
    ({"reward": 0.5}, "differs"),
    ({"t_train": 9.0}, "bitwise"),                                    # timings aside
    ({"weight": 1e-7}, "within tolerance"),
    ({"weight": 1e-5}, "differs"),
    ({"step_1": 0.0}, "bitwise"),                                     # the records up to the checkpoint's step aside
])
def test_gpu_check_compares_a_resumed_run_as_test_resume_does(tmp_path, change, verdict):
    check = load_bench("gpu_check")
    straight = [{"step": 1, "reward": 0.1, "kl": 0.5}, {"step": 2, "reward": 0.25, "kl": 0.25, "t_train": 1.0},
                {"step": 2, "eval_greedy": 0.5}]
    resumed = [dict(r) for r in straight]
    for key, value in change.items():
        if key == "step_1":
            resumed[0]["kl"] = value
        elif key != "weight":
            resumed[1][key] = value
    weight = torch.linspace(-1, 1, 10)
    a = _run_folder(tmp_path / "resumed", resumed, weight + change.get("weight", 0.0))
    b = _run_folder(tmp_path / "straight", straight, weight)
    result = check.compare_runs(a, b, after_step=1)
    assert result["verdict"] == verdict, result
    assert result["records"] == 2 and (result["differences"] == []) == (verdict != "differs")
