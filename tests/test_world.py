"""The classroom world: disjoint splits, faithful rephrasings, a tokenizer that round-trips."""
import re

import world
from rewards import extract_answer


def test_splits_are_disjoint_and_deterministic():
    splits = {s: world.make_split(s) for s in ("warmup", "train", "test")}
    keys = {s: {p.maths for p in ps} for s, ps in splits.items()}
    assert len(splits["test"]) == 200 and len(splits["train"]) == 1500 and len(splits["warmup"]) > 2000
    assert not keys["train"] & keys["test"] and not keys["warmup"] & keys["test"] and not keys["warmup"] & keys["train"]
    assert world.make_split("test") == splits["test"]


def test_views_share_numbers_and_answer_but_not_wording():
    for p in world.make_split("train")[:200]:
        assert p.original != p.rephrased
        nums = lambda q: sorted(int(x) for x in re.findall(r"\d+", q))
        assert nums(p.original) == nums(p.rephrased)
        assert extract_answer(world.worked_solution(*p.maths)[0]) == p.answer
        # the scenario changes: the counted things differ between views
        items = {s[2] for s in world.SCENARIOS}
        assert {w for w in p.original.split() if w in items} != {w for w in p.rephrased.split() if w in items}


def test_solutions_are_right():
    assert world.worked_solution("mul_add", 4, 7, 5) == (" 4 * 7 = 28 . 28 + 5 = 33 . The answer is \\boxed{33} .", 33)
    assert world.worked_solution("sub_mul", 9, 4, 3)[1] == 15
    assert world.worked_solution("add_sub", 3, 4, 2)[1] == 5


def test_tokenizer_round_trips_everything_the_world_says():
    tok = world.build_tokenizer()
    for p in world.make_split("test")[:50]:
        text = world.format_prompt(p.rephrased) + world.worked_solution(*p.maths)[0]
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
