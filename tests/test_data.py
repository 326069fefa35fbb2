"""Data: the shipped pair sets and benchmarks load whole, malformed files fail clearly, and
rephrased pairs are parsed, filtered and written in the pair format."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from harness import data
import rephrase
from conftest import ROOT
from rephrase import END, START, parse_rephrased
from rollout import Sample


@pytest.mark.parametrize("name, rows, first_answer", [
    ("openrs", 6999, "75"), ("math", 7500, "0"), ("dapo", 14109, "34"), ("amc_ttt", 83, "142")])
def test_shipped_pair_sets_load_whole(name, rows, first_answer):
    pairs = data.load_pairs(name)
    assert len(pairs) == rows
    assert pairs[0].answer == first_answer
    assert all(p.original.strip() and p.rephrased.strip() and p.original != p.rephrased for p in pairs[:50])


def test_dapo_joins_originals_and_rephrasings_by_row():
    pairs = data.load_pairs("dapo")
    assert pairs[0].original.startswith("In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$")
    assert pairs[0].rephrased.startswith("In triangle $PQR$, $\\sin \\angle P = \\frac{4}{5}$")


def test_pairs_without_a_gold_answer_are_kept_and_counted(capsys):
    pairs = data.load_pairs("math")
    assert [i for i, p in enumerate(pairs) if p.answer is None] == [5341, 5343]
    assert "2 of 7500 pairs have no gold answer (rows [5341, 5343])" in capsys.readouterr().out


def _pair_file(tmp_path, rows, name="pairs.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


GOOD = {"original_question": "What is 2+3?", "rephrased_question": "Tom has 2 apples and gets 3 more. How many?",
        "solution": "5"}


def test_a_pair_parquet_path_loads(tmp_path):
    assert data.load_pairs(_pair_file(tmp_path, [GOOD])) == [data.Pair(GOOD["original_question"],
                                                                       GOOD["rephrased_question"], "5")]
    numeric = _pair_file(tmp_path, [{**GOOD, "solution": 7.0}, {**GOOD, "solution": 2.5}], "numeric.parquet")
    assert [p.answer for p in data.load_pairs(numeric)] == ["7", "2.5"]


def test_a_missing_column_is_named(tmp_path):
    path = _pair_file(tmp_path, [{k: v for k, v in GOOD.items() if k != "solution"}])
    with pytest.raises(ValueError, match=r"pairs.parquet: missing column\(s\) \['solution'\]"):
        data.load_pairs(path)


@pytest.mark.parametrize("column, value", [("original_question", ""), ("rephrased_question", "   "),
                                           ("rephrased_question", None)])
def test_an_empty_question_names_file_row_and_column(tmp_path, column, value):
    path = _pair_file(tmp_path, [GOOD, GOOD, {**GOOD, column: value}])
    with pytest.raises(ValueError, match=rf"pairs.parquet: row 2: {column}: the question must be a non-empty string"):
        data.load_pairs(path)


def test_an_empty_pair_file_is_refused(tmp_path):
    path = _pair_file(tmp_path, {c: pd.Series([], dtype=str) for c in data.PAIR_COLUMNS})
    with pytest.raises(ValueError, match="pairs.parquet: no pairs in the file"):
        data.load_pairs(path)


def test_a_non_string_question_is_refused(tmp_path):
    path = _pair_file(tmp_path, [{**GOOD, "original_question": 12}])
    with pytest.raises(ValueError, match="row 0: original_question: the question must be a non-empty string, got 12"):
        data.load_pairs(path)


def test_unknown_sources_are_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no parquet file"):
        data.load_pairs(str(tmp_path / "nothing.parquet"))
    with pytest.raises(ValueError, match="unknown training data 'gsm8k'"):
        data.load_pairs("gsm8k")


def test_a_hub_id_offline_is_a_clear_error():
    code = "from harness import data; data.load_pairs('someone/some-pairs')"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode != 0
    assert "cannot load 'someone/some-pairs' from the Hugging Face hub (offline?)" in res.stderr


def _verl_rows(questions, truths, index=None):
    """Rows in verl's format; with `index`, each row's extra_info.index (None: a row without one)."""
    rows = [{"prompt": [{"role": "system", "content": data.SYSTEM_PROMPT}, {"role": "user", "content": q}],
             "reward_model": {"ground_truth": t, "style": "rule"}} for q, t in zip(questions, truths)]
    for row, key in zip(rows, index if index is not None else []):
        row["extra_info"] = {"index": key, "split": "train"}
    return rows


def test_verl_pair_files_join_by_row(tmp_path):
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2"], ["1", "2.0"]), "a.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r1", "r2"], ["1", "2"]), "b.parquet")
    assert data.verl_pairs(a, b) == [data.Pair("q1", "r1", "1"), data.Pair("q2", "r2", "2")]


def test_misaligned_verl_files_are_refused(tmp_path):
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2", "q3"], ["1", "2", "3"]), "a.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r1", "r3", "r2"], ["1", "3", "2"]), "b.parquet")
    with pytest.raises(ValueError, match=r"misaligned pair files: row 1: ground truth '2' in .*a.parquet "
                                         r"but '3' in .*b.parquet"):
        data.verl_pairs(a, b)
    short = _pair_file(tmp_path, _verl_rows(["r1"], ["1"]), "short.parquet")
    with pytest.raises(ValueError) as refused:
        data.verl_pairs(a, short)
    assert str(refused.value) == (
        f"misaligned pair files: {a} has 3 rows, {short} has 1: row 1 of {a} has no rephrasing; neither file carries "
        f"extra_info.index, so they are joined by row: give every original its rephrasing on its own row, or give both "
        f"files the index")
    with pytest.raises(ValueError, match=r"short.parquet has 1 rows, .*a.parquet has 3: row 1 of .*a.parquet has no "
                                         r"original"):
        data.verl_pairs(short, a)


def test_a_verl_row_without_ground_truth_or_user_message_is_named(tmp_path):
    rows = _verl_rows(["q1", "q2"], ["1", "2"])
    rows[1]["reward_model"] = None
    a = _pair_file(tmp_path, rows, "a.parquet")
    with pytest.raises(ValueError,
                       match="a.parquet: row 1: missing ground truth: `reward_model` has no 'ground_truth'"):
        data.verl_pairs(a, a)
    rows = _verl_rows(["q1", "q2"], ["1", "2"])
    rows[0]["prompt"] = [{"role": "system", "content": data.SYSTEM_PROMPT}]
    b = _pair_file(tmp_path, rows, "b.parquet")
    with pytest.raises(ValueError, match="b.parquet: row 0: `prompt` has no user message"):
        data.verl_pairs(b, b)


# --------------------------------------------------- two verl files, joined by extra_info.index

def _refused(load, *args):
    """The message of the InputError that load(*args) raises, as the user reads it: one line."""
    with pytest.raises(data.InputError) as refused:
        load(*args)
    message = str(refused.value)
    assert "\n" not in message
    return message


def _amc_ttt_frames():
    return [pd.read_parquet(os.path.join(data.DATA_DIR, f)) for f in data.SHIPPED_VERL_PAIRS["amc_ttt"]]


def _moved_among_equal_answers(frame):
    """`frame` with its rows moved among the rows of the same ground truth (each such group rotated by one row), each
    row whole: its extra_info.index goes with it."""
    groups = {}
    for i, reward in enumerate(frame["reward_model"]):
        groups.setdefault(reward["ground_truth"], []).append(i)
    order = list(range(len(frame)))
    for rows in groups.values():
        for i, j in zip(rows, rows[1:] + rows[:1]):
            order[i] = j
    return frame.iloc[order].reset_index(drop=True)


def _by_row(original_path, rephrased_path):
    """The pairs two verl files give when joined by row."""
    return [data.Pair(q, r, a) for (q, a), (r, _) in zip(data.verl_rows(original_path), data.verl_rows(rephrased_path))]


@pytest.mark.parametrize("name, fingerprint", [
    ("dapo", "fce81a2c533cae5cbe8a7da1de2f1fca482b0399de4ce70589114430944c25e2"),
    ("amc_ttt", "9b2d7c570f366649cdde11c4a345141483176748019ce06554f92adb1abda829")], ids=["dapo", "amc_ttt"])
def test_the_shipped_verl_pairs_carry_the_index_and_load_as_joined_by_row(name, fingerprint):
    """The authors' layout: every row of both files carries extra_info.index, each once, the same in the same row
    (dapo's run from 0 to 14115 with gaps: an identifier, not a row number). Joined by it, the pairs are those a join
    by row gave, and so are the questions' fingerprint a checkpoint holds (the value before the join by index)."""
    from harness import checkpoint
    original, rephrased = (os.path.join(data.DATA_DIR, f) for f in data.SHIPPED_VERL_PAIRS[name])
    frames = data.read_parquet(original), data.read_parquet(rephrased)
    index = data.verl_index(frames[0], original)
    assert index is not None and len(set(index)) == len(index) and data.verl_index(frames[1], rephrased) == index
    pairs = data.load_pairs(name)
    assert pairs == [data.Pair(q, r, a) for (q, a), (r, _) in zip(data.verl_rows(original, frames[0]),
                                                                  data.verl_rows(rephrased, frames[1]))]
    assert checkpoint.questions_fingerprint(pairs) == {"questions": len(pairs), "sha256": fingerprint}


def test_rephrasings_moved_among_equal_answers_are_joined_by_their_index(tmp_path):
    """The researcher's shuffle, on the shipped amc_ttt pair: the rephrasings moved among the rows of the same answer,
    each with its extra_info.index. Joined by row, 54 of the 83 questions would get another question's rephrasing and
    pass every check (as many rows, the same ground truth in each); joined by index, each gets its own again, in the
    originals' order. So does any order of the rephrasings."""
    original, rephrased = _amc_ttt_frames()
    a = _pair_file(tmp_path, original, "amc_original.parquet")
    moved = _pair_file(tmp_path, _moved_among_equal_answers(rephrased), "amc_moved.parquet")
    shipped = data.load_pairs("amc_ttt")
    assert sum(p != q for p, q in zip(_by_row(a, moved), shipped)) == 54
    pairs, _ = data.load_training(f"{a},{moved}", "both")
    assert pairs == shipped
    anyhow = _pair_file(tmp_path, rephrased.sample(frac=1, random_state=0), "amc_anyhow.parquet")
    assert data.verl_pairs(a, anyhow) == shipped


def test_a_shuffle_that_rewrites_the_index_too_is_joined_as_the_files_say(tmp_path):
    """The same shuffle, each moved rephrasing given the index of the row it lands on: the files now say that those
    questions' rephrasings are other questions' of the same answer, and nothing the loader checks says otherwise (it
    does not judge whether a text rephrases another); it trusts the index and joins the files as they say. What it
    guarantees: each pair is joined by the index both files carry, and a rewritten index that joins questions of
    different answers is refused, naming the row."""
    original, rephrased = _amc_ttt_frames()
    rewritten = _moved_among_equal_answers(rephrased).assign(extra_info=rephrased["extra_info"])
    a = _pair_file(tmp_path, original, "amc_original.parquet")
    b = _pair_file(tmp_path, rewritten, "amc_rewritten.parquet")
    pairs = data.verl_pairs(a, b)
    assert pairs == _by_row(a, b) and sum(p != q for p, q in zip(pairs, data.load_pairs("amc_ttt"))) == 54
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2", "q3"], ["1", "2", "3"], [7, 8, 9]), "a.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r1", "r3", "r2"], ["1", "3", "2"], [7, 8, 9]), "b.parquet")
    assert _refused(data.verl_pairs, a, b) == (
        f"misaligned pair files: row 1: ground truth '2' in {a} but '3' in {b} row 1, joined to it by extra_info.index "
        f"8; a rephrasing has its original's answer: correct that row's index")


def test_verl_files_with_the_index_are_joined_by_it_in_the_originals_order(tmp_path):
    """Integer or string indices, of any values; the pairs in the originals' order, whatever the rephrasings'."""
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2", "q3"], ["1", "2", "3"], [12, 10, 11]), "a.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r2", "r3", "r1"], ["2", "3", "1"], [10, 11, 12]), "b.parquet")
    expected = [data.Pair("q1", "r1", "1"), data.Pair("q2", "r2", "2"), data.Pair("q3", "r3", "3")]
    assert data.verl_pairs(a, b) == expected
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2", "q3"], ["1", "2", "3"], ["x", "y", "z"]), "a.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r3", "r1", "r2"], ["3", "1", "2"], ["z", "x", "y"]), "b.parquet")
    assert data.verl_pairs(a, b) == expected


def test_verl_files_without_the_index_are_joined_by_row(tmp_path):
    """No extra_info, or an extra_info without `index`, in both files: joined by row, as before."""
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2"], ["1", "2"]), "a.parquet")
    rows = _verl_rows(["r1", "r2"], ["1", "2"])
    for row in rows:
        row["extra_info"] = {"split": "train"}
    b = _pair_file(tmp_path, rows, "b.parquet")
    assert data.verl_pairs(a, b) == [data.Pair("q1", "r1", "1"), data.Pair("q2", "r2", "2")]
    original, rephrased = (frame.drop(columns="extra_info") for frame in _amc_ttt_frames())
    a = _pair_file(tmp_path, original, "amc_original.parquet")
    b = _pair_file(tmp_path, rephrased, "amc_rephrased.parquet")
    assert data.verl_pairs(a, b) == data.load_pairs("amc_ttt")


def test_verl_files_that_cannot_be_joined_by_their_index_are_refused_in_one_line(tmp_path):
    """Each refusal names the file, the first row at fault, what is wrong and what to do."""
    def verl(name, truths, index, questions=None):
        return _pair_file(tmp_path, _verl_rows(questions or [f"{name}{t}" for t in truths], truths, index),
                          f"{name}.parquet")
    a = verl("a", ["1", "2", "3"], [10, 11, 12])
    b = stray = verl("stray", ["1", "2", "3"], [10, 11, 13])
    assert _refused(data.verl_pairs, a, b) == (
        f"{b}: row 2: extra_info.index 13 matches no original in {a} (whose first are [10, 11, 12]); a rephrasing "
        f"carries the index of the original it rephrases: correct it, or drop the row")
    b = verl("text", ["1", "2", "3"], ["10", "11", "12"])                    # the same numbers, written as text
    assert _refused(data.verl_pairs, a, b).startswith(f"{b}: row 0: extra_info.index '10' matches no original in {a} "
                                                      f"(whose first are [10, 11, 12])")
    b = verl("twice", ["1", "2", "1"], [10, 11, 10])
    expected = "row 2: extra_info.index 10 again (first at row 0); an index names one question, once in each file: " \
               "drop the duplicate row or give it its own index"
    assert _refused(data.verl_pairs, a, b) == f"{b}: {expected}"
    assert _refused(data.verl_pairs, b, a) == f"{b}: {expected}"
    b = verl("short", ["3", "1"], [12, 10])
    assert _refused(data.verl_pairs, a, b) == (
        f"misaligned pair files: {a} has 3 rows, {b} has 2: row 1 of {a} (extra_info.index 11) has no rephrasing; "
        f"give every original its rephrasing, or drop the row")
    b = verl("bare", ["1", "2", "3"], None)
    assert _refused(data.verl_pairs, a, b) == (
        f"misaligned pair files: {a} carries extra_info.index on every row, {b} on none (row 0 has none), so the "
        f"rephrasings cannot be matched to their originals by it: give each row of {b} the index of its question, or "
        f"drop the index from {a} to join the files by row")
    assert _refused(data.verl_pairs, b, a).startswith(f"misaligned pair files: {a} carries extra_info.index on every "
                                                      f"row, {b} on none (row 0 has none)")
    b = verl("some", ["1", "2", "3"], [10, None, 12])
    assert _refused(data.verl_pairs, a, b) == (
        f"{b}: row 1: no extra_info.index, though 2 of its 3 rows carry one; give every row its index (the files are "
        f"then joined by it) or none (joined by row)")
    b = verl("halves", ["1", "2", "3"], [10.0, 11.5, 12.0])
    assert _refused(data.verl_pairs, a, b) == \
        f"{b}: row 1: extra_info.index must be an integer or a non-empty string, got 11.5"
    b = verl("floats", ["1", "2", "3"], [10.0, 11.0, 12.0])                # whole floats are the integers
    assert [p.answer for p in data.verl_pairs(a, b)] == ["1", "2", "3"]
    assert _refused(data.load_training, f"{a},{stray}", "both").startswith(   # --data ORIGINALS,REPHRASINGS
        f"{stray}: row 2: extra_info.index 13 matches no original")


@pytest.mark.parametrize("name, count", [("math500", 500), ("gsm8k", 1319), ("amc", 83), ("amc23", 40),
                                         ("aime24", 30), ("aime25", 30), ("math5000", 5000)])
def test_each_benchmark_loads_whole(name, count):
    problems = data.load_benchmark(name)
    assert len(problems) == count
    assert len({p.question for p in problems}) == count
    assert data.load_benchmark(name, limit=3) == problems[:3]


def test_benchmark_answers_are_read_as_written_mathematics():
    assert data.load_benchmark("math500", 3)[2].answer == "\\frac{14}{3}"
    assert data.load_benchmark("amc", 1)[0].answer == "142"                       # 142.0
    assert data.load_benchmark("amc23", 1)[0].answer == "27"                      # a JSON float 27.0
    assert [p.answer for p in data.load_benchmark("aime25", 3)] == ["70", "588", "16"]   # 070, 588, 016
    assert data.load_benchmark("gsm8k", 1)[0].answer == "18"


@pytest.mark.parametrize("solution, answer", [
    ("2 + 3 = 5\n#### 5", "5"), ("so 1,000 in all.\n#### 1,000", "1000"), ("#### 1,450,000", "1450000"),
    ("owes\n#### -3", "-3"), ("#### 2.5 ", "2.5")])
def test_gsm8k_answer_after_the_four_hashes(solution, answer):
    assert data.gsm8k_answer(solution, "here") == answer


def test_gsm8k_shipped_answers_with_commas_are_numbers():
    answers = {p.answer for p in data.load_benchmark("gsm8k")}
    assert {"2125", "114200", "1450000"} <= answers
    assert not any("," in a for a in answers)


def test_gsm8k_without_hashes_is_refused():
    with pytest.raises(ValueError, match="here: no '#### answer'"):
        data.gsm8k_answer("the answer is 5", "here")


def test_a_malformed_benchmark_row_is_named(tmp_path, monkeypatch):
    (tmp_path / "eval").mkdir()
    monkeypatch.setattr(data, "DATA_DIR", str(tmp_path))
    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": ""}]
    (tmp_path / "eval" / "math500.json").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"math500.json: row 1: missing ground truth"):
        data.load_benchmark("math500")
    rows[1] = {"prompt": "", "answer": "4"}
    (tmp_path / "eval" / "math500.json").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"math500.json: row 1: prompt: the question must be a non-empty string"):
        data.load_benchmark("math500")
    (tmp_path / "eval" / "gsm8k_test.jsonl").write_text(json.dumps({"question": "q", "answer": "no hashes"}) + "\n")
    with pytest.raises(ValueError, match=r"gsm8k_test.jsonl: row 0: no '#### answer'"):
        data.load_benchmark("gsm8k")
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'"):
        data.load_benchmark("mmlu")


