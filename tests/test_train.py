"""End to end: `train.py` runs of every method on the shipped classroom base model.

The runs are in-process, with `train_step` and `ema_update` wrapped to record what the loop
hands them (the KL anchor, the learning rate, the advantages, the EMA α) and the weights they
leave behind; the checks then say what tells the methods apart. Settings that cannot work, an
existing output folder and a non-finite loss are refused or stopped with a message.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field

import pytest
import torch

import config
import grpo
import rewards
import train
from harness import world
from harness.answers import majority_vote
from conftest import ROOT
from grpo import group_advantages
from harness import errors
from harness.errors import NonFiniteError
from harness.sharding import gather_full_weights
from teacher import ema_decay

# the methods by what their rows of rewards.METHOD_TABLE say
METHODS = list(rewards.METHODS)
TEACHER_METHODS = [name for name, m in rewards.METHODS.items() if m.teacher is not None]
EMA_TEACHERS = [name for name in TEACHER_METHODS if name not in rewards.MORE_SETTINGS]    # restrain's is frozen
TWO_VIEW = [name for name, m in rewards.METHODS.items() if m.views == "both"]
ANSWER_FREE = [name for name, m in rewards.METHODS.items() if m.labels is None]
PAIRS, G, STEPS, EVAL_LIMIT = 8, 4, 2, 16
SHORT = ["--steps", str(STEPS), "--questions_per_step", str(PAIRS), "--group_size", str(G),
         "--eval_limit", str(EVAL_LIMIT), "--eval_every", "2"]


def _clone(model):
    return {name: t.detach().clone() for name, t in gather_full_weights(model)}


@dataclass
class Run:
    out: str
    lines: list
    steps: list = field(default_factory=list)      # per train_step call: what it was given and left
    emas: list = field(default_factory=list)       # per ema_update call
    error: Exception = None                        # what stopped the run, if anything

    @property
    def step_records(self):
        return [x for x in self.lines if "reward" in x]

    @property
    def eval_records(self):
        return [x for x in self.lines if "eval_acc" in x]


def run_in_process(out, method, *extra):
    """train.main with its train_step and ema_update recording their arguments; an exception
    that stops the run is kept in `error`."""
    run = Run(str(out), [])
    real_step, real_ema = grpo.train_step, train.ema_update

    def train_step(policy, ref, optimizer, batch, cfg, world_size, **kwargs):
        call = {"policy": policy, "ref": ref, "lr": optimizer.param_groups[0]["lr"], "ref_weights": _clone(ref), "cfg": cfg,
                "input_ids": batch.input_ids.clone(), "mask": batch.mask.clone(),
                "advantages": batch.advantages.clone(), "weight": batch.weight.clone()}
        run.steps.append(call)
        call["stats"] = real_step(policy, ref, optimizer, batch, cfg, world_size, **kwargs)
        call["policy_after"] = _clone(policy)
        return call["stats"]

    def ema_update(teacher, policy, alpha):
        real_ema(teacher, policy, alpha)
        run.emas.append({"teacher": teacher, "policy": policy, "alpha": alpha, "teacher_after": _clone(teacher)})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpo, "train_step", train_step)
        mp.setattr(train, "ema_update", ema_update)
        try:
            train.main(["--method", method, "--out", str(out), *extra])
        except Exception as e:          # noqa: BLE001  (the test that made the run looks at it)
            run.error = e
            traceback.print_exc()         # shown if the test fails
    metrics = os.path.join(str(out), "metrics.jsonl")
    run.lines = [json.loads(x) for x in open(metrics).read().splitlines()] if os.path.exists(metrics) else []
    return run


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """Each method's run, made once: 2 steps of 8 questions (x 2 views for the two-view methods) x G=4, evaluations at
    steps 0
    and 2. Each writes over a stale run with --overwrite."""
    runs = {}

    def get(method):
        if method not in runs:
            out = tmp_path_factory.mktemp(method)
            (out / "metrics.jsonl").write_text('{"step": 99, "reward": 7}\n')
            (out / "final").mkdir()
            (out / "final" / "stale.txt").write_text("from an earlier run")
            replay = ["--replay", get("coreward1").out] if method == "matched_coin" else []   # coreward1's rewards
            runs[method] = run_in_process(out, method, *SHORT, "--overwrite", *replay)
            if runs[method].error is not None:
                raise runs[method].error
        return runs[method]
    return get


def _base_weights():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(world.base_model_dir(), dtype=torch.float32).state_dict()


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_and_logs_each_step(short_run, method):
    run = short_run(method)
    assert [x["step"] for x in run.step_records] == [1, 2]             # the stale step 99 is gone
    assert [x["step"] for x in run.eval_records] == [0, 2]
    assert len(run.steps) == STEPS
    lr = config.PRESETS["classroom"]["lr"]
    schedule = train.cosine_with_warmup(STEPS, config.PRESETS["classroom"]["warmup_ratio"])
    for record, call in zip(run.step_records, run.steps):
        assert record["responses"] == PAIRS * (2 if method in TWO_VIEW else 1) * G
        # the engine runs the trainer's current weights (float32 on both sides: ~1e-7), not the teacher's left
        # from the previous step's teacher rollout
        assert record["sampler_gap"] < 1e-5
        assert abs(record["sampler_ratio"] - 1) < 1e-5 and record["sampler_capped"] == 0   # π_old / π_sampler
        assert (record["label_acc"] is None) == (method in ANSWER_FREE)
        # the logged rate is the one this step's update used, and follows the schedule
        assert record["lr"] == call["lr"] == pytest.approx(lr * schedule(record["step"] - 1))
        assert record["grad_norm"] == call["stats"].grad_norm > 0
        assert ("ema_alpha" in record) == (method in TEACHER_METHODS)
        if method in ANSWER_FREE:
            assert record["reward"] > 0 if method == "self_certainty" else record["reward"] < 0
        elif method == "restrain":                                     # centred advantages, and penalties
            assert record["reward"] <= 0 and 0 <= record["label_acc"] <= 1
        else:
            assert 0 <= record["reward"] <= 1 and 0 <= record["label_acc"] <= 1
        if method == "matched_coin":                                   # coreward1's rewards, group by group
            assert record["group_rewards"] == short_run("coreward1").step_records[record["step"] - 1]["group_rewards"]
        if method == "gt":                                             # with gold labels, reward is accuracy
            assert record["reward"] == pytest.approx(record["rollout_acc"])


@pytest.mark.parametrize("method", METHODS)
def test_the_saved_model_is_the_trained_policy(short_run, method):
    from transformers import AutoModelForCausalLM
    run = short_run(method)
    final = AutoModelForCausalLM.from_pretrained(os.path.join(run.out, "final"), dtype=torch.float32).state_dict()
    trained, base = run.steps[-1]["policy_after"], _base_weights()
    assert sorted(final) == sorted(trained)
    for name in trained:
        assert torch.equal(final[name], trained[name]), name
    assert sum((final[k] - base[k]).abs().sum().item() for k in final) > 1e-3
    assert not os.path.exists(os.path.join(run.out, "final", "stale.txt"))


@pytest.mark.parametrize("method", EMA_TEACHERS)
def test_the_teacher_follows_its_ema_schedule_and_anchors_the_kl(short_run, method):
    run = short_run(method)
    # α = 1 - decay(s / T) after step s (the official code's weight); none after the last step
    alphas = [e["alpha"] for e in run.emas]
    classroom = config.PRESETS["classroom"]
    assert alphas == pytest.approx([0.00505]) == \
        [1 - ema_decay(s, STEPS, classroom["ema_start"], classroom["ema_end"]) for s in range(1, STEPS)]
    assert [x["ema_alpha"] for x in run.step_records] == alphas + [0.0]
    teacher = run.emas[0]["teacher"]
    assert all(e["teacher"] is teacher and e["policy"] is run.steps[0]["policy"] for e in run.emas)
    assert all(call["ref"] is teacher for call in run.steps)           # the KL anchor is the teacher
    # the teacher is the EMA of the policy after each step, starting from the base model
    expected = _base_weights()
    for call, ema in zip(run.steps, run.emas):
        assert all(torch.allclose(call["ref_weights"][k], expected[k], atol=1e-6) for k in expected)
        alpha = ema["alpha"]
        expected = {k: (1 - alpha) * v + alpha * call["policy_after"][k] for k, v in expected.items()}
        for k, v in ema["teacher_after"].items():
            assert torch.allclose(v, expected[k], atol=1e-6), k
    assert any(not torch.equal(run.steps[1]["ref_weights"][k], run.steps[0]["ref_weights"][k]) for k in expected)


@pytest.mark.parametrize("method", ["gt", "majority", "coreward1", "self_certainty", "entropy", "restrain"])
def test_other_methods_anchor_the_kl_to_the_frozen_start_model(short_run, method):
    run = short_run(method)
    base = _base_weights()
    assert run.emas == []
    for call in run.steps:
        assert call["ref"] is not call["policy"]
        assert all(torch.equal(call["ref_weights"][k], base[k]) for k in base)


@pytest.mark.parametrize("method", ANSWER_FREE)
def test_answer_free_rewards_from_the_naive_formula(short_run, method):
    """Step 1's advantages are those of the naive per-response reward of the base model (the
    policy before the first update): self-certainty rewards confidence, entropy punishes doubt."""
    from transformers import AutoModelForCausalLM
    run = short_run(method)
    call = run.steps[0]
    model = AutoModelForCausalLM.from_pretrained(world.base_model_dir(), dtype=torch.float32)
    with torch.no_grad():
        p = torch.softmax(model(input_ids=call["input_ids"]).logits[:, :-1].double(), -1)     # T = 1.0
    V = p.shape[-1]
    if method == "self_certainty":           # KL(U || p) = sum_v (1/V) log((1/V) / p_v)
        per_token = ((1 / V) * torch.log((1 / V) / p)).sum(-1)
    else:                                    # minus the entropy
        per_token = (p * p.log()).sum(-1)
    mask = call["mask"].double()
    rewards = (per_token * mask).sum(-1) / mask.sum(-1)
    expected = group_advantages(rewards.view(-1, G)).flatten()
    assert torch.allclose(call["advantages"].double(), expected, atol=1e-3)
    assert expected.abs().max() > 0.5


def test_training_evaluation_equals_eval_py(short_run, tmp_path):
    """eval.py on the saved model, and on the checkpoint of the last step, with its classroom
    defaults, gives the training run's last evaluation exactly: same prompts, same limit, the
    same per-question sampling seeds."""
    from harness import checkpoint
    import eval as evaluation
    run = short_run("coreward1")
    last = run.eval_records[-1]
    for i, model in enumerate((os.path.join(run.out, "final"), checkpoint.latest(run.out))):
        out = str(tmp_path / str(i))
        results = evaluation.main(["--model", model, "--limit", str(EVAL_LIMIT), "--out", out])["classroom"]
        assert results["n"] == EVAL_LIMIT
        assert (results["greedy"], results["avg"], results["maj"], results["boxed"]) == \
            pytest.approx((last["eval_greedy"], last["eval_acc"], last["eval_maj"], last["eval_boxed"]), abs=1e-12)
    assert checkpoint.latest(run.out).endswith(f"step_{STEPS}")


def test_a_checkpoint_becomes_the_saved_model(short_run, tmp_path):
    from harness import checkpoint
    from transformers import AutoModelForCausalLM
    run = short_run("coreward2")
    exported = checkpoint.to_hf(checkpoint.latest(run.out), str(tmp_path / "hf"))
    a = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(os.path.join(run.out, "final"), dtype=torch.float32).state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_keeps_the_models_end_tokens_and_evaluates_as_final(tmp_path, tiny_model_dir):
    """A model whose generation_config lists an end token beside the tokenizer's EOS (as Qwen3's lists <|im_end|>): its
    checkpoint's model folder (to_hf) ends responses at the same tokens as final/, and eval.py on the two, the same
    weights, gives identical results. The random model samples the extra end token often: without it, a response runs
    on (checkpoints saved only config.json, and to_hf derived a generation_config from it: the EOS alone). The run and
    the evaluations are processes of their own, as a user runs them."""
    from transformers import AutoTokenizer, GenerationConfig
    from harness import checkpoint
    from rollout import end_tokens
    model, run = tmp_path / "model", tmp_path / "run"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    ends = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("1")})
    GenerationConfig(eos_token_id=ends, bos_token_id=tokenizer.eos_token_id).save_pretrained(model)
    script = lambda name, *flags: subprocess.run([sys.executable, os.path.join(ROOT, name), *flags], cwd=ROOT,
                                                 capture_output=True, text=True)
    done = script("train.py", "--method", "gt", *SHORT, "--model", str(model), "--preset", "classroom",
                  "--save_every", "2", "--eval_every", "100", "--out", str(run))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    final, step = str(run / "final"), checkpoint.latest(str(run))
    exported = checkpoint.to_hf(step, str(tmp_path / "exported"))
    assert end_tokens(exported, tokenizer) == end_tokens(final, tokenizer) == ends and len(ends) == 2
    results = []
    for i, m in enumerate((final, step)):
        done = script("eval.py", "--model", m, "--limit", "16", "--k", "4", "--out", str(tmp_path / f"eval{i}"))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        results.append(json.load(open(tmp_path / f"eval{i}" / "results.json"))["results"]["classroom"])
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    assert drop(results[0]) == drop(results[1]) and results[0]["boxed"] < 1


def test_an_engine_that_does_not_run_the_trainers_weights_stops_the_run(tmp_path, monkeypatch, tiny_model_dir):
    """The weight-sync guard (--max_sampler_gap): a stand-in engine that starts from other weights
    (a random model) and whose load does nothing samples what the trainer's policy would not; the
    run stops at the first step, with the message, before any checkpoint or model is saved."""
    real = train.make_engine

    def stale_engine(backend, model_dir, *args, **kwargs):
        return _skipping(real(backend, tiny_model_dir, *args, **kwargs))
    monkeypatch.setattr(train, "make_engine", stale_engine)
    out = tmp_path / "stale"
    run = run_in_process(out, "gt", *SHORT, "--backend", "hf", "--save_every", "1")
    assert isinstance(run.error, RuntimeError)
    assert str(run.error).startswith("step 1: the rollout engine's log-probs differ from the trainer's by")
    assert "the engine is not running the trainer's weights" in str(run.error)
    assert [x["step"] for x in run.step_records] == [1] and run.step_records[0]["sampler_gap"] > 0.1
    assert not (out / "final").exists() and not (out / "checkpoints").exists()


def test_a_sync_that_drops_a_tensor_stops_the_run_within_that_step(tmp_path, monkeypatch):
    """One tensor left out of every weight sync into vLLM: the engine's check sees it at the first step's
    sync, before anything samples from the engine, and the run stops with a message that says what to do;
    no checkpoint or model is saved."""
    real = train.make_engine

    def dropping_engine(*args, **kwargs):
        engine = real(*args, **kwargs)
        load = engine.load_weights
        engine.load_weights = lambda named: load((n, t) for n, t in named if n != "model.layers.0.mlp.up_proj.weight")
        return engine
    monkeypatch.setattr(train, "make_engine", dropping_engine)
    out = tmp_path / "dropped"
    run = run_in_process(out, "gt", *SHORT, "--save_every", "1")
    assert type(run.error).__name__ == "WeightSyncError"
    assert "the weight sync into the rollout engine failed on rank 0: 1 of the model's" in str(run.error)
    assert "model.layers.0.mlp.up_proj.weight" in str(run.error) and "Check that the trainer" in str(run.error)
    assert len(run.steps) == 1 and run.step_records == []
    assert not (out / "final").exists() and not (out / "checkpoints").exists()


@pytest.mark.vllm
def test_a_frozen_o_proj_in_vllm_stops_the_run_at_step_1_in_one_line(tmp_path):
    """vLLM's CPU engine repacks its linear layers for its kernels; an engine whose loads leave every o_proj as it
    was (tests/train_frozen_o_proj.py), which only warns, is read through those kernels after step 1's sync: the
    run stops there, before the step's record, with one line that names the layers and no traceback, exit status
    errors.GUARD_STOP, and saves nothing."""
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "train_frozen_o_proj.py"), "--method", "gt",
                          "--steps", "3", "--questions_per_step", "8", "--group_size", "4", "--eval_limit", "1",
                          "--eval_every", "100", "--eval_k", "0", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == errors.GUARD_STOP, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and res.stderr.count("train.py: stopped: ") == 1, res.stderr[-3000:]
    assert "train.py: stopped: the weight sync into the rollout engine failed on rank 0: the engine's " \
           "['model.layers.0.self_attn.o_proj.weight', 'model.layers.1.self_attn.o_proj.weight', " \
           "'model.layers.2.self_attn.o_proj.weight'] differ from the trainer's after the load. The engine would " \
           "sample from other weights than the trainer's" in res.stderr, res.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0] and "reward" not in records[0]          # the evaluation at step 0
    assert not (out / "final").exists() and not (out / "checkpoints").exists()


def test_groups_out_of_their_prompts_order_stop_the_step(tmp_path, monkeypatch):
    """rewards.twin pairs group i with group i + P: the step checks that the engine returned the groups in the order
    of their prompts (originals, then their rephrasings) before anything is labelled."""
    real = train.make_engine

    def shuffling_engine(*args, **kwargs):
        engine = real(*args, **kwargs)
        generate = engine.generate
        engine.generate = lambda *a, **k: generate(*a, **k)[::-1]
        return engine
    monkeypatch.setattr(train, "make_engine", shuffling_engine)
    run = run_in_process(tmp_path / "shuffled", "coreward1", *SHORT, "--backend", "hf", "--eval_limit", "1")
    assert isinstance(run.error, errors.GroupOrderError) and "the policy: the group for question" in str(run.error)
    assert "returned its groups out of the order of their prompts" in str(run.error)
    assert run.steps == []


def test_the_teachers_groups_out_of_order_stop_the_step_too(tmp_path, monkeypatch):
    real = train.teacher_rollout
    monkeypatch.setattr(train, "teacher_rollout", lambda *args: real(*args)[::-1])
    run = run_in_process(tmp_path / "shuffled", "coreward2", *SHORT, "--backend", "hf", "--eval_limit", "1")
    assert isinstance(run.error, errors.GroupOrderError) and "the teacher: the group for question" in str(run.error)
    assert run.steps == []


def test_the_group_order_check_holds_under_python_O():
    """python -O drops `assert`: the check is an exception of its own, and names the question and view."""
    program = """
