"""Tests of answers.py: extraction, equivalence, voting, adversarial input, the
bounds on sympy's work, threads.

Each table row is one case; the equivalence tables are checked both ways round
(a, b) and (b, a), since is_equiv must be symmetric.  Speed is measured in
bench/grader.py, not here: these tests check the mechanisms that bound the
work (refusals before sympy evaluates anything), and time only the one
guarantee stated in seconds, answers.TIME_LIMIT."""

import contextlib
import math
import random
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest
import sympy
from sympy.core.operations import AssocOp

from harness import answers
from harness.answers import MAX_BITS, extract_answer, is_equiv, majority_vote, normalize

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
    ("-2\\frac{1}{2}", "-2.5"), ("2\\frac{1}{3}", "\\frac{14}{6}"), ("1\\frac{4}{5}", "1.8\\cdot 1"),
    ("1\\frac{4}{5}+1", "2.8"),
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
    ("e^{\\ln 2}", "2"), ("\\left(\\frac{1}{2}\\right)^2", "\\frac14"), ("\\pi r^2", "r^2 \\pi"), ("2i x", "2xi"),
    # degrees, percent, dollars, units, `x =`
    ("30^\\circ", "30"), ("120^{\\circ}", "120"), ("50\\%", "50"), ("\\$18.90", "18.9"), ("\\$5", "5"),
    ("\\$32,\\!348", "32348"), ("5 \\text{ cm}", "5"), ("15\\mbox{ cm}^2", "15"), ("864 \\mbox{ inches}^2", "864"),
    ("5.4 \\text{ cents}", "5.4"), ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"), ("7 inches", "7"),
    ("x = 3", "3"), ("x=5", "5"), ("y = 2x + 3", "2x - y + 3 = 0"), ("y=-2x", "2x + y = 0"),
    ("x \\in [-2,7]", "[-2,7]"),
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
    ("1\\frac{4}{5}", "1\\frac{4}{5}+1"), ("x^2\\frac{1}{2}", "x^2+\\frac{1}{2}"),
    ("\\frac{1}{2}", "\\frac{2}{1}"), ("025", "0.25"), ("7", "7/2"),
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
    ("y = 2x + 3", "2x+3"), ("y=-2x", "-2x"),  # an equation between variables is no bare expression
    # tuples, intervals, matrices
    ("(1,2)", "(2,1)"), ("[1,2)", "(1,2)"), ("[1,2]", "[1,2)"), ("(1,2)", "\\{1,2\\}"), ("(1,2)", "1,2"),
    ("(1,2,3)", "(1,2)"), ("(-\\infty, 0]", "(-\\infty, 0)"), ("(2,12) \\cup (12,102)", "(2,102)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "[1,2]"),
    # sets
    ("\\{1,2\\}", "\\{1,2,3\\}"), ("\\{1,2\\}", "\\{1,3\\}"), ("1,1,2", "1,2,2"),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}"),
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


# ----------------------------------------------- behaviours, equal and different
#
# Mixed numbers, commas, percent words, relations, chains, matrices, units,
# braces, subscripts and sums: each behaviour has its own table of
# (a, b, equal?) rows, checked both ways round, and the near misses (rows that
# must stay different) sit next to the equal rows they resemble.


def assert_verdict(a, b, equal):
    assert is_equiv(a, b) is equal
    assert is_equiv(b, a) is equal


MIXED_NUMBERS = [
    ("4 4/9", "40/9", True), ("4 4/9", "4\\frac{4}{9}", True), ("2 1/2", "2.5", True),
    ("-4 4/9", "-\\frac{40}{9}", True), ("4 4 / 9", "40/9", True),
    ("4 4/9", "44/9", False), ("2 1/2", "21/2", False), ("2 1/2", "1", False),
    # b >= c is ambiguous: compared as text, the digits never joined or multiplied
    ("4 9/4", "4 9/4", True), ("4 9/4", "49/4", False), ("4 9/4", "25/4", False), ("4 9/4", "9", False),
    ("2 3", "23", False), ("2 3", "6", False), ("1 000", "1000", False),
]

COMMAS = [
    ("1,234", "1234", True), ("32,349", "32349", True), ("1,234,567", "1234567", True), ("1,234.5", "1234.5", True),
    ("1,\\!234", "1234", True), ("1{,}234", "1234", True), ("32, 349", "349, 32", True),
    ("1, 234", "\\{1,234\\}", True),
    ("1, 234", "1234", False), ("32, 349", "32349", False), ("1,23", "123", False), ("1,2345", "12345", False),
    ("12,34,567", "1234567", False),
]

PERCENT_WORDS = [
    ("28 percent", "28", True), ("28 pct", "28\\%", True), ("28 percentage", "28", True),
    ("28\\text{ percent}", "28", True),
    (extract_answer("so \\boxed{28 pct}"), "28", True), ("12.5 percent", "\\frac{25}{2}", True),
    ("28 percent", "0.28", False), ("28 pct", "29", False), ("28 percent", "2.8", False),
]