class PlainTokenizer:
    """A tokenizer without a chat template: one id per character."""
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class ChatTokenizer(PlainTokenizer):
    """A tokenizer with a chat template: the messages as `role: content` lines, one id per character."""
    chat_template = "role: content"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        assert add_generation_prompt and tokenize and not return_dict
        return [ord(c) for c in "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"]


def test_prompts_without_a_chat_template_are_plain_text():
    encode = data.prompt_encoder(PlainTokenizer(), classroom=False)
    assert "".join(map(chr, encode("What is 2+3?"))) == data.SYSTEM_PROMPT + "\n\nWhat is 2+3?\n"
    encode = data.prompt_encoder(PlainTokenizer(), classroom=False, prompt="user")
    assert "".join(map(chr, encode("What is 2+3?"))) == \
        "What is 2+3?\nPlease reason step by step, and put your final answer within \\boxed{}.\n"


def test_a_chat_model_is_asked_the_classroom_questions_in_plain_english_and_the_classroom_model_in_its_format():
    question = "Tom has 3 boxes with 4 pens in each . How many pens , in all ?"
    def asked(tokenizer, prompt="official"):
        return "".join(map(chr, data.prompt_encoder(tokenizer, True, prompt)(question)))
    assert asked(ChatTokenizer()) == f"system: {data.SYSTEM_PROMPT}\n" \
                                     "user: Tom has 3 boxes with 4 pens in each. How many pens, in all?\nassistant:"
    assert asked(ChatTokenizer(), "user") == "user: Tom has 3 boxes with 4 pens in each. How many pens, in all?\n" \
        "Please reason step by step, and put your final answer within \\boxed{}.\nassistant:"   # the template's system
    assert asked(PlainTokenizer()) == f"{data.SYSTEM_PROMPT}\n\nTom has 3 boxes with 4 pens in each. How many pens, " \
                                      "in all?\n"
    classroom, question = _classroom_tokenizer(), CLASSROOM_QUESTION
    for prompt in ("official", "oneshot"):
        assert classroom.decode(data.prompt_encoder(classroom, True, prompt)(question)) == f"Question: {question}\nAnswer:"
    with pytest.raises(ValueError, match="unknown prompt 'polite'; choose from official, user, oneshot"):
        data.prompt_encoder(ChatTokenizer(), False, "polite")


