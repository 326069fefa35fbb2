"""Evaluation: greedy, avg@k, maj@k, pass@k and the boxed share against hand-computed values, and the command's
outputs."""
import json
import math
import os

import pytest

import config
import eval as evaluation
from harness import checkpoint, world
from rollout import Sample


def _sample(text):
    return Sample(prompt_ids=[], token_ids=[], logprobs=[], text=text, finished=True)


class FakeEngine:
    """Fixed responses per prompt: `greedy` at temperature 0, `sampled` otherwise; records its calls."""
    def __init__(self, greedy, sampled):
        self.greedy, self.sampled, self.calls = greedy, sampled, []

    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        self.calls.append((n, temperature, max_tokens))
        source = self.greedy if temperature == 0 else self.sampled
        return [[_sample(t) for t in source[p[0]]][:n] for p in prompt_ids]

    def close(self):
        pass


class ConstantEngine(FakeEngine):
    """The same response to every prompt."""
    def __init__(self, text):
        super().__init__(greedy=None, sampled=None)
        self.text = text

    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        self.calls.append((n, temperature, max_tokens))
        return [[_sample(self.text)] * n for _ in prompt_ids]


# three questions, k = 4; prompt i is [i]
SAMPLING = dict(temperature=0.8, max_tokens=100, seed=0)
GOLD = ["5", "1/2", "7"]
GREEDY = [["\\boxed{5}"], ["so \\boxed{0.5}"], ["\\boxed{8}"]]
SAMPLED = [
    ["\\boxed{5}", "\\boxed{5.0}", "\\boxed{3}", "I give up"],          # 2/4 right; majority 5: right
    ["\\boxed{\\frac12}", "\\boxed{2}", "\\boxed{2}", "\\boxed{3}"],    # 1/4 right; majority 2: wrong
    ["\\boxed{8}", "\\boxed{7}", "\\boxed{8}", "no box"],               # 1/4 right; majority 8: wrong
]                                    # with the greedy ones, 13 of the 15 responses have a boxed answer


def test_counts_greedy_avg_and_maj_by_hand():
    engine = FakeEngine(GREEDY, SAMPLED)
    sums, _ = evaluation.eval_counts(engine, [[0], [1], [2]], GOLD, k=4, **SAMPLING)
    # pass@2 of 2 right of 4: 1 - C(2,2)/C(4,2) = 5/6; of 1 right of 4: 1 - C(3,2)/C(4,2) = 1/2. pass@4: any right
    assert sums == {"n": 3, "greedy": 2, "avg": pytest.approx(0.5 + 0.25 + 0.25), "maj": 1, "boxed": 13,
                    "pass": 3, "pass@1": pytest.approx(0.5 + 0.25 + 0.25),
                    "pass@2": pytest.approx(5 / 6 + 1 / 2 + 1 / 2), "pass@4": 3}
    assert engine.calls == [(1, 0.0, 100), (4, 0.8, 100)]
    acc = evaluation.accuracies(sums, k=4)
    assert acc == pytest.approx({"greedy": 2 / 3, "avg": 1 / 3, "maj": 1 / 3, "boxed": 13 / 15,
                                 "pass": 1.0, "pass@1": 1 / 3, "pass@2": 11 / 18, "pass@4": 1.0})


def test_k_0_is_greedy_only_as_the_official_validation():
    """--eval_k 0 (the official preset's): one greedy request, no sampled one; avg@k and maj@k are None."""
    engine = FakeEngine(GREEDY, SAMPLED)
    sums, _ = evaluation.eval_counts(engine, [[0], [1], [2]], GOLD, k=0, **SAMPLING)
    assert engine.calls == [(1, 0.0, 100)]
    assert evaluation.accuracies(sums, k=0) == {"greedy": pytest.approx(2 / 3), "avg": None, "maj": None,
                                                "boxed": 1.0}
    table = evaluation.markdown_table({"math500": {"n": 3, **evaluation.accuracies(sums, k=0)}}, k=0)
    assert table.splitlines()[-1] == "| math500 | 3 | 0.667 | – | – | 1.000 |"
    assert config.PRESETS["official"]["eval_k"] == 0


def test_sums_of_shares_add_up_to_the_whole():
    engine = FakeEngine(GREEDY, SAMPLED)
    whole, _ = evaluation.eval_counts(engine, [[0], [1], [2]], GOLD, k=4, **SAMPLING)
    parts = [evaluation.eval_counts(engine, [[i]], [GOLD[i]], k=4, **SAMPLING)[0] for i in range(3)]
    assert {key: sum(p[key] for p in parts) for key in whole} == pytest.approx(whole)


