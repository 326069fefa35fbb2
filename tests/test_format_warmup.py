"""The format warm-up of a real chat model (tools/format_warmup.py) and the baseline of a model before RL
(study/baseline.py): what each warm-up example teaches, and on which questions; the baseline's lenient grade; and
its committed tables, written from their results."""
import glob
import json
import os
import random

import pytest

from harness import data
from harness import world
from harness.answers import extract_answer
from baseline import last_number, table
from conftest import ROOT
from format_warmup import solution_text, warmup_batch


class CharChatTokenizer:
    """One id per character; a chat template that writes `role: content` lines; `#` ends a turn."""
    chat_template = "role: content"
    eos_token, eos_token_id, pad_token_id = "#", ord("#"), 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        return [ord(c) for c in "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"]


def text(ids):
    return "".join(chr(i) for i in ids if i)


def test_plain_english_joins_the_punctuation_the_world_sets_apart():
    assert world.plain_english("Tom has 3 boxes , 4 pens in each . How many pens ?") == \
        "Tom has 3 boxes, 4 pens in each. How many pens?"


def test_an_example_is_a_warmup_question_asked_as_training_asks_it_and_the_loss_is_on_its_worked_solution():
    tokenizer = CharChatTokenizer()
    encode = data.prompt_encoder(tokenizer, True)
    problems = world.make_split("warmup")
    ids, mask = warmup_batch(problems, encode, tokenizer, random.Random(0), batch=6)
    held_out = {p.maths for split in ("train", "test") for p in world.make_split(split)}
    for row, weights in zip(ids.tolist(), mask.tolist()):
        start, end = weights.index(1), len(weights) - weights[::-1].index(1)
        assert set(weights[start:end]) == {1} and not any(weights[end:])          # one span, then padding only
        prompt, response = text(row[:start]), text(row[start:end])
        problem = next(p for p in problems if prompt in (text(encode(p.original)), text(encode(p.rephrased))))
        assert problem.maths not in held_out                   # no train or test question's mathematics
        assert response == solution_text(problem, tokenizer) and response.endswith("#")
        assert extract_answer(response) == problem.answer and " ." not in response     # in plain English


def test_the_last_number_is_what_the_response_ends_on():
    assert last_number("4 * 7 = 28, and 28 + 5 = 33. So Tom has 33 pencils.") == "33"
    assert last_number("It costs $1,250.50.") == "1250.50"
    assert last_number("The answer is -3") == "-3"
    assert last_number("no numbers here") is None


BASELINES = sorted(glob.glob(os.path.join(ROOT, "study", "**", "baseline.json"), recursive=True))


@pytest.mark.parametrize("path", BASELINES, ids=[os.path.relpath(p, ROOT) for p in BASELINES])
def test_a_committed_baseline_table_is_its_results(path):
    results = json.load(open(path))
    assert open(path.replace(".json", ".md")).read() == table(results["rows"], results["k"]) + "\n"