CLASSROOM_QUESTION = "Zoe fills 10 baskets , putting 5 oranges in every one , and then finds 4 more oranges . How " \
                     "many oranges are there altogether ?"


def _classroom_tokenizer():
    from transformers import AutoTokenizer
    from harness import world
    return AutoTokenizer.from_pretrained(world.BASE_DIR)


def test_the_classroom_model_is_asked_in_its_format_whatever_the_datas_name():
    """The format follows the model: the classroom's tokenizer gets `Question: ... Answer:` for questions of a user's
    file too (no chat template, no system prompt it has no words for), and reads them without an unknown token."""
    classroom, question = _classroom_tokenizer(), CLASSROOM_QUESTION
    ids = data.prompt_encoder(classroom, classroom=False)(question)
    assert classroom.decode(ids) == f"Question: {question}\nAnswer:"
    assert classroom.unk_token_id not in ids and data.unknown_token_warning(classroom, [ids], "prompts") is None


def test_prompts_the_tokenizer_cannot_read_are_counted_in_one_warning():
    classroom = _classroom_tokenizer()
    encode = data.prompt_encoder(classroom)
    prompts = [encode(CLASSROOM_QUESTION), encode("Compute the integral of x squared from 0 to 3 ."),
               encode("How many oranges are there ?")]
    warning = data.unknown_token_warning(classroom, prompts, "training prompts")
    assert warning.startswith("warning: 1 of 3 training prompts hold the tokenizer's unknown token '<unk>'")


