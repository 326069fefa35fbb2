"""Benchmark of answer grading: accuracy and speed of three graders.

Each gold answer of the shipped eval sets (data/eval/) is paired with
perturbed forms of itself: forms that are equal as mathematics (`0.5` for
`\\frac12`, `025` for `25`, `142` for `142.0`, `\\dfrac`, `1,000`, an `x =`
prefix, unit text, ...) and forms that are different (+1, x10, swapped tuple,
other bracket, ...).  Each grader judges every pair; the table shows how often
it was right on each kind, and how many pairs it judges per second.

Graders: `answers.is_equiv` (ours), math-verify (`pip install math-verify`),
and the official Co-rewarding match, raw-string `==`.  Then it times
`majority_vote` over 128 prompts x 8 answers, as one training step would, and
the worst cases: adversarial answers (towers of powers, deep nesting, huge
lists, a long chain of inequalities, nested sums and subscripts, nested
exponentials, functions of huge arguments, huge factorials and binomials;
tests/test_answers.py checks that each is refused before evaluation or read
within bounds, this shows what that costs) and the extraction from a long
response.

    .venv/bin/python bench/grader.py
"""

import json
import random
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import answers  # noqa: E402

EVAL_DIR = ROOT / "data" / "eval"
WORST_CASES = ["9^9^9^9", "2^{2^{2^{2^{2^{2}}}}}", "10^{10^{10}}", "((((2^{1000})^{1000})^{1000})^{1000})",
               "(x+y+z+w)^{1000}", "\\sin(10^{4000})", "{" * 500 + "1" + "}" * 500, "x" * 10_000, "1," * 5_000,
               ",".join(f"x+{k}" for k in range(60)), "\\sqrt{" + "9" * 280 + "}",
               "<".join(f"x^{{{k}}}" for k in range(1, 21)), "\\sum_{k=1}^{n}" * 40 + "k", "x_{" * 15 + "1" + "}" * 15,
               "\\exp(\\exp(\\exp(\\exp(5))))", "\\sin(\\exp(\\exp(\\exp(5))))", "(10^{10})!",
               "\\binom{10^{12}}{10^{6}}", "\\Gamma(\\Gamma(\\Gamma(10)))"]


def load_gold_answers():
    """Gold answer strings of every shipped eval set, as the files write them."""
    gold = []
    for name in ("math500.json", "amc.json", "aime24.json", "aime25.json"):
        gold += [str(row["answer"]) for row in json.loads((EVAL_DIR / name).read_text())]
    for line in (EVAL_DIR / "amc23.jsonl").read_text().splitlines():
        gold.append(str(json.loads(line)["answer"]))  # a float such as 27.0
    for line in (EVAL_DIR / "gsm8k_test.jsonl").read_text().splitlines():
        gold.append(json.loads(line)["answer"].split("####")[-1].strip())
    return gold


def plain_number(gold):
    """Exact value of an integer/decimal/simple-fraction gold answer, else None."""
    text = gold.replace("\\!", "").replace(" ", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", text):
        text = text.replace(",", "")
    text = re.sub(r"^(-?)\\[dt]?frac\{?(\d+)\}?\{?(\d+)\}?$", r"\1\2/\3", text)
    if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/\d+)?", text):
        return Fraction(text)
    return None


def equal_forms(gold):
    """Forms a mathematician reads as the same answer."""
    forms = {gold.replace("\\frac", "\\dfrac"), re.sub(r"\s*([-+=,()])\s*", r"\1", gold),
             gold.replace("\\left", "").replace("\\right", "")}
    value = plain_number(gold)
    if value is not None:
        forms |= {f"{value.numerator}/{value.denominator}", f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
                  f"{gold} \\text{{ units}}", f"x = {gold}"}
        if value.denominator == 1:
            n = value.numerator
            forms |= {str(n), f"{n}.0", f"{n:,}", f"\\${n}"} | ({f"{n:03d}"} if 0 <= n < 100 else set())
        elif 1_000_000 % value.denominator == 0:  # a terminating decimal
            forms.add(str(float(value)))
    forms.add(re.sub(r"(?<![\d ])\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", gold))  # \frac{a}{b} -> (a)/(b)
    forms.add(re.sub(r"(\d) ?(\\pi|\\sqrt|[a-z](?![a-z]))", r"\1\\cdot \2", gold))  # 2x -> 2\cdot x
    two_terms = re.fullmatch(r"([^-+=,{}]+)\+([^-+=,{}]+)", gold)
    if two_terms:
        forms.add(f"{two_terms.group(2)}+{two_terms.group(1)}")  # a+b -> b+a
    if re.fullmatch(r"-?\d+(, ?-?\d+)+", gold) and plain_number(gold) is None:
        forms.add(",".join(reversed(gold.split(","))))  # a list of solutions, other order
    if gold.endswith("^\\circ"):
        forms.add(gold[:-len("^\\circ")])
    return sorted(forms - {gold})