INEQUALITIES = [
    ("x \\le 5", "5 \\ge x", True), ("x < 1", "-x > -1", True), ("x \\leq 5", "x \\le 5", True),
    ("x >= 2", "2 \\leqslant x", True), ("x < 2", "2x < 4", True), ("x<y", "x-y<0", True), ("x < y", "y > x", True),
    ("x<5", "x\\le5", False), ("x < 1", "x > 1", False), ("x < 2", "-2x < -4", False), ("x \\ge 5", "x \\le 5", False),
    ("x < 2", "x < 3", False), ("x^2 < 4", "x < 2", False), ("x<5", "5", False), ("x \\le 5", "x = 5", False),
    # chains: the conjunction of their links, in any order
    ("1 < x < 3", "3 > x > 1", True), ("1 < x < 3", "2 < 2x < 6", True), ("1 < x < 3", "-3 < -x < -1", True),
    ("1 < x \\le 3", "3 \\ge x > 1", True),
    ("1 < x < 3", "1 < x \\le 3", False), ("1 < x < 3", "x > 1", False), ("1 < x < 3", "1 < x < 4", False),
    # no variable: compared as text
    ("\\pi < 4", "\\pi < 4", True), ("1 < 2", "3 < 4", False), ("\\pi < 4", "4 > \\pi", False),
]

EQUATIONS = [
    ("2x+4y-3=0", "y = -\\frac12 x + \\frac34", True), ("2x+4y=3", "4x+8y=6", True), ("x + y = 1", "y = 1 - x", True),
    ("x = y", "y = x", True), ("2x = 6", "x - 3 = 0", True), ("x = 3", "3", True), ("3 = x", "3", True),
    ("x = \\frac{\\pi}{2}", "\\frac\\pi2", True), ("x = 2i", "2i", True),
    ("2x+4y=3", "2x+4y=6", False), ("2x+4y-3=0", "y = \\frac12 x + \\frac34", False), ("x^2 = 4", "x = 2", False),
    ("y = 2x+1", "2x+1", False), ("y = \\frac1x", "xy = 1", False), ("2x = 6", "3", False), ("x = y", "x = 2y", False),
]

CHAINED_EQUALITIES = [
    ("x = 2+3 = 5", "5", True), ("x=2+3=5", "x = 5", True), ("f(x) = (x+1)^2 = x^2+2x+1", "x^2+2x+1", True),
    ("10 \\times 5 = 50", "50", True), ("A = \\frac{1}{2} \\cdot 6 = 3", "3.0", True),
    ("x = 2+3 = 5", "2+3", True),  # 2+3 is 5: the middle is no different answer
    ("x = 2+3 = 5", "6", False), ("x = 5 = 2+4", "5", False), ("10 \\times 5 = 50", "10", False),
    # alternatives and lists are no chains
    ("x = 2 \\text{ or } x = 3", "3", False), ("x = 1, y = 2", "2", False), ("x = 2, x = 3", "2, 3", True),
]

MATRICES = [
    ("\\begin{pmatrix} 1 \\\\ 2 \\\\ \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\\\ \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\\\ \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", False),
    ("\\begin{pmatrix} 1 \\\\ 2 \\\\ \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\\\ 3 \\end{pmatrix}", False),
    ("\\begin{pmatrix} 1 \\\\ \\end{pmatrix}", "\\begin{pmatrix} 1 & 0 \\end{pmatrix}", False),
]

UNITS_AND_PUNCTUATION = [
    ("5 \\textnormal{ cm}", "5", True), ("5\\textnormal{cm}^2", "5", True), ("5 cm.", "5", True),
    ("5 \\text{ cm}.", "5", True), ("7 inches.", "7", True), ("\\text{5 cm}", "5", True),
    (extract_answer("\\boxed{42.}"), "42", True), (extract_answer("\\boxed{42,}"), "42", True),
    ("1, 2,", "2, 1", True),
    ("5 \\textnormal{ cm}", "6", False), ("5 cm.", "0.5", False), ("42,", "420", False),
    ("1,2,3,\\ldots", "1,2,3", False), ("1, 2, 3, ...", "1, 2, 3", False),  # an ellipsis is no trailing period
]

OUTER_BRACES = [
    ("{-2021, 2021}", "\\pm 2021", True), ("{1, 2}", "\\{2, 1\\}", True), ("{1, 2}", "2, 1", True), ("{5}", "5", True),
    ("{-2021, 2021}", "2021", False), ("{-2021, 2021}", "\\pm 2020", False), ("{1, 2}", "(1, 2)", False),
    ("{1, 2}", "\\{1, 2, 3\\}", False),
]