def test_a_model_that_reads_none_of_its_prompts_is_refused_in_one_line(tmp_path):
    """The classroom model on real questions (every prompt holds its unknown token) is refused before anything runs,
    in one line with status 2, with nothing in its --out but the folder's locks; it is not trained on prompts it cannot read."""
    questions = tmp_path / "real.jsonl"
    questions.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in [
        ("Compute the integral of x squared from 0 to 3.", "9"), ("How many oranges are there?", "4")] * 16))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--method", "gt", "--data", str(questions),
                          "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [
        "train.py: error: all 32 training prompts hold the tokenizer's unknown token '<unk>', e.g. 'Question:<unk> "
        "the<unk> of<unk><unk><unk> 0 to 3<unk>\\nAnswer:': the model cannot read its questions (the "
        "classroom model reads only the classroom world's words); give --model a model that reads them, or --data "
        "classroom"]
    assert all(name.startswith(".") for name in os.listdir(tmp_path / "out"))      # the folder's locks alone


# ------------------------------------------------------------------------ rephrasing

def test_parse_rephrased_well_formed():
    text = f"Sure! Here it is.\n{START}\nA baker sells 3 boxes of 4 rolls. How many rolls?\n{END}\nHope this helps."
    assert parse_rephrased(text) == "A baker sells 3 boxes of 4 rolls. How many rolls?"