def test_markdown_table():
    """pass@1, 2, 4 and 8 after maj@8; at k = 0 none (test_k_0_is_greedy_only_as_the_official_validation)."""
    table = evaluation.markdown_table({"amc23": {"n": 40, "greedy": 0.125, "avg": 0.1, "maj": 0.15, "boxed": 0.9,
                                                 "pass": 0.45, "pass@1": 0.1, "pass@2": 0.18, "pass@4": 0.3,
                                                 "pass@8": 0.45}}, k=8)
    assert table.splitlines() == [
        "| benchmark | n | greedy | avg@8 | maj@8 | pass@1 | pass@2 | pass@4 | pass@8 | boxed |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| amc23 | 40 | 0.125 | 0.100 | 0.150 | 0.100 | 0.180 | 0.300 | 0.450 | 0.900 |"]


def defaults(args):
    return {flag: getattr(args, flag) for flag, *_ in evaluation.AS_IN_TRAINING}


def preset_values(preset, backend):
    """eval.py's flags as the preset's settings have them (`backend`: what auto chose here)."""
    values = {flag: config.PRESETS[preset][name] for flag, name, *_ in evaluation.AS_IN_TRAINING}
    return {**values, "benchmarks": values["benchmarks"].split(","), "backend": backend}


def test_the_defaults_are_the_settings_of_the_models_training(tmp_path):
    """The classroom base model, a classroom run's model folder or checkpoint: the classroom preset's settings, so that
    eval.py gives what training printed; any other model the official preset's (config.preset_of); --preset chooses,
    and a flag given wins."""
    backend = config.choose_backend("auto")[0]
    base = evaluation.parse_args(["--model", world.BASE_DIR])
    assert (base.preset, defaults(base)) == ("classroom", preset_values("classroom", backend))
    assert (base.benchmarks, base.k, base.temperature, base.max_tokens, base.dtype) == \
        (["classroom"], 8, 1.0, 48, "float32")
    step = tmp_path / "run" / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    (step / "trainer.pt").write_bytes(b"")
    (step / "config.json").write_text(json.dumps({"preset": "classroom"}))
    checkpoint.mark_model_folder(str(tmp_path), "classroom")                     # a run's final/
    for model in (str(step), str(tmp_path)):
        assert defaults(evaluation.parse_args(["--model", model])) == preset_values("classroom", backend)
    hub = evaluation.parse_args(["--model", "org/m"])
    assert (hub.preset, defaults(hub)) == ("official", preset_values("official", backend))
    assert (hub.benchmarks, hub.k, hub.temperature, hub.max_tokens, hub.dtype) == \
        (["math5000"], 0, 0.8, 3072, "bfloat16")
    given = evaluation.parse_args(["--model", "org/m", "--benchmarks", "math500,aime24", "--k", "4", "--seed", "3"])
    assert (given.benchmarks, given.k, given.seed, given.temperature) == (["math500", "aime24"], 4, 3, 0.8)
    assert defaults(evaluation.parse_args(["--model", "org/m", "--preset", "classroom"])) == \
        preset_values("classroom", backend)