SUBSCRIPTS_AND_SUMS = [
    ("\\sum_{k=0}^{n-1} F_k F_{n-k-1}", "\\sum_{k=0}^{n-1} F_{n-k-1} F_k", True),
    ("\\sum_{k=0}^{n-1} F_k F_{n-k-1}", "\\sum\\limits_{k=0}^{n-1} F_{n-1-k}F_{k}", True),
    ("\\sum_{k=1}^{n} k^2 + 1", "1 + \\sum_{k=1}^{n} k \\cdot k", True),
    ("2\\sum_{k=1}^{n} a_k", "\\sum_{k=1}^{n} a_k + \\sum_{k=1}^{n} a_k", True),
    ("\\prod_{i=1}^{n} x_i", "\\prod_{i=1}^{n} x_{i}", True),
    ("a_1 + a_2", "a_2 + a_1", True), ("(x_1 + x_2)^2", "x_1^2 + 2x_1x_2 + x_2^2", True), ("a_{n+1}", "a_{1+n}", True),
    ("\\log_2 8", "3", True), ("\\log_{2} x", "\\frac{\\ln x}{\\ln 2}", True),
    ("\\sum_{k=0}^{n-1} F_k F_{n-k-1}", "\\sum_{k=0}^{n-1} F_k F_{n-k}", False),
    ("\\sum_{k=0}^{n-1} F_k F_{n-k-1}", "\\sum_{k=0}^{n} F_k F_{n-k-1}", False),
    ("\\sum_{k=1}^{n} k", "\\prod_{k=1}^{n} k", False),
    ("\\sum_{i=1}^{n} i^2", "\\sum_{i=1}^{n} (-1)", False),  # the sum's i is its variable, not sqrt(-1)
    ("x_1", "x_2", False), ("x_1", "x", False), ("x_1", "x1", False), ("a_{n+1}", "a_n + 1", False),
    ("\\log_2 8", "\\log_8 2", False),
    # limits: a closed form, a renamed variable
    ("\\sum_{k=1}^{n} k", "\\frac{n(n+1)}{2}", False), ("\\sum_{k=1}^{n} k", "\\sum_{j=1}^{n} j", False),
]

FACTORIALS_AND_BINOMIALS = [
    ("5!", "120", True), ("(n+1)!", "(n+1) n!", True), ("\\binom{6}{2}", "15", True),
    ("\\dbinom{6}{2}", "\\binom{6}{4}", True), ("\\Gamma(5)", "4!", True), ("\\cosh^2 x - \\sinh^2 x", "1", True),
    ("\\tanh x", "\\frac{\\sinh x}{\\cosh x}", True),
    ("5!", "5", False), ("\\binom{6}{2}", "\\binom{6}{3}", False), ("n!", "n", False), ("(2n)!", "2n!", False),
    ("\\Gamma(5)", "5!", False),
    ("5!!", "15", False),  # limit: a double factorial is not read (compared as text)
]

UNIONS_AND_ALTERNATIVES = [
    ("\\{1,2\\}\\cup\\{3\\}", "\\{1,2,3\\}", True),        # a union of sets has their members
    ("\\{1,2\\}\\cup\\{2,3\\}", "\\{3,2,1\\}", True),       # ... each once
    ("x=2, x=3", "x = 2 \\text{ or } x = 3", True),          # `or` separates alternatives, as a comma does
    ("2 \\text{ or } 3", "3, 2", True), ("x = -1 \\text{ or } x = 4", "\\{4, -1\\}", True),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(3,\\infty)\\cup(-\\infty,2)", True),
    ("\\{1,2\\}\\cup\\{4\\}", "\\{1,2,3\\}", False), ("\\{1,2\\}\\cup\\{3\\}", "\\{1,2\\}", False),
    ("x=2, x=3", "x = 2 \\text{ or } x = 4", False), ("x = 2 \\text{ or } x = 3", "x = 2 \\text{ and } x = 3", False),
    ("x = 2 \\text{ or } x = 3", "2", False), ("(-\\infty, 2) \\cup (3, \\infty)", "\\{2, 3\\}", False),
    ("\\text{color}", "\\text{col}, \\text{r}", False),         # `or` inside a word separates nothing
]

BEHAVIOURS = {"mixed_numbers": MIXED_NUMBERS, "commas": COMMAS, "percent_words": PERCENT_WORDS,
              "inequalities": INEQUALITIES, "equations": EQUATIONS, "chained_equalities": CHAINED_EQUALITIES,
              "matrices": MATRICES, "units_and_punctuation": UNITS_AND_PUNCTUATION,
              "outer_braces": OUTER_BRACES, "subscripts_and_sums": SUBSCRIPTS_AND_SUMS,
              "factorials_and_binomials": FACTORIALS_AND_BINOMIALS, "unions_and_alternatives": UNIONS_AND_ALTERNATIVES}