def test_parse_rephrased_takes_the_last_complete_block():
    text = f"{START} draft {END} Better: {START}\nfinal version\n{END}"
    assert parse_rephrased(text) == "final version"


@pytest.mark.parametrize("text", [
    "A baker sells 3 boxes of 4 rolls.",                   # no markers
    f"{START}\nA baker sells 3 boxes of 4 rolls.",         # never closed
    f"A baker sells 3 boxes.\n{END}",                      # never opened
    f"{END} backwards {START}",
    f"{START}\n   \n{END}",                                # empty
    "", None])
def test_parse_rephrased_failures_are_none(text):
    assert parse_rephrased(text) is None


QUESTIONS = ["Q1: what is 2+3?", "Q2: what is 4*5?", "Q3: what is 1+1?"]
REWRITES = {QUESTIONS[0]: f"{START}\nR1: Tom has 2 apples and buys 3.\n{END}", QUESTIONS[1]: "I cannot do that.",
            QUESTIONS[2]: f"{START}\nR3: one cat meets one cat.\n{END}"}
ANSWERS = {"Q1": "\\boxed{5}", "R1": "\\boxed{5}", "Q3": "\\boxed{2}", "R3": "so \\boxed{3}"}


class TextEngine:
    """Reads each prompt as text (one id per character): a rephrasing request gets the rewrite of
    its question (REWRITES), any other prompt the answer (ANSWERS) of the question it holds."""
    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        assert seeds is not None and len(set(seeds)) == len(prompt_ids)      # a stream of its own per request
        groups = []
        for p in prompt_ids:
            text = "".join(map(chr, p))
            if text.startswith("Rewrite the math problem"):
                reply = REWRITES[text.split("Problem:\n")[1]]
            else:
                reply = next(a for key, a in ANSWERS.items() if key in text)
            groups.append([Sample([], [], [], reply, True)] * n)
        return groups