def test_the_classroom_is_evaluated_in_float32_on_any_device(monkeypatch):
    """The dtype is the preset's, as in training, not the device's: on a GPU the classroom model's evaluation runs in
    float32, as its training's did; --dtype chooses."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert evaluation.parse_args(["--model", world.BASE_DIR]).dtype == config.PRESETS["classroom"]["dtype"] == "float32"
    assert evaluation.parse_args(["--model", "org/m"]).dtype == config.PRESETS["official"]["dtype"] == "bfloat16"
    assert evaluation.parse_args(["--model", world.BASE_DIR, "--dtype", "bfloat16"]).dtype == "bfloat16"


def test_the_command_writes_the_table_and_json(tmp_path, tiny_model_dir, monkeypatch):
    """amc23's first three answers are 27, 36, 45; an engine that always says 27 gets 1/3."""
    import rollout
    engine = ConstantEngine("\\boxed{27}")
    monkeypatch.setattr(rollout, "make_engine", lambda *args, **kwargs: engine)
    evaluation.main(["--model", tiny_model_dir, "--benchmarks", "amc23", "--limit", "3", "--k", "2",
                     "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["results"]["amc23"]["n"] == 3
    assert result["results"]["amc23"]["avg"] == pytest.approx(1 / 3)
    # k = 2: pass@1 and pass@2, each 1 on the first question (both samples right) and 0 on the others
    assert [result["results"]["amc23"][key] for key in ("pass", "pass@1", "pass@2")] == pytest.approx([1 / 3] * 3)
    assert (result["preset"], result["temperature"], result["max_tokens"]) == ("official", 0.8, 3072)
    assert "| amc23 | 3 | 0.333 | 0.333 | 0.333 | 0.333 | 0.333 | 1.000 |" in (tmp_path / "results.md").read_text()
    assert engine.calls == [(1, 0.0, 3072), (2, 0.8, 3072)]


def test_benchmark_prompts_drop_and_count_long_questions(tiny_model_dir, capsys):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts, gold = evaluation.benchmark_prompts(tok, "aime24", limit=10)
    limit = sorted(map(len, prompts))[4]
    kept, kept_gold = evaluation.benchmark_prompts(tok, "aime24", limit=10, max_prompt_len=limit)
    assert kept == [p for p in prompts if len(p) <= limit] and len(kept) == len(kept_gold) >= 5
    assert f"dropped {10 - len(kept)} of 10 aime24 questions" in capsys.readouterr().out


def test_the_paper_settings_and_table():
    """--paper: MATH500, GSM8K and AMC, k 8 at temperature 0.8 and 3,072 tokens; each benchmark's
    avg@8 in percent beside the paper's Table 8 row for the seed model."""
    args = evaluation.parse_args(["--model", "m", "--paper"])
    assert (args.benchmarks, args.k, args.temperature, args.max_tokens) == (["math500", "gsm8k", "amc"], 8, 0.8, 3072)
    assert evaluation.parse_args(["--model", "m", "--paper", "--temperature", "0.6"]).temperature == 0.6
    with pytest.raises(SystemExit):            # no --model: a usage error, not a minute on the base model
        evaluation.parse_args([])
    lines = evaluation.paper_lines({"math500": {"avg": 0.5}, "gsm8k": {"avg": 0.25}, "amc": {"avg": 0.125}})
    assert "| MATH500 pass@1 | 50.00 | 71.20 | 78.80 |" in lines
    assert "| GSM8K pass@1 | 25.00 | 26.15 | 85.22 |" in lines and lines.endswith("| 39.41 | 42.32 |")
    assert "| AMC avg@8 | 12.50 | 21.08 | 49.55 |" in lines


def test_two_models_never_share_a_default_folder(tmp_path, monkeypatch):
    """runs/a/final and runs/b/final: two folders; the same model: the same folder, whose results
    are kept unless --overwrite."""
    monkeypatch.chdir(tmp_path)
    a, b = evaluation.default_out("runs/a/final"), evaluation.default_out("runs/b/final")
    assert a != b and a.startswith(os.path.join("runs", "eval", "runs_a_final-"))
    assert evaluation.default_out("runs/a/final") == a
    os.makedirs(a)
    open(os.path.join(a, "results.json"), "w").write("{}")
    evaluated = []
    monkeypatch.setattr(evaluation, "evaluate_model", lambda model_dir, args: evaluated.append(model_dir) or
                        {"classroom": {"n": 1, "greedy": 1.0, "avg": 1.0, "maj": 1.0, "boxed": 1.0, "pass": 1.0,
                                       **{f"pass@{j}": 1.0 for j in (1, 2, 4, 8)}}})
    with pytest.raises(FileExistsError, match="already holds results .*pass --overwrite"):
        evaluation.main(["--model", "runs/a/final"])
    assert open(os.path.join(a, "results.json")).read() == "{}" and not evaluated
    evaluation.main(["--model", "runs/a/final", "--overwrite"])
    assert evaluated == ["runs/a/final"] and json.load(open(os.path.join(a, "results.json")))["results"]


def test_the_first_questions_responses_are_kept_with_their_rewards():
    """keep=2: the first two questions' greedy response and first sample, each with its answer and reward."""
    engine = FakeEngine(GREEDY, SAMPLED)
    _, examples = evaluation.eval_counts(engine, [[0], [1], [2]], GOLD, k=4, keep=2, **SAMPLING)
    assert [(e["question"], e["kind"], e["response"], e["answer"], e["gold"], e["reward"]) for e in examples] == [
        (0, "greedy", "\\boxed{5}", "5", "5", 1.0), (0, "sample", "\\boxed{5}", "5", "5", 1.0),
        (1, "greedy", "so \\boxed{0.5}", "0.5", "1/2", 1.0),
        (1, "sample", "\\boxed{\\frac12}", "\\frac12", "1/2", 1.0)]
    assert evaluation.eval_counts(engine, [[0]], GOLD[:1], k=4, **SAMPLING)[1] == []
    greedy_only = evaluation.eval_counts(engine, [[0], [1], [2]], GOLD, k=0, keep=2, **SAMPLING)[1]     # greedy only
    assert [(e["question"], e["kind"]) for e in greedy_only] == [(0, "greedy"), (1, "greedy")]


def test_pass_at_k_by_hand():
    """2 right of 5: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10, not 2/5 (c/n) nor 3/10 (without the 1 -).
    k = n: 1 when any of the n is right, else 0."""
    assert evaluation.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert evaluation.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert evaluation.pass_at_k(4, 1, 4) == 1.0
    assert evaluation.pass_at_k(4, 0, 4) == 0.0


def test_pass_at_k_is_0_without_a_right_answer_and_1_when_every_k_of_the_n_hold_one():
    """c = 0: 0 at every k; c = n: 1 at every k; and 0 < c < n: 1 from k = n - c + 1 on (every k of the n include a
    right one), below 1 before it."""
    for n in range(1, 11):
        for k in range(1, n + 1):
            assert evaluation.pass_at_k(n, 0, k) == 0.0
            assert evaluation.pass_at_k(n, n, k) == 1.0
        for c in range(1, n):
            assert evaluation.pass_at_k(n, c, n - c + 1) == 1.0
            assert evaluation.pass_at_k(n, c, n - c) < 1.0


def test_pass_at_1_is_the_fraction_right_and_more_samples_do_better():
    """pass@1 = c/n, the avg@k of the same samples; pass@2 exceeds it when some but not all are right."""
    for n, c in [(1, 0), (1, 1), (3, 1), (4, 3), (5, 2), (8, 3), (10, 7), (10, 10)]:
        assert evaluation.pass_at_k(n, c, 1) == pytest.approx(c / n)
        if 0 < c < n:
            assert evaluation.pass_at_k(n, c, 2) > c / n + 1e-9


def test_pass_at_k_agrees_with_the_binomial_formula():
    """The product form is 1 - C(n - c, k) / C(n, k) (math.comb, 0 when k > n - c) for every n <= 10, c and k."""
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert evaluation.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k),
                                                                      abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_k_outside_1_to_n():
    with pytest.raises(ValueError, match="1 <= k <= n .*k=5, n=4"):
        evaluation.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="1 <= k <= n .*k=0, n=4"):
        evaluation.pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="0 <= c <= n .*c=5, n=4"):
        evaluation.pass_at_k(4, 5, 2)


