"""Tests of answers.py: extraction, equivalence, voting, adversarial input, threads.

Each table row is one case; the equivalence tables are checked both ways round
(a, b) and (b, a), since is_equiv must be symmetric."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from answers import extract_answer, is_equiv, majority_vote

REPO_ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ extraction

EXTRACTIONS = [
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("nested: \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("set: $\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),
    ("first \\boxed{1} then \\boxed{2}", "2"),
    ("\\fbox{7}", "7"),
    ("so $\\boxed 7$.", "7"),
    ("\\boxed {  x = 3 }", "x = 3"),
    ("\\boxed{\\text{(B)}}", "\\text{(B)}"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\boxed{a}\\fbox{b}", "b"),
    ("no box here, the answer is 5", None),
    ("\\boxed{}", None),
    ("\\boxed{   }", None),
    ("\\boxed{\\frac{1}{2}", None),
    ("\\boxed{1} and finally \\boxed{2", None),  # last box unbalanced: no fallback
    ("\\boxedx{3}", None),  # a different command
    ("", None),
    (None, None),
]


@pytest.mark.parametrize("text, expected", EXTRACTIONS)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected

# ----------------------------------------------------------------- equivalence

EQUAL = [
    # integers and decimals
    ("142.0", "142"), ("025", "25"), ("1,000", "1000"), ("-4.0", "-4"), ("0", "0.0"),
    ("10,\\!080", "10080"), ("11,\\! 111,\\! 111,\\! 100", "11111111100"), ("1{,}000", "1000"),
    (".35625", "0.35625"), ("5.", "5"), ("+7", "7"), ("3159.0", "3159"), ("070", "70"),
    # fractions
    ("\\frac12", "\\frac{1}{2}"), ("\\frac{1}{2}", "0.5"), ("\\dfrac{17}{50}", "0.34"),
    ("\\tfrac{3}{4}", "3/4"), ("\\frac 34", "0.75"), ("\\frac9{19}", "9/19"), ("\\frac{270}7", "270/7"),
    ("-\\frac{3}{8}", "-0.375"), ("\\frac{-3}{8}", "-3/8"), ("2/4", "1/2"), ("\\frac{6}{4}", "1.5"),
    ("2\\frac{1}{3}", "7/3"), ("137 \\frac{1}{2}", "137.5"), ("1\\frac{4}{5}", "\\frac{9}{5}"),
    ("-2\\frac{1}{2}", "-2.5"), ("2\\frac{1}{3}", "\\frac{14}{6}"), ("1\\frac{4}{5}", "1.8\\cdot 1"), ("1\\frac{4}{5}+1", "2.8"),
    ("x^2\\frac{1}{2}", "\\frac{x^2}{2}"),
    # radicals, pi, powers
    ("2\\sqrt{2}", "\\sqrt{8}"), ("\\sqrt2", "\\sqrt{2}"), ("11\\sqrt2", "\\sqrt{242}"),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt2}"),
    ("\\sqrt[3]{8}", "2"), ("\\frac{\\pi}{2}", "0.5\\pi"), ("12\\pi", "\\pi \\cdot 12"),
    ("288 \\pi", "288\\pi"), ("2^{10}", "1024"), ("6.72\\times10^{-5}", ".0000672"),
    ("\\frac{20000}{\\pi}", "20000/\\pi"), ("18+2\\pi", "2\\pi+18"), ("3\\sqrt{13}", "\\sqrt{117}"),
    # expressions
    ("x+1", "1+x"), ("(a+5)(b+2)", "ab+2a+5b+10"), ("15x - 80", "-80+15x"), ("2k+2", "2(k+1)"),
    ("x^2-1", "(x-1)(x+1)"), ("\\frac{11+9a}{20}", "\\frac{9a+11}{20}"), ("\\cot x", "\\frac{\\cos x}{\\sin x}"),
    ("\\sin^2 x + \\cos^2 x", "1"), ("3R^2", "3 R^2"), ("-2 + 7i", "7i - 2"), ("i^2", "-1"),
    ("e^{\\ln 2}", "2"), ("\\left(\\frac{1}{2}\\right)^2", "\\frac14"),
    # degrees, percent, dollars, units, `x =`
    ("30^\\circ", "30"), ("120^{\\circ}", "120"), ("50\\%", "50"), ("\\$18.90", "18.9"), ("\\$5", "5"),
    ("\\$32,\\!348", "32348"), ("5 \\text{ cm}", "5"), ("15\\mbox{ cm}^2", "15"), ("864 \\mbox{ inches}^2", "864"),
    ("5.4 \\text{ cents}", "5.4"), ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"), ("7 inches", "7"),
    ("x = 3", "3"), ("x=5", "5"), ("y = 2x + 3", "2x+3"), ("y=-2x", "-2x"), ("x \\in [-2,7]", "[-2,7]"),
    ("5x - 7y + 11z + 4 = 0", "-5x + 7y - 11z - 4 = 0"),
    # tuples, intervals, matrices
    ("(1,2)", "(1, 2)"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac\\pi2)"),
    ("(1,-16,-4,43)", "(1.0, -16, -4, 43)"), ("(-\\infty, 0]", "(-\\infty,0]"), ("[1,2)", "[1, 2)"),
    ("\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "(0.6,\\frac83]"),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(3,\\infty)\\cup(-\\infty,2)"),
    ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix}0.2\\\\-3.6\\end{pmatrix}"),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}"),
    ("(5)", "5"),
    # sets and lists
    ("\\{1,2\\}", "\\{2,1\\}"), ("3, 5, 7", "7,3,5"), ("-2,1", "1, -2"), ("\\{1,2\\}", "1,2"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1-\\sqrt5, 1+\\sqrt5\\}"), ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),
    ("3 \\pm 2 \\sqrt{2}", "3-\\sqrt8,3+\\sqrt8"), ("\\pm 3", "3, -3"),
    # multiple choice and words
    ("(B)", "B"), ("\\text{(B)}", "B"), ("\\textbf{(C)}", "(C)"), ("\\text{Evelyn}", "Evelyn"),
    ("\\text{east}", "East"), ("\\text{ellipse}", "ellipse"),
    # spacing and LaTeX noise
    ("\\displaystyle\\frac{1}{2}", "1/2"), ("\\frac{1}{2}\\,", "0.5"), ("$\\frac{1}{2}$", "0.5"), ("  42  ", "42"),
    ("4210_{5}", "4210_{5}"),
]

DIFFERENT = [
    # numbers
    ("1/2", "2"), ("3", "30"), ("25", "250"), ("142", "142.5"), ("0.5", "0.05"), ("1,000", "1"),
    ("-4", "4"), ("1.414", "\\sqrt{2}"), ("0.333", "\\frac13"), ("3.14", "\\pi"), ("3.14159", "\\pi"),
    ("2\\frac{1}{3}", "\\frac23"), ("1\\frac{4}{5}", "0.8\\cdot 1"), ("1\\frac{4}{5}", "1(4)/(5)"),
    ("1\\frac{4}{5}", "1\\frac{4}{5}+1"), ("x^2\\frac{1}{2}", "x^2+\\frac{1}{2}"), ("\\frac{1}{2}", "\\frac{2}{1}"), ("025", "0.25"), ("7", "7/2"),
    ("50\\%", "0.5"), ("0", "-1"),
    # radicals, pi, powers
    ("2\\sqrt{2}", "\\sqrt{2}"), ("\\sqrt{8}", "8"), ("\\sqrt[3]{8}", "\\sqrt{8}"), ("12\\pi", "12"),
    ("2^{10}", "1000"), ("\\frac{\\pi}{2}", "\\frac{\\pi}{3}"), ("\\sqrt{3}", "\\sqrt{3}+10^{-20}"),
    # expressions
    ("x+1", "x-1"), ("x^2", "x^3"), ("x", "y"), ("2x", "x^2"), ("(a+5)(b+2)", "(a+2)(b+5)"),
    ("\\cot x", "\\tan x"), ("\\sin x", "\\cos x"), ("ab", "a+b"), ("x^2-1", "(x-1)^2"), ("2k", "2k+2"),
    ("1+2i", "1-2i"), ("i", "1"), ("\\frac{1}{x}", "x"), ("e", "2.718281828"),
    # equations
    ("y = 2x + 3", "y = 2x - 3"), ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z - 4 = 0"), ("x = 3", "4"),
    # tuples, intervals, matrices
    ("(1,2)", "(2,1)"), ("[1,2)", "(1,2)"), ("[1,2]", "[1,2)"), ("(1,2)", "\\{1,2\\}"), ("(1,2)", "1,2"),
    ("(1,2,3)", "(1,2)"), ("(-\\infty, 0]", "(-\\infty, 0)"), ("(2,12) \\cup (12,102)", "(2,102)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "[1,2]"),
    # sets
    ("\\{1,2\\}", "\\{1,2,3\\}"), ("\\{1,2\\}", "\\{1,3\\}"), ("1,1,2", "1,2,2"), ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}"),
    # multiple choice and words
    ("(B)", "(C)"), ("A", "B"), ("\\text{(B)}", "\\text{(E)}"), ("even", "odd"), ("east", "west"),
    ("\\text{Evelyn}", "\\text{Navin}"), ("B", "b"),
    # undefined and base-n
    ("\\frac{1}{0}", "\\frac{1}{0}+1"), ("1/0", "2/0"), ("4210_{5}", "4210"),
    # None and empty
    (None, "1"), ("1", None), (None, None), ("", ""), ("", "0"),
]


@pytest.mark.parametrize("a, b", EQUAL)
def test_equal(a, b):
    assert is_equiv(a, b) is True
    assert is_equiv(b, a) is True


@pytest.mark.parametrize("a, b", DIFFERENT)
def test_different(a, b):
    assert is_equiv(a, b) is False
    assert is_equiv(b, a) is False


def test_tables_are_large():
    assert len(EQUAL) + len(DIFFERENT) >= 150

# ---------------------------------------------------------------------- voting

VOTES = [
    (["\\frac12", "0.5", "1/3"], "\\frac12"),  # equivalence, not string equality
    (["1/3", "\\frac12", "0.5"], "\\frac12"),  # the larger class wins though it starts later
    (["3", None, "4", "4", None], "4"),  # None ignored
    ([None, None], None),
    ([], None),
    (["3", "4"], "3"),  # tie: the class whose first member came first
    (["4", "3", "3", "4"], "4"),
    (["142.0", "142", "25", "025", "025"], "25"),
    (["x = 3", "3", "3.0", "4"], "x = 3"),  # the representative is the first member as written
    (["\\sqrt{8}", "2", "2\\sqrt2", "\\sqrt4"], "\\sqrt{8}"),
    (["2", "\\sqrt{4}", "3", "3"], "2"),  # a number and a radical in one class
    (["(1,2)", "(2,1)", "(1, 2)"], "(1,2)"),
    (["\\boxed{", "{" * 500, "5"], "5"),  # unreadable answers are ignored
]


@pytest.mark.parametrize("votes, expected", VOTES)
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


def test_majority_vote_of_a_training_step_is_fast():
    # 128 prompts x 8 answers, mostly short numbers, as one training step votes.
    groups = [[str((p * 7 + r * r) % 13 + p) for r in range(8)] for p in range(128)]
    groups[0] = ["\\frac12", "0.5", "1/2", "0.50", "2/4", "x", "\\dfrac{1}{2}", None]
    start = time.perf_counter()
    winners = [majority_vote(group) for group in groups]
    assert time.perf_counter() - start < 1.0
    assert winners[0] == "\\frac12"
    assert all(winner is not None for winner in winners)

# ----------------------------------------------------------------- adversarial

ADVERSARIAL = [
    "{" * 500 + "1" + "}" * 500,
    "(" * 500 + "1" + ")" * 500,
    "2^{2^{2^{2^{2^{2}}}}}",
    "9^9^9^9",
    "10^{10^{10}}",
    "((((2^{1000})^{1000})^{1000})^{1000})",
    "(x+y+z+w)^{1000}",
    "\\sin(10^{4000})",
    "\\sqrt{" + "9" * 280 + "}",
    "\\frac{1}{2",
    "}}}{{{",
    "x" * 10_000,
    "1," * 5_000,
    ",".join(f"x+{k}" for k in range(60)),
    "\\frac{\\frac{\\frac{\\frac{\\frac{\\frac{\\frac{1}{2}}{3}}{4}}{5}}{6}}{7}}{8}" * 3,
    "\\begin{pmatrix}" + "&" * 300 + "\\end{pmatrix}",
    "\\left(\\right]\\{\\}\\cup\\cup,,,=",
    "__import__('os').system('echo hacked')",
    "\\sqrt[\\sqrt[\\sqrt[2]{2}]{2}]{2}^{\\pi^{\\pi^{\\pi}}}",
]


# Each case is graded in a child process, so that a regression that hangs
# (a huge power holds the interpreter lock; no thread can interrupt it) makes
# these tests fail instead of hanging the whole run.
GRADE_ADVERSARIAL = """
import json, sys, time
from answers import extract_answer, is_equiv, majority_vote
for answer in json.load(sys.stdin):
    start = time.perf_counter()
    verdicts = [is_equiv(answer, "1"), is_equiv(answer, answer + "+1")]
    vote = majority_vote([answer, "2", answer + "1", "\\\\boxed{" + answer])
    extract_answer("\\\\boxed{" + answer + "}" + answer)
    print(json.dumps([answer, time.perf_counter() - start, verdicts, vote]), flush=True)