def _chars(text):
    return [ord(c) for c in text]


def test_rephrase_drops_responses_without_markers(capsys):
    kept = rephrase.rephrase(TextEngine(), _chars, _chars, QUESTIONS)
    assert kept == [(0, QUESTIONS[0], "R1: Tom has 2 apples and buys 3."),
                    (2, QUESTIONS[2], "R3: one cat meets one cat.")]
    assert ("dropped 1 of 3 responses without text between the markers; the first: 'I cannot do that.'"
            in capsys.readouterr().out)


def test_answer_check_drops_pairs_whose_majorities_disagree(capsys):
    kept = rephrase.rephrase(TextEngine(), _chars, _chars, QUESTIONS, check_answers=3)
    assert [i for i, _, _ in kept] == [0]                 # Q3 says 2, its rephrasing says 3
    assert ("dropped 1 of 2 pairs (0 without a majority answer on one side, 1 whose majorities differ)"
            in capsys.readouterr().out)


def test_rephrased_pairs_are_written_in_the_pair_format(tmp_path):
    kept = [(0, QUESTIONS[0], "R1: Tom has 2 apples and buys 3."), (2, QUESTIONS[2], "R3: one cat meets one cat.")]
    path = str(tmp_path / "out" / "pairs.parquet")
    rephrase.write_pairs(path, kept, ["5", "20", "2"])
    assert data.load_pairs(path) == [data.Pair(QUESTIONS[0], "R1: Tom has 2 apples and buys 3.", "5"),
                                     data.Pair(QUESTIONS[2], "R3: one cat meets one cat.", "2")]
    assert list(pd.read_parquet(path)["idx"]) == [0, 2]


def test_questions_to_rephrase_come_from_a_file_or_a_shipped_set(tmp_path):
    path = str(tmp_path / "questions.parquet")
    pd.DataFrame({"problem": ["What is 2+3?", "What is 4*5?"], "answer": [5.0, 20.0]}).to_parquet(path)
    assert rephrase.load_questions(path) == (["What is 2+3?", "What is 4*5?"], ["5", "20"])
    assert rephrase.load_questions("aime25", limit=2) == ([p.question for p in data.load_benchmark("aime25", 2)],
                                                          ["70", "588"])
    pd.DataFrame({"text": ["What is 2+3?"]}).to_parquet(path)
    with pytest.raises(ValueError, match="questions.parquet: no 'question' or 'problem' column"):
        rephrase.load_questions(path)


