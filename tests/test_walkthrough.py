"""classroom/walkthrough.py and WALKTHROUGH.md: one coreward1 step printed stage by stage, and the document that
shows it.

The script runs once, as a reader runs it (a subprocess), and rewrites a copy of the document: the committed
WALKTHROUGH.md must show exactly the blocks it prints. Then the printed values are held to what the algorithm says
of them, worked out here from the printed values alone: a vote is the majority of the printed answers and labels
the other view; a reward is 1 exactly when the answer equals the label; a group's advantages are its normalised
rewards, summing to 0 and all 0 when the rewards are equal; the record's rates are the step table's counts; at step
1 (one update, the policy still the start model) the KL term is 0, the policy term is minus the token-weighted mean
advantage, and Adam's first step moves a weight by lr; the EMA leaves (1 - alpha) teacher + alpha policy. The slow
test checks that the step is step 1 of train.py's own runs.
"""
import ast
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import pytest

import config
import train
from harness.answers import is_equiv, majority_vote
from conftest import ROOT
from teacher import ema_alpha
from walkthrough import OUTPUT_BLOCK, num

DOCUMENT = os.path.join(ROOT, "WALKTHROUGH.md")
CLASSROOM = config.PRESETS["classroom"]
G, P = CLASSROOM["group_size"], CLASSROOM["questions_per_step"]
ENV = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
BLOCK = re.compile(r"^\[(\w+)\] .*?(?=\n\n)", re.M | re.S)      # a printed block: its header line to a blank line


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    """(the printed blocks by name, the copy of the document it rewrote) of one run of
    `python classroom/walkthrough.py --markdown COPY`."""
    copy = tmp_path_factory.mktemp("walkthrough") / "WALKTHROUGH.md"
    shutil.copy(DOCUMENT, copy)
    done = subprocess.run([sys.executable, "classroom/walkthrough.py", "--markdown", str(copy)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = {m.group(1): m.group(0) + "\n" for m in BLOCK.finditer(done.stdout)}
    return blocks, copy.read_text()


def find(blocks, name, pattern):
    """The groups of `pattern`'s first match in block `name`."""
    match = re.search(pattern, blocks[name], re.M)
    assert match, f"block {name}: nothing matches {pattern!r} in\n{blocks[name]}"
    return match.groups()


def answer(text):
    """A printed answer: '-' is none."""
    return None if text == "-" else text


def rewards_of(text):
    return [int(c) for c in text]


def close(printed, value, digits=4):
    """A value printed to `digits` significant digits is `value` rounded."""
    return abs(float(printed) - value) <= 0.6 * 10 ** (-digits + 1) * max(abs(value), 1e-12) + 1e-12


def step_table(blocks):
    """The step block's rows: (pair, gold, [(vote, rewards, A(1), A(0)) for q, q'])."""
    rows = []
    for line in blocks["step"].splitlines():
        if re.match(r"^\s*\d+\s+\S+ \|", line):
            head, *views = line.split("|")
            pair, gold = head.split()
            rows.append((int(pair), answer(gold), [tuple(cell.rsplit(maxsplit=3)) for cell in views]))
    return rows


def record(blocks):
    """The record block as {key: the printed value}."""
    items = [item for line in blocks["record"].splitlines()[1:] for item in line.split("  ")]
    return dict(item.split(" ", 1) for item in items)


GAP = re.compile(r"sampler_gap ([0-9.e+-]+)")


def gap_masked(text):
    """The text with each sampler_gap figure masked: the float rounding between vLLM's kernels and the trainer's,
    whose digits change with the processor (4.3e-07 on one, 4.2e-07 on another); every other figure does not."""
    return GAP.sub("sampler_gap (rounding)", text)


@pytest.mark.vllm                         # the document shows vLLM's samples
@pytest.mark.docs
def test_the_document_shows_what_the_script_prints(walkthrough):
    printed, regenerated = walkthrough
    with open(DOCUMENT) as f:
        committed = f.read()
    shown = {m.group(2): m.group(3) for m in OUTPUT_BLOCK.finditer(committed)}
    assert list(shown) == list(printed)                 # every block, once, in the order of the step
    stale = [name for name in printed if gap_masked(shown[name]) != gap_masked(printed[name])]
    assert not stale, (f"WALKTHROUGH.md's blocks {stale} are not what classroom/walkthrough.py prints; regenerate "
                       f"them: OMP_NUM_THREADS=1 python classroom/walkthrough.py --markdown WALKTHROUGH.md")
    assert gap_masked(regenerated) == gap_masked(committed)     # --markdown rewrites the blocks, keeps the prose
    gaps = [float(g) for block in printed.values() for g in GAP.findall(block)]
    assert len(gaps) == 2 and all(0 <= g < 1e-5 for g in gaps)  # the same weights on both sides: rounding only


def test_each_views_vote_is_its_majority_and_labels_the_other_view(walkthrough):
    blocks, _ = walkthrough
    answers = [ast.literal_eval(a) for a in re.findall(r"answers of all \d+: (\[.*\])$", blocks["sample"], re.M)]
    assert len(answers) == 2 and all(len(a) == G for a in answers)
    vote_q, vote_r, _ = find(blocks, "label", r"^vote on q : (.*?)    vote on q': (.*?)    \(gold (.*)\)$")
    assert [majority_vote(answers[0]), majority_vote(answers[1])] == [answer(vote_q), answer(vote_r)]
    label_q, = find(blocks, "label", r"^label of the responses to q : (.*?)  \(")
    label_r, = find(blocks, "label", r"^label of the responses to q': (.*?)  \(")
    assert (label_q, label_r) == (vote_r, vote_q)                     # crossed: q' labels q, q labels q'
    for view, label, group in (("q ", label_q, answers[0]), ("q'", label_r, answers[1])):
        printed_label, rewards = find(blocks, "reward", rf"^{view}: label (.*?)  rewards ([01]+)$")
        assert printed_label == label
        assert rewards_of(rewards) == [int(is_equiv(a, answer(label))) for a in group]


def test_the_teachers_vote_labels_the_students_responses(walkthrough):
    blocks, _ = walkthrough
    teacher = ast.literal_eval(find(blocks, "teacher", r"teacher's answers: (\[.*\])$")[0])
    student = ast.literal_eval(find(blocks, "teacher", r"student's answers: (\[.*\])$")[0])
    label, = find(blocks, "teacher", r"teacher's vote, the label: (.*)$")
    rewards, = find(blocks, "teacher", r"student's rewards: ([01]+)$")
    assert majority_vote(teacher) == answer(label)
    assert student == ast.literal_eval(re.findall(r"answers of all \d+: (\[.*\])$", blocks["sample"], re.M)[0])
    assert rewards_of(rewards) == [int(is_equiv(a, answer(label))) for a in student]


def test_advantages_are_the_rewards_normalised_within_each_group(walkthrough):
    blocks, _ = walkthrough
    for view in ("q ", "q'"):
        _, rewards = find(blocks, "reward", rf"^{view}: label (.*?)  rewards ([01]+)$")
        mean, std, advantages = find(blocks, "advantages", rf"^{view}: mean (\S+)  std (\S+)  advantages (.*)$")
        r = rewards_of(rewards)
        assert close(mean, statistics.mean(r)) and close(std, statistics.stdev(r))     # Bessel's std
        advantages = [float(a) for a in advantages.split()]
        assert all(abs(a - (x - statistics.mean(r)) / statistics.stdev(r)) < 6e-4 for a, x in zip(advantages, r))
        assert abs(sum(advantages)) < G * 6e-4
    rows = step_table(blocks)
    assert len(rows) == P
    equal = 0
    for _, _, views in rows:
        for _, rewards, a1, a0 in views:
            k = rewards.count("1")
            if k in (0, G):                             # equal rewards: zero advantages, no signal
                equal += 1
                assert (a1, a0) == ((".", "0") if k == 0 else ("0", "."))
            else:
                std = statistics.stdev(rewards_of(rewards))
                assert abs(float(a1) - (1 - k / G) / std) < 6e-4 and abs(float(a0) + k / G / std) < 6e-4
                assert abs(k * float(a1) + (G - k) * float(a0)) < G * 6e-4
    counted = find(blocks, "step", r"all equal \(zero advantages, no signal\): (\d+) of (\d+)$")
    assert counted == (str(equal), str(2 * P))


def test_the_record_counts_what_the_step_table_shows(walkthrough):
    """step_record_over_ranks's rates are the table's counts: rewards, groups without signal, labels equal to the
    gold answer (each view's label is the other view's vote)."""
    blocks, _ = walkthrough
    rows, line = step_table(blocks), record(blocks)
    rewards = [r for _, _, views in rows for _, r, _, _ in views]
    labels_right = sum(is_equiv(answer(views[1][0]), gold) + is_equiv(answer(views[0][0]), gold)
                       for _, gold, views in rows)
    assert find(blocks, "step", r"labels equal to the gold answer: (\d+) of") == (str(labels_right),)
    assert close(line["reward"], sum(r.count("1") for r in rewards) / (2 * P * G))
    assert close(line["zero_variance"], sum(r in ("0" * G, "1" * G) for r in rewards) / (2 * P))
    assert close(line["label_acc"], labels_right / (2 * P))
    assert line["responses"] == str(2 * P * G) and line["step"] == "1"


def test_at_step_1_the_update_is_the_policy_term_with_rho_1(walkthrough):
    """One update per step: rho = 1, so the policy term is -A per token and nothing is clipped; the policy is
    the start model, so the KL term is 0; Adam's first step moves each weight by at most lr, most by lr."""
    blocks, _ = walkthrough
    terms = re.findall(r"^(q |q'): (\d+) response tokens  policy term (\S+)  \(-sum_i A_i n_i / N = (\S+)\)  "
                       r"KL term (\S+)$", blocks["loss"], re.M)
    assert len(terms) == 2
    for _, _, policy_term, weighted, kl_term in terms:
        assert close(policy_term, float(weighted)) and kl_term == "0"
    total, = find(blocks, "loss", r"^loss \(the two views' terms summed\): (\S+)$")
    assert close(total, sum(float(t[2]) for t in terms), 3)
    clip_frac, kl = find(blocks, "update", r"clip_frac (\S+)  kl (\S+)$")
    assert (clip_frac, kl) == ("0", "0")
    lr = CLASSROOM["lr"] * train.cosine_with_warmup(CLASSROOM["steps"], CLASSROOM["warmup_ratio"])(0)
    assert close(find(blocks, "update", r"^lr (\S+) ")[0], lr)
    before, after, change = find(blocks, "update", r": (\S+) -> (\S+) \(change (\S+)\)$")
    assert close(change, float(after) - float(before)) and abs(abs(float(change)) - lr) < 0.01 * lr
    largest, = find(blocks, "update", r"largest \|change\| of a weight: (\S+) ")
    assert abs(float(largest) - lr) < 0.01 * lr                      # float32 rounding of weights near 1


def test_the_ema_moves_the_teacher_alpha_of_the_way_to_the_policy(walkthrough):
    blocks, _ = walkthrough
    alphas = [float(a) for a in find(blocks, "ema", r"^alpha after steps .*?: (.*)$")[0].split(", ")]
    steps = CLASSROOM["steps"]
    ema = CLASSROOM["ema_start"], CLASSROOM["ema_end"]
    assert alphas == [float(num(ema_alpha(s, steps, *ema), 6)) for s in (1, steps // 2, steps - 1, steps)]
    assert alphas == sorted(alphas, reverse=True) and alphas[-1] == 0          # none after the last step
    alpha = float(find(blocks, "ema", rf"^alpha after step 1 = 1 - decay\(1 / {steps}\) = (\S+)$")[0])
    assert alpha == pytest.approx(ema_alpha(1, steps, *ema), rel=1e-3)
    values = find(blocks, "ema", r"teacher (\S+)  policy (\S+)  teacher after (\S+)$")
    teacher, policy, after = (float(x) for x in values)
    before_update, after_update = (float(x) for x in find(blocks, "update", r": (\S+) -> (\S+) \(change"))
    assert (teacher, policy) == (before_update, after_update)        # the teacher starts as the start model
    assert abs(policy - teacher) > 1e-6                               # so the check below tells alpha from 1 - alpha
    assert abs(after - ((1 - alpha) * teacher + alpha * policy)) < 1e-10
    assert float(find(blocks, "ema", r"over all weights: (\S+) ")[0]) < 1e-6      # float32 rounding


@pytest.mark.slow
def test_the_step_is_step_1_of_train_py(walkthrough, tmp_path):
    """`python train.py --method coreward1` logs the walkthrough's record at step 1, and `--method coreward2` the
    teacher branch's label accuracy and reward. One-step runs: their learning rate (a one-step schedule) differs,
    and so do the times; nothing else."""
    blocks, _ = walkthrough
    logged = {}
    for method in ("coreward1", "coreward2"):
        out = tmp_path / method
        subprocess.run([sys.executable, "train.py", "--method", method, "--steps", "1", "--eval_limit", "8",
                        "--save_every", "0", "--out", str(out)], cwd=ROOT, env=ENV, check=True, capture_output=True,
                       timeout=600)
        with open(out / "metrics.jsonl") as f:
            logged[method] = next(x for x in map(json.loads, f) if x.get("step") == 1 and "reward" in x)
    printed = record(blocks)
    expected = {key: num(v, 2 if key == "sampler_gap" else 4) if isinstance(v, float) else str(v)
                for key, v in logged["coreward1"].items() if key != "lr" and not key.startswith("t_")}
    assert {key: v for key, v in printed.items() if key != "lr"} == expected
    right, of, reward = find(blocks, "teacher", r"labels equal to the gold answer (\d+) of (\d+) .*; "
                                                r"mean reward (\S+)$")
    assert close(reward, logged["coreward2"]["reward"]) and int(right) / int(of) == logged["coreward2"]["label_acc"]