def test_pass_ks_are_the_powers_of_two_below_k_and_k():
    assert evaluation.pass_ks(8) == [1, 2, 4, 8]
    assert evaluation.pass_ks(5) == [1, 2, 4, 5]
    assert evaluation.pass_ks(9) == [1, 2, 4, 8, 9]
    assert (evaluation.pass_ks(2), evaluation.pass_ks(1), evaluation.pass_ks(0)) == ([1, 2], [1], [])


def test_counts_pass_at_k_by_hand():
    """Two questions, k = 4: 2 of 4 right, and none. pass@1 = 2/4 + 0; pass@2 = 1 - C(2,2)/C(4,2) = 5/6, + 0;
    pass@4 (and "pass", at k = 4) = 1 + 0. An empty share has the same keys, so that ranks' sums add up."""
    engine = FakeEngine(greedy=[["\\boxed{5}"], ["\\boxed{7}"]],
                        sampled=[["\\boxed{5}", "\\boxed{3}", "\\boxed{5}", "\\boxed{4}"],       # 2/4 right
                                 ["\\boxed{1}", "\\boxed{2}", "no box", "\\boxed{3}"]])           # 0/4 right
    sums, _ = evaluation.eval_counts(engine, [[0], [1]], ["5", "6"], k=4, **SAMPLING)
    assert {key: sums[key] for key in ("pass", "pass@1", "pass@2", "pass@4")} == \
        pytest.approx({"pass": 1.0, "pass@1": 0.5, "pass@2": 5 / 6, "pass@4": 1.0})
    assert (sums["avg"], sums["maj"], sums["greedy"]) == (0.5, 1, 1)          # the other sums as before
    acc = evaluation.accuracies(sums, k=4)
    assert {key: acc[key] for key in ("pass", "pass@1", "pass@2", "pass@4")} == \
        pytest.approx({"pass": 0.5, "pass@1": 0.25, "pass@2": 5 / 12, "pass@4": 0.5})
    assert acc["pass@1"] == pytest.approx(acc["avg"])
    assert evaluation.eval_counts(engine, [], [], k=4, **SAMPLING)[0].keys() == sums.keys()
    assert "pass" not in evaluation.eval_counts(engine, [[0], [1]], ["5", "6"], k=0, **SAMPLING)[0]     # no pass@k