def test_a_question_set_in_each_format_loads_with_its_named_columns(tmp_path):
    """Plain questions (no rephrasings) from JSON, JSONL or parquet, under any of the accepted
    column names; an empty answer is kept unlabeled."""
    rows = [{"question": "What is 1+1?", "answer": "2"}, {"question": "What is 2+3?", "answer": 5.0},
            {"question": "And 4+4?", "answer": ""}]
    (tmp_path / "q.json").write_text(json.dumps(rows))
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"problem": r["question"], "solution": r["answer"]}) + "\n"
                                              for r in rows))
    pd.DataFrame([{"prompt": r["question"], "ground_truth": str(r["answer"])} for r in rows]).to_parquet(
        tmp_path / "q.parquet")
    for name in ("q.json", "q.jsonl", "q.parquet"):
        pairs, test_time = data.load_training(str(tmp_path / name), "original")
        assert [(p.original, p.rephrased, p.answer) for p in pairs] == \
            [("What is 1+1?", None, "2"), ("What is 2+3?", None, "5"), ("And 4+4?", None, None)], name
        assert not test_time
    assert data.QUESTION_COLUMNS == ("question", "problem", "prompt")
    assert data.ANSWER_COLUMNS == ("answer", "solution", "ground_truth")


def test_a_question_set_without_its_columns_or_rephrasings_is_refused(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "What is 1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"needs a question column \(one of \['question', 'problem', 'prompt'\]\)"):
        data.load_training(str(tmp_path / "bad.jsonl"), "original")
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="has no rephrased questions, and --views both"):
        data.load_training(str(tmp_path / "q.jsonl"), "both")


def test_pairs_of_your_own_in_json_jsonl_or_parquet_load_under_any_accepted_column_names(tmp_path):
    """A file whose rows have a rephrasing column is a pair file, whatever its form: the official names
    (original_question, rephrased_question, solution) or the plain ones (question, rephrased, answer)."""
    rows = [("What is 1+1?", "Add one to one.", "2"), ("What is 2+3?", "Sum two and three.", "5")]
    official = [dict(zip(data.PAIR_COLUMNS, r)) for r in rows]
    plain = [{"question": q, "rephrased": r, "answer": a} for q, r, a in rows]
    (tmp_path / "official.json").write_text(json.dumps(official))
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain))
    pd.DataFrame(plain).to_parquet(tmp_path / "plain.parquet")
    for name in ("official.json", "plain.jsonl", "plain.parquet"):
        pairs, test_time = data.load_training(str(tmp_path / name), "both")
        assert [(p.original, p.rephrased, p.answer) for p in pairs] == rows and not test_time, name
    broken = [dict(r, rephrased=" ") if i == 1 else r for i, r in enumerate(plain)]
    (tmp_path / "broken.jsonl").write_text("".join(json.dumps(r) + "\n" for r in broken))
    with pytest.raises(ValueError, match="broken.jsonl: row 1: rephrased: the question must be a non-empty string"):
        data.load_training(str(tmp_path / "broken.jsonl"), "both")


def test_two_verl_files_of_your_own_are_a_pair_checked_for_alignment(tmp_path):
    """--data ORIGINALS.parquet,REPHRASINGS.parquet: the official scripts' train_files and train_aug_files."""
    a = _pair_file(tmp_path, _verl_rows(["q1", "q2"], ["1", "2"]), "train_original.parquet")
    b = _pair_file(tmp_path, _verl_rows(["r1", "r2"], ["1", "2"]), "train_rewrite.parquet")
    pairs, _ = data.load_training(f"{a},{b}", "both")
    assert pairs == [data.Pair("q1", "r1", "1"), data.Pair("q2", "r2", "2")]
    swapped = _pair_file(tmp_path, _verl_rows(["r2", "r1"], ["2", "1"]), "swapped.parquet")
    with pytest.raises(ValueError, match=r"misaligned pair files: row 0: ground truth '1' in .*train_original.parquet "
                                         r"but '2' in .*swapped.parquet"):
        data.load_training(f"{a},{swapped}", "both")
    with pytest.raises(ValueError, match="two files name a verl pair, ORIGINALS.parquet,REPHRASINGS.parquet"):
        data.load_training(f"{a},{b},{b}", "both")


def test_a_file_without_rephrasings_is_refused_with_the_forms_that_carry_them(tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError) as refused:
        data.load_training(str(tmp_path / "q.jsonl"), "both")
    message = str(refused.value)
    assert "a parquet, JSON or JSONL file with a rephrasing column (one of ['rephrased_question', 'rephrased'])" in message
    assert "--data ORIGINALS.parquet,REPHRASINGS.parquet" in message


def test_training_on_a_benchmark_is_test_time_training():
    pairs, test_time = data.load_training("amc23", "original")
    assert test_time and len(pairs) == 40 and all(p.rephrased is None for p in pairs)
    assert [p.original for p in pairs] == [p.question for p in data.load_benchmark("amc23")]
    with pytest.raises(ValueError, match="has no rephrased questions"):
        data.load_training("amc23", "both")
    pairs, test_time = data.load_training("openrs", "original")            # a pair file: rephrasings kept
    assert not test_time and pairs[0].rephrased is not None


@pytest.mark.parametrize("value, gold", [
    (1e20, "100000000000000000000"), (142.0, "142"), (2.5, "2.5"), (1e-7, "0.0000001"), (-3.0, "-3"),
    (np.float64(64.0), "64"), (np.int64(7), "7"), (12, "12"), ("025", "25"),
])
def test_numbers_as_gold_answers_are_written_as_a_reader_would(value, gold):
    assert data.answer_text(value, "row 1") == gold