import types, train
from harness import errors
sample = lambda prompt: types.SimpleNamespace(prompt_ids=prompt)
prompts, ids = [[1, 2], [3, 4], [5, 6], [7, 8]], [(10, 0), (11, 0), (10, 1), (11, 1)]
groups = [[sample(p)] * 2 for p in prompts]
train.check_groups(groups, prompts, ids, 2, "the policy")
try:
    train.check_groups(groups[:2] + groups[2:][::-1], prompts, ids, 2, "the policy")
except errors.GroupOrderError as e:
    print("stopped:", e)
"""
    out = subprocess.run([sys.executable, "-O", "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "stopped: the policy: the group for question 10 (its rephrasing) holds 2 responses" in out.stdout


def test_eval_k_0_evaluates_greedily_only(tmp_path, capsys):
    """--eval_k 0 (the official preset's evaluation): the greedy accuracy, and no avg@k or maj@k."""
    run = run_in_process(tmp_path / "run", "gt", *SHORT, "--eval_k", "0")
    assert run.error is None
    assert [(r["eval_acc"], r["eval_maj"]) for r in run.eval_records] == [(None, None)] * 2
    assert all(0 <= r["eval_greedy"] <= 1 for r in run.eval_records)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval @ step")]
    assert len(printed) == 2 and all(re.fullmatch(r"eval @ step \d: greedy \d\.\d{3}", line) for line in printed)


def test_a_rollout_correction_reaches_the_step_and_the_run_says_so(tmp_path, capsys):
    """--rollout_correction mis --rollout_correction_cap 3: the step takes them, config.json keeps them, the summary
    line names the departure, and the record logs the ratio (1 here: fp32 on both sides) and no token above 3."""
    run = run_in_process(tmp_path / "run", "gt", *SHORT, "--steps", "1", "--rollout_correction", "mis",
                         "--rollout_correction_cap", "3")
    assert run.error is None
    assert (run.steps[0]["cfg"].rollout_correction, run.steps[0]["cfg"].rollout_correction_cap) == ("mis", 3.0)
    saved = json.load(open(tmp_path / "run" / "config.json"))
    assert (saved["rollout_correction"], saved["rollout_correction_cap"]) == ("mis", 3.0)
    assert ", float32, rollout correction mis (cap 3.0); " in capsys.readouterr().out
    record = run.step_records[0]
    assert abs(record["sampler_ratio"] - 1) < 1e-5 and record["sampler_capped"] == 0


LOSS_ROWS = [("policy_loss", name) for name in grpo.POLICY_LOSSES if name != "clip"] + \
    [("loss_agg", name) for name in grpo.LOSS_AGGS if name != "view_token_mean"] + \
    [("advantage_std", name) for name in grpo.ADVANTAGE_STDS if name not in ("group", "given")] + \
    [("overlong", name) for name in grpo.OVERLONGS if name != "none"] + \
    [("clip_high", "0.28"), ("entropy_coef", "0.01"), ("rephrase_noise", "0.5")]


@pytest.mark.parametrize("flag,value", LOSS_ROWS, ids=[f"{f}={v}" for f, v in LOSS_ROWS])
def test_each_row_of_the_loss_family_runs_two_steps_and_logs_its_loss(tmp_path, capsys, flag, value):
    """Each row of each table of the loss family (and clip-higher, the entropy bonus, the rephrasing control) runs 2
    steps of coreward1: the step takes it, the summary line names it, and each step's record logs the loss, its parts
    adding up to it, the clip fractions and each view's figures."""
    run = run_in_process(tmp_path / "run", "coreward1", *SHORT, "--backend", "hf", "--eval_limit", "1",
                         f"--{flag}", value)
    assert run.error is None, run.error
    if hasattr(run.steps[0]["cfg"], flag):      # the loss's settings; the others act on the rewards or the data
        assert str(getattr(run.steps[0]["cfg"], flag)) == value
    assert str(json.load(open(tmp_path / "run" / "config.json"))[flag]) == value
    printed = capsys.readouterr().out
    assert f", --{flag} {value}" in printed
    assert ("--rephrase_noise 0.5: 750 of the 1500 training pairs carry another question's rephrasing" in printed) \
        == (flag == "rephrase_noise")
    assert len(run.step_records) == STEPS
    for r in run.step_records:
        assert math.isfinite(r["loss"]) and r["loss"] == pytest.approx(r["loss_policy"] + r["loss_kl"] +
                                                                       r["loss_entropy"], abs=1e-6)
        assert r["clip_frac"] == pytest.approx(r["clip_frac_low"] + r["clip_frac_high"])
        for view in ("original", "rephrased"):
            assert r[f"{view}/label_share"] == 1 and 0 <= r[f"{view}/label_acc"] <= 1
        assert r["loss_policy"] == pytest.approx(r["original/loss_policy"] + r["rephrased/loss_policy"], abs=1e-6)
        assert (r["loss_entropy"] != 0) == (flag == "entropy_coef")
        assert (r["overlong_penalty"] <= 0) and (r["overlong_penalty"] == 0 or value == "soft")


def test_the_sampler_gap_warns_on_a_jump_and_stops_only_past_the_ceiling():
    """The first 3 steps set the baseline; a gap above --sampler_gap_factor times it warns, again only once it has
    doubled since the last warning; only a gap past the ceiling (or NaN) stops the run."""
    from harness.watches import SAMPLER_GAP_CEILING, SamplerGapWatch
    watch = SamplerGapWatch(ceiling=0.5, factor=5.0)
    assert [watch.check(step, {"sampler_gap": gap}) for step, gap in enumerate([0.02, 0.04, 0.03], 1)] == [None] * 3
    assert watch.baseline == pytest.approx(0.03) and SamplerGapWatch(0.5, 5.0, watch.first).baseline == watch.baseline
    assert watch.check(4, {"sampler_gap": 0.149}) is None                      # under 5 x 0.03
    warning = watch.check(5, {"sampler_gap": 0.151})
    assert warning.startswith("step 5: the sampler gap is 0.151 per token, 5.0x the mean")
    assert watch.check(6, {"sampler_gap": 0.2}) is None                        # not yet twice 0.151
    assert "step 7: the sampler gap is 0.31 per token" in watch.check(7, {"sampler_gap": 0.31})
    assert watch.check(8, {"sampler_gap": 0.5}) is None                        # the ceiling itself: under 2 x 0.31
    with pytest.raises(RuntimeError, match=r"step 9: .* by 0.501 per token \(> 0.5, the ceiling"):
        watch.check(9, {"sampler_gap": 0.501})
    with pytest.raises(RuntimeError, match=r"step 1: .* by 0.3 per token"):   # the first steps have the ceiling too
        SamplerGapWatch(ceiling=0.25, factor=5.0).check(1, {"sampler_gap": 0.3})
    with pytest.raises(RuntimeError, match="by nan"):
        SamplerGapWatch(ceiling=0.25, factor=5.0, first=[1e-7] * 3).check(9, {"sampler_gap": float("nan")})
    assert SAMPLER_GAP_CEILING["float32"] < SAMPLER_GAP_CEILING["bfloat16"]


def _skipping(engine):
    """An engine whose loads take nothing and say all is well: every rank gathers, none loads."""
    engine.load_weights = lambda named_tensors: [None for _ in named_tensors] and None
    return engine


def _leaving_out_layer_0(engine):
    """An engine whose loads copy every tensor but layer 0's, and say all is well."""
    def load(named_tensors):
        params = dict(engine.model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if not name.startswith("model.layers.0."):
                    params[name].copy_(tensor)
    engine.load_weights = load
    return engine


@pytest.mark.parametrize("fault", [_skipping, _leaving_out_layer_0], ids=["skipped", "partial"])
def test_a_skipped_or_partial_sync_stops_a_bf16_run_past_the_ceiling(tmp_path, monkeypatch, fault):
    """bf16 (the seed run's precision), transformers' engine, at lr 1e-3, where the first step moves the bf16 weights:
    an engine left on its start weights (or on its start layer 0) while the policy moves samples from other weights,
    and the gap passes bf16's ceiling within a few steps; the run stops with the message, and no model is saved. The
    same runs' gaps stay under the ceiling while the sync works (study/bf16)."""
    real = train.make_engine
    monkeypatch.setattr(train, "make_engine", lambda *args, **kwargs: fault(real(*args, **kwargs)))
    out = tmp_path / "run"
    run = run_in_process(out, "gt", "--dtype", "bfloat16", "--backend", "hf", "--lr", "1e-3", "--steps", "10",
                         "--questions_per_step", "8", "--group_size", "4", "--eval_limit", "1", "--eval_every", "100",
                         "--eval_k", "0", "--save_every", "0")
    assert isinstance(run.error, RuntimeError), run.error
    assert re.match(r"step \d+: the rollout engine's log-probs differ from the trainer's by .* \(> 0.25, the ceiling",
                    str(run.error))
    gaps = [x["sampler_gap"] for x in run.step_records]
    assert len(gaps) < 10 and gaps[-1] > 0.25 and all(g <= 0.25 for g in gaps[:-1]) and gaps[0] < 0.01
    assert not (out / "final").exists()


def test_a_non_finite_loss_stops_the_run_before_the_weights_move(tmp_path, monkeypatch):
    """A NaN advantage at step 2: the run stops with a message before the optimizer step; the
    policy keeps its step-1 weights, and no model is saved."""
    real, calls = grpo.group_advantages, []

    def nan_at_step_2(rewards, **kwargs):
        calls.append(rewards)
        advantages = real(rewards, **kwargs)
        if len(calls) == 2:
            advantages[0, 0] = float("nan")
        return advantages
    monkeypatch.setattr(grpo, "group_advantages", nan_at_step_2)
    out = tmp_path / "nan"
    run = run_in_process(out, "coreward1", *SHORT, "--backend", "hf")
    assert isinstance(run.error, NonFiniteError)
    assert str(run.error).startswith("step 2: update 1 of 1: 1 non-finite loss(es)")
    assert "not applied" in str(run.error)
    assert [x["step"] for x in run.step_records] == [1]
    assert not (out / "final").exists()
    now = _clone(run.steps[-1]["policy"])
    for name, value in run.steps[0]["policy_after"].items():
        assert torch.equal(now[name], value) and value.isfinite().all(), name


def test_an_existing_run_is_not_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "final").mkdir()
    with pytest.raises(FileExistsError,
                       match=r"already holds a run \(metrics.jsonl, final\); pass --resume to continue it, "
                             r"--overwrite"):
        train.main(["--method", "gt", "--out", str(tmp_path)])
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"



def test_the_run_refuses_bad_settings_before_any_compute(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "init_distributed", lambda *a: pytest.fail("started a process group"))
    with pytest.raises(ValueError, match="--group_size 1 must be at least 2"):
        train.main(["--method", "coreward1", "--group_size", "1", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_cosine_schedule_with_warmup_by_hand():
    f = train.cosine_with_warmup(10, 0.3)          # warm-up over 3 steps, then 7 steps of cosine
    assert [f(s) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    assert f(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert f(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 6 / 7)))
    assert f(10) == pytest.approx(0.0)
    g = train.cosine_with_warmup(2, 0.1)           # at least one warm-up step
    assert [g(0), g(1)] == [1.0, 1.0]



def test_prompt_limit_too_small_is_refused(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "coreward1", "--max_prompt_len",
                          "10", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "pairs have a prompt longer than --max_prompt_len 10" in res.stderr



class FakeWandb:
    """A stand-in for the wandb module: records init's arguments and every log call. It has a module's __spec__, which
    importlib.util.find_spec reads of a module already imported (vLLM's first import asks for wandb)."""
    def __init__(self):
        import importlib.machinery
        self.inits, self.logged = [], []
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(self, project, id, resume, config):
        self.inits.append({"project": project, "id": id, "resume": resume, "config": config})
        return self

    def log(self, record, step):
        self.logged.append((step, dict(record)))

    def finish(self):
        pass


def test_wandb_logs_what_metrics_jsonl_holds_and_a_resumed_run_continues_its_run(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = tmp_path / "run"
    run = run_in_process(out, "majority", *SHORT, "--steps", "3", "--save_every", "2", "--wandb", "proj")
    assert run.error is None
    assert fake.inits[0]["project"] == "proj" and fake.inits[0]["config"]["method"] == "majority"
    assert [record for _, record in fake.logged] == run.lines               # every record, the same keys
    assert [step for step, _ in fake.logged] == [record["step"] for record in run.lines]
    run_id = fake.inits[0]["id"]
    resumed = run_in_process(out, "majority", "--resume", os.path.join(str(out), "checkpoints", "step_2"))
    assert resumed.error is None
    assert fake.inits[1]["id"] == run_id and fake.inits[1]["resume"] == "allow"
    assert [step for step, record in fake.logged[len(run.lines):] if "reward" in record] == [3]



@pytest.mark.vllm
def test_a_default_run_prints_no_vllm_info_lines(shared_folder):
    """vLLM's INFO lines (one set per weight load) are off unless VLLM_LOGGING_LEVEL says otherwise: the console of a
    4-step run, started without it (test_resume's uninterrupted run, shared with its tests)."""
    from test_resume import uninterrupted_run
    output = open(uninterrupted_run(shared_folder, "coreward1", 1) + ".log").read()
    assert "eval @ step 2" in output
    assert not [line for line in output.splitlines() if " INFO " in line]
    assert "Failed to load weights" not in output


def test_the_console_shows_the_programs_own_lines_and_the_run_folder_keeps_them(tmp_path):
    """No vLLM warning of vllm_setup.QUIET_VLLM, no FutureWarning, no load bars: the run's own summary line
    comes first on stdout, then its evaluations. run.log holds what the console showed, without the
    progress bar; samples.jsonl holds each evaluation's first --eval_samples questions' responses."""
    from harness.vllm_setup import QUIET_VLLM
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "coreward1", "--out", str(out),
                          *SHORT, "--eval_samples", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    output = res.stdout + res.stderr
    assert not [quiet for quiet in QUIET_VLLM if quiet in output]
    assert "FutureWarning" not in output and "Loading weights" not in output and "Loading safetensors" not in output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("coreward1 on classroom, preset classroom (no --model: the classroom world): 2 steps")
    assert lines[1].startswith("weight check: ")          # the engine's Readback.report (tests/test_rollout.py)
    assert lines[2].startswith("eval @ step 0: avg@8 ") and lines[3].startswith("eval @ step 2: avg@8 ")
    log = (out / "run.log").read_text()
    assert "\r" not in log and lines[0] in log and lines[3] in log and "saved " in log
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["question"], s["kind"]) for s in samples] == \
        [(step, q, kind) for step in (0, 2) for q in range(3) for kind in ("greedy", "sample")]
    from harness.answers import is_equiv
    assert all(s["prompt"].startswith("Question: ") and s["reward"] == float(is_equiv(s["answer"], s["gold"]))
               for s in samples)


def _prompts_of(call):
    """The prompt of each row of a step's batch, as token ids (the positions before the first response token)."""
    return [tuple(ids[:int(m.nonzero()[0]) + 1].tolist()) for ids, m in zip(call["input_ids"], call["mask"])]


def _encoded_pairs():
    """{original question's prompt ids: its rephrasing's prompt ids} over the classroom's training pairs."""
    from transformers import AutoTokenizer
    from harness import data
    encode = data.prompt_encoder(AutoTokenizer.from_pretrained(world.base_model_dir()), True)
    return {tuple(encode(p.original)): tuple(encode(p.rephrased)) for p in data.classroom_pairs("train")}


def _encoded_questions():
    pairs = _encoded_pairs()
    return set(pairs), set(pairs.values())


def test_coreward2_trains_on_the_original_questions_one_group_each(short_run):
    """As the official scripts: the student samples G responses to each of the step's questions,
    never their rephrasings, and takes one update per step."""
    run = short_run("coreward2")
    originals, rephrased = _encoded_questions()
    for call in run.steps:
        prompts = _prompts_of(call)
        assert len(prompts) == PAIRS * G and len(set(prompts)) == PAIRS        # 8 groups of G rows
        assert all(p in originals and p not in rephrased for p in prompts)



def _watch_the_teacher(monkeypatch):
    """(the prompts of each teacher rollout, the (teacher's answers, labels) of each labelling) of a run in process."""
    rollouts, labelled = [], []
    real_rollout, real_labels = train.teacher_rollout, train.label_groups

    def teacher_rollout(engine, teacher, prompt_ids, seeds, *args):
        rollouts.append(prompt_ids)
        return real_rollout(engine, teacher, prompt_ids, seeds, *args)

    def label_groups(method, answers, gold, teacher_answers=None, **kwargs):
        labels, voters = real_labels(method, answers, gold, teacher_answers, **kwargs)
        labelled.append((teacher_answers, labels))
        return labels, voters
    monkeypatch.setattr(train, "teacher_rollout", teacher_rollout)
    monkeypatch.setattr(train, "label_groups", label_groups)
    return rollouts, labelled


def test_coreward3_trains_on_both_views_each_labelled_by_the_teachers_vote_on_the_other(tmp_path, monkeypatch):
    """Co-rewarding-III as the authors' code runs it: the policy samples both views of each question, the teacher
    answers both views too (the same prompts, group for group), and the teacher's majority on q' labels the policy's
    responses to q, and its majority on q those to q'."""
    rollouts, labelled = _watch_the_teacher(monkeypatch)
    run = run_in_process(tmp_path / "c3", "coreward3", *SHORT, "--steps", "1")
    assert run.error is None
    originals, rephrased = _encoded_questions()
    prompts = _prompts_of(run.steps[0])
    assert len(prompts) == 2 * PAIRS * G
    assert all(p in originals for p in prompts[:PAIRS * G]) and all(p in rephrased for p in prompts[PAIRS * G:])
    rephrasing_of = _encoded_pairs()                              # group i + P is the other view of group i
    assert [rephrasing_of[prompts[i * G]] for i in range(PAIRS)] == [prompts[(PAIRS + i) * G] for i in range(PAIRS)]
    (teacher_prompts,) = rollouts
    assert [tuple(p) for p in teacher_prompts] == [prompts[i * G] for i in range(2 * PAIRS)]
    (teacher_answers, labels), = labelled
    votes = [majority_vote(group) for group in teacher_answers]
    assert labels == votes[PAIRS:] + votes[:PAIRS]
    assert run.step_records[0]["responses"] == 2 * PAIRS * G


def test_coreward2_rephrased_trains_on_the_originals_labelled_by_the_teachers_vote_on_the_rephrasings(tmp_path,
                                                                                                      monkeypatch):
    """The official Co-rewarding-II code with data.use_aug=True: the policy samples and trains on the original
    questions only; the teacher answers their rephrasings, group for group, and its majority on q' labels the
    policy's responses to q."""
    rollouts, labelled = _watch_the_teacher(monkeypatch)
    run = run_in_process(tmp_path / "c2r", "coreward2_rephrased", *SHORT, "--steps", "1")
    assert run.error is None
    originals, rephrased = _encoded_questions()
    prompts = _prompts_of(run.steps[0])
    assert len(prompts) == PAIRS * G and all(p in originals and p not in rephrased for p in prompts)
    (teacher_prompts,) = rollouts
    assert len(teacher_prompts) == PAIRS and all(tuple(p) in rephrased for p in teacher_prompts)
    rephrasing_of = _encoded_pairs()
    assert [rephrasing_of[prompts[i * G]] for i in range(PAIRS)] == [tuple(p) for p in teacher_prompts]
    (teacher_answers, labels), = labelled
    assert labels == [majority_vote(group) for group in teacher_answers]
    assert run.step_records[0]["responses"] == PAIRS * G



def test_a_new_method_is_one_row_of_the_table(tmp_path, monkeypatch):
    """A method that is one new row of rewards.METHOD_TABLE, with its own reward function, runs with no other
    edit: here the reward pays any boxed answer and the label is the group's own vote. The step rewards with
    the row's function (the mean reward is the share of answered responses) and labels with its source."""
    def boxed(answers, labels, voters):
        assert voters == answers                                  # "own vote": a group's own answers vote
        return [[float(a is not None) for a in group] for group in answers]
    monkeypatch.setitem(rewards.METHODS, "boxed", rewards.Method("boxed", "own vote", "original", None, "start",
                                                                 None, boxed))
    run = run_in_process(tmp_path / "boxed", "boxed", *SHORT, "--steps", "1")
    assert run.error is None
    record = run.step_records[0]
    assert record["reward"] == pytest.approx(1 - record["no_answer"], abs=1e-12) and 0 < record["reward"] < 1
    assert record["label_acc"] is not None and record["responses"] == PAIRS * G


def test_views_both_gives_a_baseline_the_rephrasings(tmp_path):
    """--views both: each question and its rephrasing, two groups per question, as every method did
    before the views were a setting."""
    run = run_in_process(tmp_path / "both", "coreward2", *SHORT, "--steps", "1", "--views", "both")
    assert run.error is None
    originals, rephrased = _encoded_questions()
    prompts = _prompts_of(run.steps[0])
    assert len(prompts) == PAIRS * 2 * G and run.step_records[0]["responses"] == PAIRS * 2 * G
    half = len(prompts) // 2
    assert all(p in originals for p in prompts[:half]) and all(p in rephrased for p in prompts[half:])


def test_a_single_view_method_runs_on_a_question_set_without_rephrasings(tmp_path):
    """A JSONL file of questions and answers, no rephrasings: coreward2 trains on it; coreward1,
    which needs the rephrasings, is refused with a message."""
    from harness import data
    path = tmp_path / "questions.jsonl"
    with open(path, "w") as f:
        for p in data.classroom_pairs("train")[:40]:
            f.write(json.dumps({"problem": p.original, "answer": p.answer}) + "\n")
    flags = [*SHORT, "--steps", "1", "--data", str(path), "--max_prompt_len", "64"]
    run = run_in_process(tmp_path / "c2", "coreward2", *flags)
    assert run.error is None and run.step_records[0]["responses"] == PAIRS * G
    refused = run_in_process(tmp_path / "c1", "coreward1", *flags)
    assert isinstance(refused.error, ValueError) and "has no rephrased questions" in str(refused.error)


def test_a_crash_while_writing_the_final_model_leaves_no_final_folder(tmp_path, monkeypatch):
    """final/ is written as final.partial/ and renamed once on disk: a crash in between leaves no
    final/ that study/study.py would count as a finished run."""
    from harness import checkpoint
    real = checkpoint.fsync_files

    def crash_on_final(*paths):
        if any(str(p).endswith("final.partial") for p in paths):
            raise OSError("the machine went down")
        return real(*paths)
    monkeypatch.setattr(checkpoint, "fsync_files", crash_on_final)
    out = tmp_path / "run"
    run = run_in_process(out, "gt", *SHORT, "--steps", "1", "--save_every", "0")
    assert isinstance(run.error, OSError) and "the machine went down" in str(run.error)
    assert not (out / "final").exists() and (out / "final.partial" / "model.safetensors").exists()


def test_every_torch_load_reads_weights_only():
    """An unpickled checkpoint file can run code: every torch.load in the project says weights_only=True."""
    import ast
    files = [os.path.join(d, f) for d, _, names in os.walk(ROOT) for f in names
             if f.endswith(".py") and ".venv" not in d and "site-packages" not in d]
    loads = []
    for path in files:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                safe = any(k.arg == "weights_only" and ast.unparse(k.value) == "True" for k in node.keywords)
                loads.append((os.path.relpath(path, ROOT), node.lineno, safe))
    assert loads and all(safe for _, _, safe in loads), [x for x in loads if not x[2]]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A whole 2-step run, with its checkpoint of step 2 and its final/."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run = run_in_process(out, "gt", *SHORT, "--save_every", "2")
    assert run.error is None
    return out


def _contents(out):
    """Every file under `out` with its bytes, but the lock files (which name their latest holder)."""
    return {os.path.relpath(os.path.join(d, f), out): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(out) for f in files if not f.endswith(".lock")}


@pytest.mark.parametrize("bad", [["--data", "typo.parquet"], ["--model", "/nonexistent/model"],
                                 ["--eval_data", "typo"], ["--resume", "--overwrite"]])
def test_overwrite_with_a_mistake_in_the_inputs_deletes_nothing(finished_run, bad):
    """--overwrite removes the earlier run only once every input has been read and checked: a typo in
    --data, --model or --eval_data stops the run with a usage error and the earlier run is left whole."""
    before = _contents(finished_run)
    run = run_in_process(finished_run, "gt", *SHORT, "--overwrite", *bad)
    assert isinstance(run.error, errors.UsageError), run.error
    assert _contents(finished_run) == before


def test_resume_of_a_finished_run_says_so_and_changes_nothing(finished_run, capsys):
    before = _contents(finished_run)
    run = run_in_process(finished_run, "gt", "--resume")
    assert run.error is None
    assert "is finished (its checkpoint" in capsys.readouterr().out
    assert _contents(finished_run) == before


@pytest.mark.parametrize("launcher", ["python", "--ranks 2", "torchrun"])
def test_a_mistake_in_the_settings_is_one_line_and_status_2(tmp_path, launcher):
    """Under python, alone or starting 2 ranks (--ranks 2): the message alone on stderr, status 2, no traceback.
    Under torchrun with 2 ranks: the message once, before torchrun's own report of its workers' status 2, and
    no worker traceback."""
    import re
    from test_resume import _free_port
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--method", "gt", "--out", str(tmp_path / "run")]
    if launcher == "torchrun":
        command[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv_backend=c10d",
                        f"--rdzv_endpoint=127.0.0.1:{_free_port()}"]
    steps = [*command, "--steps", "0"] + (["--ranks", "2"] if launcher == "--ranks 2" else [])
    res = subprocess.run(steps, cwd=ROOT, capture_output=True, text=True, timeout=300)
    message = "train.py: error: --steps 0 must be at least 1; nothing was run"
    if launcher == "torchrun":
        assert res.stderr.count("train.py: error:") == 1 and message in res.stderr
        assert "RefusedSetting" not in res.stderr and re.search(r"exitcode\s*: 2", res.stderr)
    else:
        assert (res.returncode, res.stderr, res.stdout) == (2, message + "\n", "")
    assert not (tmp_path / "run").exists()
    if launcher == "--ranks 2":            # a mistake the ranks find (a missing data file): from one rank, status 2
        res = subprocess.run([*command, "--ranks", "2", "--data", str(tmp_path / "typo.parquet")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert (res.returncode, res.stdout) == (2, "")
        assert res.stderr == f"train.py: error: no parquet file '{tmp_path / 'typo.parquet'}'\n"


def test_a_failed_rank_is_its_traceback_and_one_line(tmp_path):
    """--ranks N (launch.launch_ranks): a rank's failure shows as that rank's own traceback and one line naming it,
    not as torchrun's report and traceback; the launcher exits with status 1. A rank's status 2 adds nothing."""
    script = tmp_path / "fails.py"
    script.write_text("import os, sys\nrank = int(os.environ['RANK'])\n"
                      "if sys.argv[1] == 'crash' and rank == 1:\n    raise RuntimeError('rank 1 broke')\n"
                      "if sys.argv[1] == 'usage':\n    sys.exit(2)\n")
    launch = [sys.executable, "-c", "import sys; from harness import launch; launch.launch_ranks(2, sys.argv[1], sys.argv[2:])", str(script)]
    crash = subprocess.run([*launch, "crash"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert crash.returncode == 1
    assert "RuntimeError: rank 1 broke" in crash.stderr and "ChildFailedError" not in crash.stderr
    last_line = crash.stderr.rstrip().splitlines()[-1]
    assert last_line == "fails.py: rank 1 stopped with exit status 1; its message is above"
    usage = subprocess.run([*launch, "usage"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (usage.returncode, usage.stderr) == (2, "")
    fine = subprocess.run([*launch, "fine"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (fine.returncode, fine.stderr) == (0, "")


def test_a_model_folder_a_run_wrote_keeps_its_preset_and_a_checkpoint_becomes_one(finished_run, tmp_path):
    """--model runs/X/final takes the preset of the run that wrote it (not the official one); one command
    turns a checkpoint into a model folder, which equals final/ for the last step's checkpoint."""
    from transformers import AutoModelForCausalLM
    final = str(finished_run / "final")
    args = config.parse_args(["--method", "gt", "--model", final])
    assert (args.preset, args.max_response_len) == ("classroom", 48) and "the run that wrote" in args.preset_reason
    assert config.parse_args(["--method", "gt", "--model", final, "--preset", "official"]).preset == "official"
    folder = tmp_path / "step_2"
    res = subprocess.run([sys.executable, "-m", "harness.checkpoint",
                          str(finished_run / "checkpoints" / "step_2"), str(folder)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    a = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert config.preset_of(str(folder))[0] == "classroom"
    assert config.preset_of(world.base_model_dir())[0] == "official"


def test_the_zero_variance_filter_gives_the_groups_without_signal_no_weight(tmp_path):
    """--group_filter zero_variance without a refill: the rows of each group whose rewards are all equal (zero
    advantages) get loss weight 0, every other row 1, and groups_dropped is their share, zero_variance's; with none
    every weight is 1."""
    for group_filter in ("zero_variance", "none"):
        run = run_in_process(tmp_path / group_filter, "coreward1", *SHORT, "--steps", "1", "--group_filter",
                             group_filter, "--refill_rounds", "0")
        assert run.error is None
        (call,), (record,) = run.steps, run.step_records
        flat = (call["advantages"] == 0).view(-1, G).all(-1)                          # [groups] no signal
        kept = call["weight"].view(-1, G, call["weight"].shape[-1]).amax((1, 2)) > 0   # [groups] any weight
        if group_filter == "none":
            assert (call["weight"] == 1).all() and record["groups_dropped"] == 0
        else:
            assert 0 < flat.sum() < len(flat) and (kept == ~flat).all()
            assert record["groups_dropped"] == record["zero_variance"] == flat.float().mean().item()


REFILL = [*SHORT, "--backend", "hf", "--eval_limit", "1", "--group_filter", "zero_variance"]


def test_the_refill_samples_more_questions_until_each_has_a_signal(tmp_path, monkeypatch):
    """gt at G=4 from the classroom start: about 4 in 10 of its groups are all wrong. The first step takes more rounds
    of 8 questions (seeded: each round's requests differ) until it holds 8 questions with a signal, and trains on
    those: every group has non-zero advantages and weight 1, 8 x 4 rows."""
    asked = []
    real = train.sample_and_reward
    monkeypatch.setattr(train, "sample_and_reward", lambda *a: asked.append(a[3]) or real(*a))
    run = run_in_process(tmp_path / "run", "gt", *REFILL, "--steps", "1")
    assert run.error is None, run.error
    (call,), (record,) = run.steps, run.step_records
    assert record["rounds"] == len(asked) >= 2 and record["groups_dropped"] == 0
    assert len(set(sum(asked, []))) == PAIRS * len(asked)             # each round, other questions
    assert len(call["advantages"]) == PAIRS * G and (call["weight"] == 1).all()
    assert not (call["advantages"] == 0).view(-1, G).all(-1).any()


def test_when_the_refill_rounds_run_out_the_step_trains_on_what_it_has(tmp_path, capsys):
    """gt at G=2 with one refill round: two rounds of 8 questions hold fewer than 8 with a signal (most pairs of
    responses agree). The step says so in one line (in run.log too), trains on those and on enough others, at loss
    weight 0, to fill its 8 questions, and the run goes on."""
    run = run_in_process(tmp_path / "run", "gt", *REFILL, "--group_size", "2", "--refill_rounds", "1")
    assert run.error is None, run.error
    printed = capsys.readouterr().out
    spent = re.findall(r"step (\d): a rank is (\d) question\(s\) short of its 8 with a signal after 2 rounds "
                       r"\(--refill_rounds 1 spent\); it trains on those it has, the others at loss weight 0", printed)
    assert spent and all(r["rounds"] == 2 for r in run.step_records)
    assert spent[0][0] in open(tmp_path / "run" / "run.log").read()
    step, short = map(int, spent[0])
    call = run.steps[step - 1]
    dropped = (call["weight"].view(PAIRS, 2, -1).amax((1, 2)) == 0)
    assert len(call["advantages"]) == PAIRS * 2 and int(dropped.sum()) == short
    assert dropped[-short:].all()                                      # the questions with a signal first


def test_a_resume_across_refilled_steps_is_bit_identical(tmp_path):
    """3 steps of gt with refills, a checkpoint each step; the run resumed from its step-1 checkpoint (in a copy of its
    folder holding that checkpoint alone) takes the same rounds and ends with the same weights, bit for bit."""
    straight = run_in_process(tmp_path / "straight", "gt", *REFILL, "--steps", "3", "--save_every", "1",
                              "--keep_last", "0")
    assert straight.error is None and any(r["rounds"] > 1 for r in straight.step_records[1:])
    copy = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", copy, ignore=shutil.ignore_patterns("final", "step_2", "step_3"))
    resumed = run_in_process(copy, "gt", "--resume")
    assert resumed.error is None, resumed.error
    assert [r["rounds"] for r in resumed.step_records] == [r["rounds"] for r in straight.step_records]
    assert open(copy / "final" / "model.safetensors", "rb").read() == \
        open(tmp_path / "straight" / "final" / "model.safetensors", "rb").read()


def test_an_epochs_leftover_questions_are_left_out_and_the_next_epoch_shuffles_them_all():
    """10 questions at 4 a step: each epoch takes 8 different ones in 2 steps and leaves 2 out; the third step opens a
    new epoch, a new shuffle of all 10."""
    questions = train.Questions.shuffled(list(range(10)), seed=0)
    first = questions.take(4, 0, 1)[1] + questions.take(4, 0, 1)[1]
    order = list(questions.order)
    second = questions.take(4, 0, 1)[1] + questions.take(4, 0, 1)[1]
    assert len(set(first)) == len(set(second)) == 8
    assert set(order) == set(range(10)) and first == order[:8]
    assert questions.order != order and second == questions.order[:8]


def test_the_classroom_model_trains_on_a_jsonl_of_classroom_pairs_as_on_the_shipped_ones(tmp_path, capsys):
    """The prompt format follows the model: the classroom's pairs written to a JSONL of question, rephrasing and answer
    train step for step as `--data classroom` does, in the classroom's format, with no unknown token."""
    from harness import data
    pairs = data.classroom_pairs("train")
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"question": p.original, "rephrased": p.rephrased, "answer": p.answer}) + "\n"
                            for p in pairs))
    runs = [run_in_process(tmp_path / name, "coreward1", *SHORT, "--steps", "1", "--eval_limit", "1", *extra)
            for name, extra in (("shipped", ()), ("jsonl", ("--data", str(path))))]
    assert [run.error for run in runs] == [None, None]
    assert torch.equal(runs[0].steps[0]["input_ids"], runs[1].steps[0]["input_ids"])
    times = ("t_rollout", "t_train", "t_sync")
    records = [{k: v for k, v in run.step_records[0].items() if k not in times} for run in runs]
    assert records[0] == records[1]
    assert "unknown token" not in capsys.readouterr().out


GUARDS = {
    "sampler gap": ([], ["--max_sampler_gap", "1e-12"],
                    "train.py: stopped: step 1: the rollout engine's log-probs differ from the trainer's by "),
    "weight sync": (["import rollout", "rollout.HFEngine.load_weights = lambda self, tensors: [*tensors] and "
                     "'model.norm.weight was not taken'"], [],
                    "train.py: stopped: the weight sync into the rollout engine failed on rank 0: model.norm.weight "
                    "was not taken. The engine would sample from other weights than the trainer's"),
}


@pytest.mark.parametrize("guard", GUARDS)
def test_a_guards_stop_is_one_line_as_the_user_sees_it(tmp_path, guard):
    """A guard that stops the run (the sampler gap past its ceiling, here set below any gap; a weight sync the engine
    refuses) prints one line naming what happened, the cause and what to do, with no traceback, and exits with
    errors.GUARD_STOP."""
    patch, flags, line = GUARDS[guard]
    code = "; ".join(["import sys", f"sys.path.insert(0, {ROOT!r})", *patch, "import train",
                      "from harness import errors", "sys.exit(errors.exit_on_usage_error(train.main, 'train.py'))"])
    res = subprocess.run([sys.executable, "-c", code, "--method", "gt", *SHORT, "--backend", "hf", "--out",
                          str(tmp_path / "run"), *flags], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == errors.GUARD_STOP, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and res.stderr.count("train.py: stopped: ") == 1, res.stderr[-3000:]
    assert line in res.stderr, res.stderr[-3000:]