"""


@pytest.fixture(scope="module")
def adversarial_results():
    """(answer -> [seconds, [is_equiv to "1", to itself + "+1"], vote], the child's stderr)."""
    command = [sys.executable, "-c", GRADE_ADVERSARIAL]
    try:
        child = subprocess.run(command, input=json.dumps(ADVERSARIAL), capture_output=True, text=True,
                               timeout=10 + 2 * len(ADVERSARIAL), cwd=REPO_ROOT)
        output, errors = child.stdout, child.stderr
    except subprocess.TimeoutExpired as timeout:  # its partial output comes back as bytes
        output, errors = (timeout.stdout or b"").decode(), "timed out"
    return {row[0]: row[1:] for row in map(json.loads, output.splitlines())}, errors


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_adversarial_inputs_finish_quickly(answer, adversarial_results):
    results, errors = adversarial_results
    assert answer in results, f"grading this answer hung or crashed: {errors[-2000:]}"
    seconds, verdicts, vote = results[answer]
    assert seconds < 2.0
    assert verdicts == [False, False]
    assert vote in (answer, "2")


def test_long_response_extraction_is_fast():
    response = "Let me think. " * 700 + "\\boxed{" * 300 + "\\boxed{42}"
    start = time.perf_counter()
    assert extract_answer(response) == "42"
    assert time.perf_counter() - start < 1.0

# --------------------------------------------------------------------- threads


def test_is_equiv_in_worker_threads():
    pairs = [("\\frac{1}{2}", "0.5", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("x+1", "x-1", False),
             ("(1,2)", "(2,1)", False), ("\\cot x", "\\frac{\\cos x}{\\sin x}", True), ("9^9^9^9", "1", False)]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda p: is_equiv(p[0], p[1]), pairs * 5))
    assert verdicts == [expected for _, _, expected in pairs] * 5

    result = {}
    thread = threading.Thread(target=lambda: result.update(vote=majority_vote(["\\sqrt{12}", "2\\sqrt3", "3"])))
    thread.start()
    thread.join(timeout=10)
    assert result == {"vote": "\\sqrt{12}"}