def test_a_worked_solution_gives_its_last_box_or_is_refused(tmp_path):
    """A question set with only `problem` and `solution` columns, as MATH ships them: the solution's
    last \\boxed{} is the gold answer; a worked solution without one is refused, naming the row."""
    worked = "The perimeter is $2(3 + 4) = 14$, so half of it is $\\boxed{7}$."
    (tmp_path / "q.jsonl").write_text(json.dumps({"problem": "Half the perimeter of a 3 by 4 rectangle?",
                                                  "solution": worked}) + "\n")
    (pairs, _), = [data.load_training(str(tmp_path / "q.jsonl"), "original")]
    assert pairs[0].answer == "7"
    unboxed = ("We add the two sides, three and four, which gives seven, and then we double it to get the "
               "perimeter of the whole rectangle, and finally we halve it again to answer.")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "?", "solution": "6"}) + "\n"
                                        + json.dumps({"problem": "?", "solution": unboxed}) + "\n")
    with pytest.raises(ValueError, match=r"row 1: the gold answer looks like a worked solution \(2[0-9] words"):
        data.load_training(str(tmp_path / "bad.jsonl"), "original")
    # the longest answers the shipped sets hold are no worked solutions
    assert data.answer_text("\\text{Softball, Kickball, Picnic}", "row 1") == "\\text{Softball, Kickball, Picnic}"


def test_every_bad_row_is_named_in_one_message(tmp_path):
    """Rows 0 and 2 cannot be read (an empty question, a worked solution as the answer): one error names
    both, so that one fix of the file is enough; the good row does not appear."""
    path = _pair_file(tmp_path, [{**GOOD, "original_question": ""}, GOOD,
                                 {**GOOD, "solution": "First add the numbers, then " * 10 + "5"}])
    with pytest.raises(ValueError) as error:
        data.load_pairs(path)
    message = str(error.value)
    assert message.startswith("2 row(s) cannot be read: ")
    assert "row 0: original_question" in message and "row 2: the gold answer looks like a worked solution" in message
    assert "row 1" not in message


def test_rephrase_noise_gives_a_share_of_the_pairs_another_questions_rephrasing():
    """--rephrase_noise: round(P x N) pairs, each with the rephrasing of another drawn pair (a cycle among them), the
    rest untouched, the originals and gold answers kept; the same draw for the same seed, another for another seed;
    and a draw independent of the run's question order (train.Questions, seeded by the same seed): the first steps
    take about the share, not only mismatched pairs."""
    import train
    pairs = data.classroom_pairs("train")
    noisy, line = data.mismatch_rephrasings(pairs, 0.25, 0)
    changed = [i for i, (a, b) in enumerate(zip(pairs, noisy)) if a.rephrased != b.rephrased]
    assert len(changed) == 375 and line.startswith("--rephrase_noise 0.25: 375 of the 1500 training pairs")
    assert all((a.original, a.answer) == (b.original, b.answer) for a, b in zip(pairs, noisy))
    assert sorted(noisy[i].rephrased for i in changed) == sorted(pairs[i].rephrased for i in changed)
    assert data.mismatch_rephrasings(pairs, 0.25, 0)[0] == noisy != data.mismatch_rephrasings(pairs, 0.25, 1)[0]
    assert data.mismatch_rephrasings(pairs, 0.0, 0)[0] == pairs
    assert len([i for i, (a, b) in enumerate(zip(pairs, data.mismatch_rephrasings(pairs, 1.0, 0)[0]))
                if a.rephrased != b.rephrased]) == 1500
    questions = train.Questions.shuffled(noisy, 0)
    first = [i for _ in range(5) for i in questions.take(16, 0, 1)[0]]
    assert 0 < sum(i in set(changed) for i in first) < 40          # 25% of 80 is 20


def test_the_datas_notices_print_once_on_rank_0(monkeypatch, capsys):
    """Every rank reads the data; the gold-less rows and the dropped prompts are said once, by rank 0 (on a node of 8
    they printed 8 times)."""
    import torch.distributed as dist
    pairs = [data.Pair("a", "b", None), data.Pair("c", "d", "1")]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for rank in (1, 0):
        monkeypatch.setattr(dist, "get_rank", lambda: rank)
        data.report_unlabeled(pairs, "f.parquet")
        data.drop_long(pairs, lambda pair: [[0] * len(pair.original) * (1 + (pair.answer is None))], 1, "pairs")
        assert capsys.readouterr().out == ("" if rank else
                                           "f.parquet: 1 of 2 pairs have no gold answer (rows [0]); kept: the label-free "
                                           "rewards do not read it, `gt` and the metrics count them unlabeled\n"
                                           "dropped 1 of 2 pairs whose prompt exceeds 1 tokens\n")