@pytest.mark.parametrize("a, b, equal", UNIONS_AND_ALTERNATIVES)
def test_unions_of_sets_and_alternatives_joined_by_or(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", MIXED_NUMBERS)
def test_plain_text_mixed_numbers(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", COMMAS)
def test_comma_is_a_thousands_separator_only_in_strict_form(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", PERCENT_WORDS)
def test_percent_words(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", INEQUALITIES)
def test_inequalities(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", EQUATIONS)
def test_equations(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", CHAINED_EQUALITIES)
def test_chained_equalities(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", MATRICES)
def test_matrix_trailing_row_break(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", UNITS_AND_PUNCTUATION)
def test_units_and_trailing_punctuation(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", OUTER_BRACES)
def test_outer_braces_around_a_list(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", SUBSCRIPTS_AND_SUMS)
def test_subscripts_and_sums(a, b, equal):
    assert_verdict(a, b, equal)


@pytest.mark.parametrize("a, b, equal", FACTORIALS_AND_BINOMIALS)
def test_factorials_binomials_and_hyperbolic_functions(a, b, equal):
    assert_verdict(a, b, equal)


# ------------------------------------------ relations: a property test
#
# Random linear and quadratic relations in 2-4 variables, among them subscripted
# variables and opaque sums.  Each relation P (an equation P = 0, or an inequality
# P < 0 or P <= 0) is written twice: once multiplied by a nonzero constant (positive
# for inequalities, or negative with the sign turned round) with its terms spread at
# random over both sides, which must be equal to the original; and once with one
# coefficient or the constant changed (or, for an inequality, the strictness), which
# must be different.  Both are checked both ways round.

PROPERTY_VARIABLES = ["x", "y", "z", "t", "x_1", "x_{2}", "F_{n-1}", "(\\sum_{k=1}^{n} k^2)",
                      "(\\sum_{j=1}^{m} j)"]
PROPERTY_SCALES = [Fraction(k) for k in (1, 2, 3, 5)] + [Fraction(1, 2), Fraction(3, 2), Fraction(2, 3)]
RELATIONS_PER_KIND = 150  # equations and inequalities, each written equal and different: 600 pairs


def latex_number(value):
    """A Fraction as LaTeX: `3`, `\\frac{3}{2}` (without its sign)."""
    value = abs(value)
    return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def latex_side(terms):
    """Terms {monomial: coefficient} as one side of a relation; `0` when there are none."""
    text = ""
    for monomial, coefficient in terms:
        sign = "-" if coefficient < 0 else "+"
        magnitude = latex_number(coefficient)
        body = magnitude if not monomial else ("" if magnitude == "1" else magnitude) + monomial
        text += (sign if text or sign == "-" else "") + body
    return text or "0"


def random_polynomial(rng, quadratic):
    """{monomial: nonzero Fraction} in 2-4 variables, with a constant term under key "" and at least 2 terms."""
    variables = rng.sample(PROPERTY_VARIABLES, rng.randint(2, 4))
    monomials = list(variables)
    if quadratic:
        products = [(u, v) for i, u in enumerate(variables) for v in variables[i:]]
        monomials += [u + "^2" if u == v else u + v for u, v in rng.sample(products, rng.randint(1, 2))]
    terms = {m: Fraction(rng.choice([-3, -2, -1, 1, 2, 3])) for m in monomials}
    terms[""] = Fraction(rng.randint(-3, 3))
    return {m: c for m, c in terms.items() if c}


def write_relation(rng, terms, sign):
    """`P sign 0` multiplied by a random nonzero constant, its terms spread over both sides."""
    scale = rng.choice(PROPERTY_SCALES) * rng.choice([1, -1])
    if scale < 0 and sign != "=":
        sign = {"<": ">", "\\le": "\\ge"}[sign]
    left, right = [], []
    for monomial, coefficient in rng.sample(sorted(terms.items()), len(terms)):
        if rng.random() < 0.5:
            left.append((monomial, coefficient * scale))
        else:
            right.append((monomial, -coefficient * scale))
    return f"{latex_side(left)} {sign} {latex_side(right)}"


def relation_pairs(seed=0):
    """(a, b, equal) pairs: 2 x RELATIONS_PER_KIND equations and as many inequalities."""
    rng = random.Random(seed)
    pairs = []
    for index in range(2 * RELATIONS_PER_KIND):
        sign = "=" if index % 2 == 0 else rng.choice(["<", "\\le"])
        terms = random_polynomial(rng, quadratic=rng.random() < 0.5)
        original = write_relation(rng, terms, sign)
        pairs.append((original, write_relation(rng, terms, sign), True))
        changed, other_sign = dict(terms), sign
        if sign != "=" and rng.random() < 0.25:
            other_sign = "<" if sign == "\\le" else "\\le"
        else:
            monomial = rng.choice(sorted(terms) + [""])
            changed[monomial] = changed.get(monomial, Fraction(0)) + rng.choice([-2, -1, 1, 2])
            changed = {m: c for m, c in changed.items() if c}
        pairs.append((original, write_relation(rng, changed, other_sign), False))
    return pairs


RELATION_REGRESSIONS = [
    ("y = a", "y = b", False), ("x < y", "x < z", False), ("x + z = 5", "2y = 5", False),
    ("S = \\sum_{k=1}^{n} k", "S = \\sum_{k=1}^{n+1} k", False), ("3x + 3y = 3", "6x + 6y = 6", True),
    ("x - 2y + z = 0", "2x - 4y + 2z = 0", True), ("x + y < 1", "2x + 2y < 2", True),
]


@pytest.mark.parametrize("a, b, equal", RELATION_REGRESSIONS)
def test_relations_reported_wrong(a, b, equal):
    assert_verdict(a, b, equal)


def test_random_relations_equal_exactly_when_proportional():
    pairs = relation_pairs()
    assert len(pairs) == 4 * RELATIONS_PER_KIND
    wrong = [(a, b, equal) for a, b, equal in pairs if is_equiv(a, b) != equal or is_equiv(b, a) != equal]
    assert not wrong, f"{len(wrong)} of {len(pairs)} pairs judged wrong, e.g. {wrong[:5]}"


@pytest.mark.parametrize("name", BEHAVIOURS)
def test_each_behaviour_is_checked_both_ways(name):
    verdicts = {equal for _, _, equal in BEHAVIOURS[name]}
    assert verdicts == {True, False}, f"{name} needs equal and different cases"


def test_normal_forms_of_the_new_readings():
    assert normalize("4 4/9") == "(4+\\frac{4}{9})"
    assert normalize("4 9/4") == "4 9/4"  # the space stays: never joined
    assert normalize("32, 349") == "32,349" and normalize("32,349") == "32349"
    assert normalize("28 pct") == normalize("28\\%") == "28"
    assert normalize("x = 2+3 = 5") == "5"
    assert normalize("y = 2x + 1") == "y=2x+1" and normalize("x = 3") == "3"
    assert normalize("x \\leqslant 5") == normalize("x <= 5") == "x\\le5"

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
    (["44/9", "4 4/9", "40/9"], "4 4/9"),  # a mixed number joins its value, never the joined digits
    (["32, 349", "32349", "349, 32"], "32, 349"),  # a list, not a thousands separator
    (["x = 2+3 = 5", "5", "6", "6"], "x = 2+3 = 5"),  # a chain is its last right-hand side
    (["y = 2x+1", "2x+1", "2x+1", "2x - y + 1 = 0"], "y = 2x+1"),  # tie: equations and expressions apart
]


@pytest.mark.parametrize("votes, expected", VOTES)
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


def test_majority_vote_of_a_training_step():
    # 128 prompts x 8 answers, mostly short numbers, as one training step votes.
    groups = [[str((p * 7 + r * r) % 13 + p) for r in range(8)] for p in range(128)]
    groups[0] = ["\\frac12", "0.5", "1/2", "0.50", "2/4", "x", "\\dfrac{1}{2}", None]
    winners = [majority_vote(group) for group in groups]
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
    "()",
    "{}",
    "x<" * 300 + "x",
    "<".join(f"x^{{{k}}}" for k in range(1, 21)),
    "<".join(f"{k}x" for k in range(1, 60)),
    "=".join(["x"] * 200),
    "\\sum_{k=1}^{10^{10^{10}}} k^{9^{9^9}}",
    "\\sum_{k=1}^{n}" * 40 + "k",
    "x_{x_{x_{x_{x_{x_{x_{x_{x_{x_{1}}}}}}}}}}",
    "1 " * 300,
]


# Each case is graded in a child process, so that a regression that hangs
# (a huge power holds the interpreter lock; no thread can interrupt it) makes
# these tests fail instead of hanging the whole run.
GRADE_ADVERSARIAL = """
import json, sys
from harness.answers import extract_answer, is_equiv, majority_vote
for answer in json.load(sys.stdin):
    verdicts = [is_equiv(answer, "1"), is_equiv(answer, answer + "+1")]
    vote = majority_vote([answer, "2", answer + "1", "\\\\boxed{" + answer])
    extract_answer("\\\\boxed{" + answer + "}" + answer)
    print(json.dumps([answer, verdicts, vote]), flush=True)
"""


@pytest.fixture(scope="module")
def adversarial_results():
    """(answer -> [[is_equiv to "1", to itself + "+1"], vote], the child's stderr).

    The child's timeout is a generous guard against hangs, not a speed test."""
    command = [sys.executable, "-c", GRADE_ADVERSARIAL]
    try:
        child = subprocess.run(command, input=json.dumps(ADVERSARIAL), capture_output=True, text=True,
                               timeout=10 + 2 * len(ADVERSARIAL), cwd=REPO_ROOT)
        output, errors = child.stdout, child.stderr
    except subprocess.TimeoutExpired as timeout:  # its partial output comes back as bytes
        output, errors = (timeout.stdout or b"").decode(), "timed out"
    return {row[0]: row[1:] for row in map(json.loads, output.splitlines())}, errors


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_adversarial_inputs_do_not_hang_or_crash(answer, adversarial_results):
    results, errors = adversarial_results
    assert answer in results, f"grading this answer hung or crashed: {errors[-2000:]}"
    verdicts, vote = results[answer]
    assert verdicts == [False, False]
    assert vote in (answer, "2")


def test_long_response_extraction():
    response = "Let me think. " * 700 + "\\boxed{" * 300 + "\\boxed{42}"
    assert extract_answer(response) == "42"

# ----------------------------------------------------- bounds on sympy's work
#
# answers.py bounds its work by refusing input before sympy sees it: answers
# over MAX_ANSWER_CHARS or nested deeper than MAX_NESTING normalise to None,
# expressions over MAX_SYMPY_CHARS are never parsed, lists over MAX_PARTS are
# compared as strings, and an expression whose numbers could need more than
# MAX_BITS bits is refused after parsing (unevaluated) and before .doit().
# These tests watch those refusals happen, by spying on sympy's entry points.

@contextlib.contextmanager
def fresh_caches():
    """A cached verdict would hide the path taken, and verdicts reached under
    a spy must not leak into other tests."""
    answers.clear_caches()
    try:
        yield
    finally:
        answers.clear_caches()


@pytest.fixture
def no_cached_verdicts():
    with fresh_caches():
        yield


class SympySpy:
    """Records what answers.py hands to sympy: the expressions parse_expr
    returns (unevaluated), the expressions evaluated with .doit(), and the
    pairs of expressions compared by value.  With forbid=True, evaluating or
    comparing raises instead of running, so a broken bound cannot hang.
    sympy runs in this process (InProcess), where the spy sees it."""

    def __init__(self):
        self.parsed, self.evaluated, self.compared = [], [], []
        self.forbid = False


class InProcess:
    """answers._sympy's stand-in: _math_equal in this process, with no time limit."""

    @staticmethod
    def equal(a, b):
        return answers._math_equal(a, b)

    @staticmethod
    def clear():
        pass


@pytest.fixture
def sympy_spy(monkeypatch):
    spy = SympySpy()
    parse_expr, same_expression = answers.parse_expr, answers._same_expression

    def spied_parse_expr(*args, **kwargs):
        expr = parse_expr(*args, **kwargs)
        spy.parsed.append(expr)
        return expr

    def spied_same_expression(a, b):
        spy.compared.append((a.expr, b.expr))
        if spy.forbid:
            raise RuntimeError("_same_expression called")
        return same_expression(a, b)

    def spied_doit(original):
        def doit(self, **hints):
            spy.evaluated.append(self)
            if spy.forbid:
                raise RuntimeError(f"doit called on {type(self).__name__}")
            return original(self, **hints)
        return doit

    monkeypatch.setattr(answers, "_sympy", InProcess())
    monkeypatch.setattr(answers, "parse_expr", spied_parse_expr)
    monkeypatch.setattr(answers, "_same_expression", spied_same_expression)
    for cls in (sympy.Basic, AssocOp):  # Pow and functions use Basic.doit, Add and Mul AssocOp.doit
        monkeypatch.setattr(cls, "doit", spied_doit(cls.__dict__["doit"]))
    with fresh_caches():
        yield spy


POWERS_TOO_LARGE = [
    "9^9^9^9",
    "2^{2^{2^{2^{2^{2}}}}}",
    "10^{10^{10}}",
    "((((2^{1000})^{1000})^{1000})^{1000})",  # a finite bound (~2^41 bits), still far too large
    "2^{1000000}",
]


@pytest.mark.parametrize("power", POWERS_TOO_LARGE)
def test_huge_powers_are_refused_before_evaluation(power, sympy_spy):
    sympy_spy.forbid = True
    assert answers._to_sympy(power) is None
    assert sympy_spy.evaluated == [], "the power was evaluated, not refused"
    (parsed,) = sympy_spy.parsed  # it was read, and refused by its bit bound
    assert answers._bit_bound(parsed) > MAX_BITS
    assert is_equiv(power, "1") is False
    assert is_equiv(power, power + "+1") is False
    assert sympy_spy.evaluated == [] and sympy_spy.compared == []


def test_modest_powers_are_evaluated(sympy_spy):
    assert answers._to_sympy("2^{10}") == 1024
    (parsed,) = sympy_spy.parsed
    assert answers._bit_bound(parsed) <= MAX_BITS
    assert sympy_spy.evaluated, "2^{10} was not evaluated"
    assert is_equiv("2^{10}", "1024") is True
    assert is_equiv("2^{100}", str(2 ** 100)) is True
    assert is_equiv("2^{100}", str(2 ** 100 + 1)) is False


def test_long_expressions_are_compared_as_strings(sympy_spy):
    long_sum = "+".join(["x"] * 250)  # 499 characters: over MAX_SYMPY_CHARS, under MAX_ANSWER_CHARS
    assert normalize(long_sum) == long_sum  # a valid answer...
    assert answers._to_sympy(long_sum) is None
    assert sympy_spy.parsed == []  # ...that sympy never reads
    assert is_equiv(long_sum, long_sum) is True
    assert is_equiv(long_sum, "250x") is False
    assert len(sympy_spy.parsed) == 1  # "250x" only

    short_sum = "+".join(["x"] * 100)  # 199 characters: read and compared by sympy
    assert is_equiv(short_sum, "100x") is True


@pytest.mark.parametrize("answer", ["1" * 2000, "x+" * 600 + "1"])
def test_over_long_answers_are_refused(answer, no_cached_verdicts):
    assert normalize(answer) is None
    assert is_equiv(answer, answer) is False
    assert majority_vote([answer, answer, "5"]) == "5"
    shorter = answer[:499]  # within MAX_ANSWER_CHARS
    assert normalize(shorter) == shorter
    assert is_equiv(shorter, shorter) is True


def test_over_long_answers_never_enter_a_cache(no_cached_verdicts):
    """A response can box 10 KB of text: refused before any cache, or 40,000 of them hold 400 MB."""
    caches = [value for value in vars(answers).values() if hasattr(value, "cache_info")]
    held = lambda: sum(cache.cache_info().currsize for cache in caches)
    assert majority_vote(["5"]) == "5"
    before = held()
    for k in range(100):
        assert normalize(f"{k}" + "1" * 10_000) is None
        assert majority_vote([f"{k}" + "x" * 10_000, "5"]) == "5"
    assert held() == before


@pytest.mark.parametrize("opener, closer", [("(", ")"), ("[", "]"), ("{", "}")])
def test_deep_nesting_is_refused(opener, closer, no_cached_verdicts):
    deep = opener * 30 + "1" + closer * 30  # deeper than MAX_NESTING
    assert normalize(deep) is None
    assert is_equiv(deep, "1") is False
    assert is_equiv(deep, deep) is False
    assert majority_vote([deep, deep, "5"]) == "5"
    shallow = opener * 10 + "1" + closer * 10
    assert normalize(shallow) == shallow
    assert is_equiv(shallow, "1") is True


def test_long_lists_are_compared_as_strings(no_cached_verdicts):
    items = [str(k) for k in range(1, 26)]  # more parts than MAX_PARTS
    forward, backward = ",".join(items), ",".join(reversed(items))
    assert is_equiv(forward, forward) is True
    assert is_equiv(forward, backward) is False  # as sets these would be equal
    assert is_equiv("\\{" + forward + "\\}", "\\{" + backward + "\\}") is False
    assert is_equiv("(" + forward + ")", "(" + ",".join(items[:-1]) + ",25.0)") is False
    few = items[:10]  # within MAX_PARTS: compared part by part
    assert is_equiv(",".join(few), ",".join(reversed(few))) is True
    assert is_equiv("(" + ",".join(few) + ")", "(" + ",".join(few[:-1]) + ",10.0)") is True



def test_long_relation_chains_are_compared_as_text(no_cached_verdicts):
    links = range(1, answers.MAX_PARTS + 6)  # more links than MAX_PARTS
    chain, doubled = "<".join(f"{k}x" for k in links), "<".join(f"{2 * k}x" for k in links)
    assert is_equiv(chain, chain) is True
    assert is_equiv(chain, doubled) is False  # as inequalities these would be equal
    few = range(1, 6)  # within MAX_PARTS: compared link by link
    assert is_equiv("<".join(f"{k}x" for k in few), "<".join(f"{2 * k}x" for k in few)) is True

# ----------------------------------------------------------- hostile answers
#
# Short answers with astronomically large values: nested exponentials, functions of
# huge arguments, huge factorials, binomials and Gamma values.  Each is refused by its
# bit bound before sympy evaluates anything, and every call that meets it, through the
# helper process as in a run, judges it different from a small integer well within
# the time limit.  The time limit itself is tested with the bound switched off.

HOSTILE = [
    "\\exp(\\exp(\\exp(\\exp(5))))", "e^{e^{e^{e^{5}}}}", "\\exp(\\exp(\\exp(100)))", "\\exp(10^{10})",
    "\\exp(\\exp(\\exp(x)))",
    "\\sin(\\exp(\\exp(\\exp(5))))", "\\cos(10^{10^{5}})", "\\tan(e^{e^{e^{3}}})", "\\sin(\\exp(10^{6}))",
    "\\sinh(\\cosh(\\exp(50)))", "\\cosh(10^{30})", "\\tanh(\\exp(\\exp(\\exp(9))))",
    "\\arctan(\\exp(\\exp(\\exp(9))))", "\\sqrt{\\exp(\\exp(\\exp(7)))}",
    "\\log(\\exp(\\exp(\\exp(\\exp(2)))))", "\\ln(\\ln(\\exp(\\exp(\\exp(\\exp(3))))))",
    "(10^{10})!", "1000000!", "(100!)!", "((5!)!)!", "\\frac{(10^{9})!}{2}",
    "\\binom{10^{12}}{10^{6}}", "\\binom{100!}{50}", "\\dbinom{2^{100}}{2^{50}}",
    "\\Gamma(10^{9})", "\\Gamma(\\exp(\\exp(9)))", "\\Gamma(\\Gamma(\\Gamma(10)))",
]


@pytest.mark.parametrize("answer", HOSTILE)
def test_hostile_answers_are_refused_before_evaluation(answer, sympy_spy):
    sympy_spy.forbid = True
    assert answers._to_sympy(normalize(answer)) is None
    (parsed,) = sympy_spy.parsed  # it was read, and refused by its bit bound
    assert answers._bit_bound(parsed) > MAX_BITS
    assert sympy_spy.evaluated == []


@pytest.fixture(scope="module")
def running_helper():
    """The helper process started: what is timed below is grading, not a start."""
    assert is_equiv("x+1", "1+x") is True


@pytest.mark.parametrize("answer", HOSTILE)
def test_hostile_answers_are_judged_different_within_the_time_limit(answer, running_helper, no_cached_verdicts,
                                                                     recwarn):
    calls = [(lambda: is_equiv(answer, "3"), False), (lambda: is_equiv("3", answer), False),
             (lambda: majority_vote([answer, "3", answer + "+1", "3"]), "3")]
    slowest = 0.0
    for call, expected in calls:
        start = time.perf_counter()
        assert call() == expected
        slowest = max(slowest, time.perf_counter() - start)
    assert slowest < answers.TIME_LIMIT
    assert not [w for w in recwarn if "answers:" in str(w.message)], "the time limit, not the bound, stopped it"


@pytest.fixture
def unbounded_helper(monkeypatch, no_cached_verdicts):
    """A new helper process without the bit bound (it takes its limits from this process)."""
    monkeypatch.setattr(answers, "MAX_BITS", math.inf)
    monkeypatch.setattr(answers, "_sympy", answers._SympyProcess())
    monkeypatch.setattr(answers, "_refused", set())
    assert is_equiv("x+1", "1+x") is True  # started: a start is not counted
    yield
    answers._sympy.close()


def test_the_time_limit_stops_what_the_bounds_miss(unbounded_helper):
    hostile = "\\exp(\\exp(\\exp(\\exp(5))))"  # without its bound, sympy would take hours
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="compared as text from now on"):
        assert is_equiv(hostile, "3") is False
    assert answers.TIME_LIMIT / 2 <= time.perf_counter() - start < answers.TIME_LIMIT + 0.5
    assert normalize(hostile) in answers._refused
    start = time.perf_counter()  # refused: compared as text, without sympy
    assert majority_vote([hostile, "3", hostile, "3", "3"]) == "3"
    assert time.perf_counter() - start < answers.TIME_LIMIT / 2
    assert is_equiv("2\\sqrt2", "\\sqrt8") is True  # the helper that replaced the stopped one works


def test_one_vote_spends_at_most_the_time_limit(unbounded_helper):
    hostile = [f"\\exp(\\exp(\\exp(\\exp({k}))))" for k in range(5, 10)]
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="answers: the time limit"):
        assert majority_vote(hostile + ["2", "\\sqrt{4}", "2"]) == "2"  # once the time is spent: as text
    assert time.perf_counter() - start < answers.TIME_LIMIT + 0.5
    assert is_equiv("\\sqrt{4}", "2") is True  # verdicts cut short were not cached


# A disk where each import of a module not yet loaded takes 50 ms, from the moment answers is imported.
SLOW_DISK = """import sys, time
class SlowDisk:
    def find_spec(self, *args):
        if "answers" in sys.modules and hasattr(sys.modules["answers"], "_serve"):
            time.sleep(0.05)
sys.meta_path.insert(0, SlowDisk())
"""


def test_a_new_helper_is_warm(monkeypatch, no_cached_verdicts):
    """The first comparison with variables in a new helper imports no part of sympy that it has not: on a disk
    where each import takes 50 ms it uses under 10% of the time limit (sympy's first use of its polynomials
    imports 16 modules, 0.8 s here). The warm-up is done before the helper says it is ready, uncounted."""
    monkeypatch.setattr(answers, "_HELPER", SLOW_DISK + answers._HELPER)
    monkeypatch.setattr(answers, "_sympy", answers._SympyProcess())
    try:
        answers._sympy._start_if_needed()
        start = time.perf_counter()
        assert is_equiv("p - q", "-q + p") is True
        assert time.perf_counter() - start < answers.TIME_LIMIT / 10
    finally:
        answers._sympy.close()


def test_the_helper_is_out_of_reach_of_the_runs_signals(running_helper):
    """train.py catches SIGTERM to save and stop: a signal to its process group must not stop the helper."""
    assert os.getsid(answers._sympy._process.pid) != os.getsid(0)


def test_a_helper_whose_parent_is_gone_ends_quietly():
    """A run stopped at once (a second signal) leaves a helper that is still starting: its "ready" finds no reader,
    and it ends without a traceback on the run's console."""
    helper = subprocess.Popen([sys.executable, "-c", answers._HELPER, os.path.dirname(answers.__file__), "{}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    helper.stdout.close()
    assert helper.wait(timeout=60) == 0 and helper.stderr.read() == b""


def test_a_helper_that_died_is_replaced(running_helper):
    answers._sympy._process.kill()
    answers._sympy._process.wait()
    assert is_equiv("(c+1)^2", "c^2+2c+1") is True

# --------------------------------------------------------------------- threads


def test_is_equiv_in_worker_threads():
    pairs = [("\\frac{1}{2}", "0.5", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("x+1", "x-1", False),
             ("(1,2)", "(2,1)", False), ("\\cot x", "\\frac{\\cos x}{\\sin x}", True), ("9^9^9^9", "1", False),
             ("x \\le 5", "5 \\ge x", True), ("2x+4y=3", "2x+4y=6", False), ("4 4/9", "44/9", False)]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda p: is_equiv(p[0], p[1]), pairs * 5))
    assert verdicts == [expected for _, _, expected in pairs] * 5

    result = {}
    thread = threading.Thread(target=lambda: result.update(vote=majority_vote(["\\sqrt{12}", "2\\sqrt3", "3"])))
    thread.start()
    thread.join(timeout=10)
    assert result == {"vote": "\\sqrt{12}"}