def different_forms(gold):
    """Forms that are different answers."""
    value = plain_number(gold)
    if value is not None:
        forms = {str(value + 1), str(value * 10 if value else 7), str(-value if value else -3)}
        if value.denominator != 1:
            forms.add(str(1 / value))  # the reciprocal
        return sorted(forms)
    forms = set()
    pair = re.fullmatch(r"\(([^,()]+),([^,()]+)\)", gold.replace("\\left", "").replace("\\right", ""))
    if pair and pair.group(1).strip() != pair.group(2).strip():
        forms.add(f"({pair.group(2)},{pair.group(1)})")  # swapped tuple
    if re.fullmatch(r"\(.*\)", gold):
        forms.add("[" + gold[1:])  # other bracket
    if "," not in gold and "\\cup" not in gold and "\\begin" not in gold and "=" not in gold:
        forms |= {gold + "+1", "2(" + gold + ")"}
    if "+" in gold:
        forms.add(gold.replace("+", "-", 1))
    return sorted(forms - {gold})


def make_pairs(gold_answers):
    pairs = [(g, f, True) for g in gold_answers for f in equal_forms(g)]
    return pairs + [(g, f, False) for g in gold_answers for f in different_forms(g)]


def clear_caches():
    """Time the graders cold: every answer of a training step is new text (the helper
    process that runs sympy stays started: it starts once per run, not per step)."""
    answers.clear_caches()


def score(judge, pairs):
    """(fraction right on equal pairs, on different pairs, pairs per second)."""
    start = time.perf_counter()
    verdicts = [judge(a, b) for a, b, _ in pairs]
    seconds = time.perf_counter() - start
    right_equal = [v for v, (_, _, same) in zip(verdicts, pairs) if same]
    right_different = [not v for v, (_, _, same) in zip(verdicts, pairs) if not same]
    return (sum(right_equal) / len(right_equal), sum(right_different) / len(right_different),
            len(pairs) / seconds)


def math_verify_judge():
    """math-verify's verdict function, or None (with a message) if it is absent."""
    try:
        from math_verify import parse, verify
    except ImportError:
        print("math-verify is not installed: `.venv/bin/pip install math-verify` "
              "to add its column; skipping it.")
        return None

    def judge(a, b):
        return verify(parse("\\boxed{" + a + "}"), parse("\\boxed{" + b + "}"))

    # Its timeouts use signal.alarm; see whether that works off the main thread.
    with ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(judge, "\\frac12", "0.5").result()
            print("math-verify in a worker thread: works")
        except ValueError as error:
            print(f"math-verify in a worker thread: fails ({error})")
    return judge


def main():
    gold = load_gold_answers()
    pairs = make_pairs(gold)
    n_equal = sum(same for _, _, same in pairs)
    print(f"{len(gold)} gold answers -> {n_equal} equal pairs, {len(pairs) - n_equal} different pairs\n")
    graders = {"ours (answers.is_equiv)": answers.is_equiv,
               "official raw ==": lambda a, b: a.strip() == b.strip()}
    answers.is_equiv("x+1", "1+x")  # start the helper process that runs sympy: once per run, not timed
    verifier = math_verify_judge()
    if verifier is not None:
        graders["math-verify"] = verifier
    print(f"\n{'grader':<26}| {'equal pairs right':>17} | {'different right':>15} | {'pairs/s':>9}")
    print("-" * 26 + "|" + "-" * 19 + "|" + "-" * 17 + "|" + "-" * 10)
    for name, judge in graders.items():
        clear_caches()
        equal_right, different_right, rate = score(judge, pairs)
        print(f"{name:<26}| {equal_right:>17.1%} | {different_right:>15.1%} | {rate:>9,.0f}")

    clear_caches()
    misses = [(a, b, same) for a, b, same in pairs if answers.is_equiv(a, b) != same]
    print(f"\nours wrong on {len(misses)} pairs" + (", e.g.:" if misses else ""))
    for a, b, same in misses[:40]:
        print(f"  {'should be equal' if same else 'should differ':<16} {a!r} vs {b!r}")
    if verifier is not None:
        misses = [(a, b, same) for a, b, same in pairs if verifier(a, b) != same]
        print(f"math-verify wrong on {len(misses)} pairs" + (", e.g.:" if misses else ""))
        for a, b, same in misses[:10]:
            print(f"  {'should be equal' if same else 'should differ':<16} {a!r} vs {b!r}")

    # One training step: 128 prompts x 8 sampled answers, mostly short numbers.
    rng = random.Random(0)
    groups = []
    for g in rng.sample(gold, 128):
        choices = [g] + equal_forms(g) + different_forms(g) + [None]
        groups.append([rng.choice(choices) for _ in range(8)])
    clear_caches()
    start = time.perf_counter()
    for group in groups:
        answers.majority_vote(group)
    seconds = time.perf_counter() - start
    print(f"\nmajority_vote, 128 prompts x 8 answers, cold caches: {seconds * 1000:.0f} ms "
          f"({1024 / seconds:,.0f} answers/s)")

    print("\nworst cases, cold caches (is_equiv to 1 and to itself + 1, a vote, an extraction):")
    for answer in WORST_CASES:
        clear_caches()
        start = time.perf_counter()
        answers.is_equiv(answer, "1"), answers.is_equiv(answer, answer + "+1")
        answers.majority_vote([answer, "2", answer + "1"])
        answers.extract_answer("\\boxed{" + answer + "}")
        shown = answer if len(answer) <= 40 else answer[:37] + "..."
        print(f"  {shown:<42} {(time.perf_counter() - start) * 1000:8.1f} ms")
    response = "Let me think. " * 700 + "\\boxed{" * 300 + "\\boxed{42}"
    start = time.perf_counter()
    answers.extract_answer(response)
    print(f"  extraction from a {len(response):,}-character response: {(time.perf_counter() - start) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
