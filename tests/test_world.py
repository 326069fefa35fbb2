"""The classroom world: disjoint splits, faithful rephrasings, a tokenizer that round-trips."""
import re

from harness import world
from harness.answers import extract_answer


def test_splits_are_disjoint_and_deterministic():
    splits = {s: world.make_split(s) for s in ("warmup", "train", "test")}
    keys = {s: {p.maths for p in ps} for s, ps in splits.items()}
    assert len(splits["test"]) == 200 and len(splits["train"]) == 1500 and len(splits["warmup"]) > 2000
    assert (not keys["train"] & keys["test"] and not keys["warmup"] & keys["test"]
            and not keys["warmup"] & keys["train"])
    assert world.make_split("test") == splits["test"]


def distractor(question):
    """(number, is a trap) of the question's distractor: the sentence just before the question."""
    sentence = question.split(" . ")[-2] + " ."
    for text, trap in world.DISTRACTORS:
        pattern = re.escape(text).replace(r"\{d\}", r"(\d+)").replace(r"\{n\}", r"\w+").replace(r"\{it\}", r"\w+")
        if m := re.fullmatch(pattern, sentence):
            return int(m.group(1)), trap
    raise AssertionError(f"no distractor in {question!r}")


def test_views_share_numbers_and_answer_but_not_wording():
    kinds = []
    for p in world.make_split("train")[:300]:
        assert p.original != p.rephrased
        shape, a, b, c = p.maths
        # each view: the problem's three numbers and its own distractor number
        nums = lambda q: sorted(int(x) for x in re.findall(r"\d+", q))
        (d1, trap1), (d2, trap2) = distractor(p.original), distractor(p.rephrased)
        assert nums(p.original) == sorted([a, b, c, d1]) and nums(p.rephrased) == sorted([a, b, c, d2])
        assert d1 != d2 and c not in (d1, d2)
        assert p.traps == (d1 if trap1 else None, d2 if trap2 else None)
        assert extract_answer(world.worked_solution(*p.maths)[0]) == p.answer
        # the scenario changes: the counted things differ between views
        items = {s[2] for s in world.SCENARIOS}
        assert {w for w in p.original.split() if w in items} != {w for w in p.rephrased.split() if w in items}
        kinds.append(trap1 + trap2)
    # one view trapped and the other not is the most common case; none and both occur too
    assert (kinds.count(1) > 0.5 * len(kinds) and kinds.count(0) > 0.1 * len(kinds)
            and kinds.count(2) > 0.1 * len(kinds))


def test_copying_a_trap_gives_another_whole_number():
    for p in world.make_split("train"):
        shape, a, b, c = p.maths
        for trap in filter(None, p.traps):
            copied = world.worked_solution(shape, a, b, trap)[1]
            assert copied >= 0 and str(copied) != p.answer


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


def test_the_warm_up_copies_traps_at_its_stated_rate_and_nothing_else():
    import random
    tok = world.build_tokenizer()
    problems = world.make_split("warmup")
    rng = random.Random(0)

    def copy_rate(problems, batches=6):
        copies = total = 0
        for _ in range(batches):
            ids, mask = world.warmup_batch(tok, problems, rng, 64)
            for row, m, in zip(ids, mask):
                text = tok.decode(row[m.bool()])
                prompt = tok.decode(row[:int(m.argmax())])
                p = next(p for p in problems if world.format_prompt(p.original) == prompt
                         or world.format_prompt(p.rephrased) == prompt)
                trap = p.traps[world.format_prompt(p.rephrased) == prompt]
                answer = extract_answer(text)
                right = str(world.worked_solution(*p.maths)[1])
                copied = None if trap is None else str(world.worked_solution(*p.maths[:3], trap)[1])
                assert answer in (right, copied)
                copies += answer == copied; total += 1
        return copies / total

    both_trapped = [p for p in problems if None not in p.traps]
    harmless = [p for p in problems if p.traps == (None, None)]
    assert abs(copy_rate(both_trapped) - world.WARMUP["trap_copy"]) < 0.1     # 384 draws: 4.3 standard errors
    assert copy_rate(harmless, batches=2) == 0
