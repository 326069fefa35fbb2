r"""Answers: pull the final answer out of a response, judge two answers equal as mathematics, and take a majority
vote over equivalence classes.  Co-rewarding's rewards are such votes; the official code compares raw strings
(`pred == label` on the boxed text), which splits `\frac12`, `0.5` and `1/2` into three votes and pays none of
them.  Here they are one vote, and different things stay different: a grader mistake is a training signal.

Policies:
- The last box wins: the answer is the content of the last `\boxed{..}`; an empty or unclosed one is no answer.
- A percent is its number: `28\%`, `28 percent`, `28 pct` all equal `28` (and not `0.28`).
- An approximation never equals an exact irrational or fraction: `1.414` != `\sqrt2`, `0.333` != `\frac13`.
- Never join digits across a space: `4 4/9` is the mixed number 4 + 4/9 (`a b/c` with b < c), never 44/9; other
  digit-space-digit text (`4 9/4`, `1 000`) is compared as text.
- A comma is a thousands separator only in the strict form of a whole answer (`1,234`, `1{,}234`, `1,\!234`);
  otherwise it separates list items (`1, 234` is a list).

`is_equiv(a, b)` works in four steps:

1. Normalise each side (cached): drop `$`, `\%`, degrees, LaTeX spacing, `\left`/`\right`, trailing `.`, `,`, units
   and percent words; write each fraction, root and relation sign one way; unwrap `\text{..}`; `(B)` becomes `B`;
   a mixed number `2\frac{1}{3}` or `2 1/3` becomes `(2+\frac{1}{3})`.  A chain `x = 2+3 = 5` or a computation
   `10 \times 5 = 50` is its last right-hand side; a single variable's name goes when the other side has none
   (`x = 3`, `3 = x` -> `3`; `x \in [1,2]` -> `[1,2]`), but `y = 2x+1` stays an equation.  Equal normal forms are equal.
2. Structure: `\{..\}`, outer braces `{..}` (invisible: `{1, 2}` is the list `1, 2`), bare comma lists, `a \pm b`,
   unions (`\cup`) and alternatives joined by `or` are unordered sets; brackets with commas are tuples or intervals
   (order and bracket kinds must match); `pmatrix` is a matrix.  Parts are compared recursively.
3. Numbers: integers, decimals, `a/b` and `\frac{a}{b}` become exact Fractions: `142.0` == `142`, `025` == `25`.
4. Relations and expressions: a small LaTeX reader turns each side into sympy (refusing anything it does not know).
   Rationals are compared exactly, other constants to 40 digits (`2\sqrt2` == `\sqrt8`), and expressions with
   variables exactly at SAMPLE_POINTS points, each variable a rational fixed by a hash of its name and the point
   (`(a+5)(b+2)` == `ab+2a+5b+10`; Schwartz-Zippel identity testing): equal when they agree wherever both are
   defined, at MIN_AGREEING points at least.  Equations are equal when one's lhs - rhs is a nonzero constant multiple
   of the other's (`2x+4y-3=0` == `y = -\frac12 x + \frac34`); inequalities, each written d < 0 or d <= 0, when they
   are equally strict and one d is a positive constant multiple of the other (`x \le 5` == `5 \ge x`, `x < 5` !=
   `x \le 5`); chains (`1 < x \le 3`) link to link, in any order.  Subscripted symbols (`x_1`) are opaque variables,
   and `\sum_{k=a}^{b}` / `\prod_{k=a}^{b}` opaque terms, equal when their bounds, variable and body are.

Limits, judged different (or compared as text) though a reader might call them equal: an equation against its
value (`2x = 6` against `3`); equations that are multiples by a non-constant (`y = \frac1x` against `xy = 1`);
other forms of an inequality's solution set (`x < 5` against `(-\infty, 5)`); relations without a variable
(`\sqrt2 < 1.5`), chains of equalities with words or lists, chains of over MAX_PARTS links; a sum against its closed
form; base-n numbers (`4210_{5}`), double factorials (`5!!`); modest values read through huge numbers (`(5!)!`).

Bounded work.  A vote over hostile answers must not stall a training step, so:
- sympy only sees answers of at most MAX_SYMPY_CHARS characters and nesting MAX_NESTING;
- the bound: a reading whose numbers could need more than MAX_BITS bits (`_bit_bound`) is refused before anything
  is evaluated and compared as text (`9^9^9^9`, `(10^{10})!`);
- the time limit, a backstop for what the bound misses: sympy runs in a helper process, and one is_equiv,
  answer_classes or majority_vote call gets TIME_LIMIT seconds of its work in all.  When they run out (with a
  warning) the helper is replaced, the pair judged different, the rest of the call compared as text, uncached, and
  an answer whose reading alone took half the limit compared as text from then on.  No signals: safe in threads.

Why not math-verify (HF's verifier; bench/grader.py compares them)?  It reads more LaTeX, but its timeouts use
`signal.alarm` (main thread only), it is far slower, and it rounds floats (`0.333333` == `1/3`).
"""

import atexit
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
import warnings
from fractions import Fraction

import sympy
from sympy.core.function import AppliedUndef
from sympy.parsing.sympy_parser import parse_expr

MAX_ANSWER_CHARS = 1_000  # longer "answers" are refused (normalise to None)
MAX_NESTING = 20          # deeper bracket nesting is refused
MAX_SYMPY_CHARS = 300     # longer expressions are compared as strings only
MAX_PARTS = 20            # sets/tuples/relation chains with more parts are compared as strings only
MAX_BITS = 20_000         # refuse numbers that could need more bits than this
TIME_LIMIT = 1.0          # seconds of sympy work one is_equiv or majority_vote call may take

# ------------------------------------------------------------- the time limit (module docstring, Bounded work)

_call = threading.local()  # .deadline of the public call running in this thread, .cut once it ran out


def _within_time_limit(function):
    """A public call gets TIME_LIMIT seconds of sympy work in all; calls inside it share them."""
    @functools.wraps(function)
    def limited(*args):
        if getattr(_call, "deadline", None) is not None:
            return function(*args)
        _call.deadline, _call.cut = time.monotonic() + TIME_LIMIT, False
        try:
            return function(*args)
        finally:
            if _call.cut:  # verdicts reached after the time ran out may be wrong: keep none of them
                _equiv_normalized.cache_clear()
            _call.deadline = None
    return limited


# ------------------------------------------------------- the public functions

def extract_answer(text):
    """Content of the last `\\boxed{..}`, `\\fbox{..}` or `\\boxed 7`; None if none, empty or unclosed."""
    boxes = list(_BOX.finditer(text or ""))
    if not boxes:
        return None
    rest = text[boxes[-1].end():].lstrip()
    if rest.startswith("{"):
        content = _braced_content(rest)
    else:  # `\boxed 7`: the argument is the next run of non-space characters
        token = re.match(r"[^\s${}][^\s$]*", rest)
        content = token.group(0) if token else None
    return (content and content.strip()) or None


@_within_time_limit
def is_equiv(a, b):
    """True when answers a and b are equal as mathematics; None -> False."""
    a, b = (None if x is None else normalize(x) for x in (a, b))
    return a is not None and b is not None and _equiv_normalized(min(a, b), max(a, b))


@_within_time_limit
def majority_vote(answers):
    """The first member, as written, of the largest of the `answer_classes` (a tie: the earliest class), or None."""
    classes = answer_classes(answers)
    return max(classes, key=len)[0] if classes else None  # max keeps the first of equally large classes


def answer_classes(answers):
    """The classes of equal answers, each the list of its members in order, in order of creation; each answer joins
    the first class whose first member it equals.  None and unreadable answers are left out."""
    return [[answers[i] for i in members] for members in answer_class_indices(answers)]


@_within_time_limit
def answer_class_indices(answers):
    """answer_classes, each class as the indices of its members in `answers`."""
    classes = []    # [first member's number or None, member indices...], in order of creation
    by_number = {}  # exact value -> the class of that plain number
    for i, answer in enumerate(answers):
        if answer is None or normalize(answer) is None:
            continue
        number = _as_fraction(normalize(answer))
        if number in by_number:
            by_number[number].append(i)
            continue
        # plain numbers are equal exactly when their Fractions are: compare a new one only with other answers
        for members in classes:
            if (number is None or members[0] is None) and is_equiv(answers[members[1]], answer):
                members.append(i)
                break
        else:
            classes.append([number, i])
            if number is not None:
                by_number[number] = classes[-1]
    return [members[1:] for members in classes]


def normalize(answer):
    """Canonical string for an answer, or None if it is empty, unbalanced, nested deeper than MAX_NESTING or longer
    than MAX_ANSWER_CHARS (checked first, so the cache holds no longer answer)."""
    return None if len(answer) > MAX_ANSWER_CHARS else _normalize(answer)


def clear_caches():
    """Forget every cached verdict, reading and normal form, here and in the helper process."""
    _clear_local_caches()
    _sympy.clear()


# ---------------------------------------------------------------- extraction (from here on, private machinery)

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced_content(text):
    """Text inside the brace group that opens text, or None if it never closes."""
    depth, i = 0, 0
    while i < len(text):
        if text[i] == "\\":  # `\{`, `\}` and `\\` are not grouping braces: skip the next character
            i += 1
        elif text[i] in "{}":
            depth += 1 if text[i] == "{" else -1
            if depth == 0:
                return text[1:i]
        i += 1
    return None

# ------------------------------------------------------------- normalisation

_DROP = re.compile(
    r"(\\\\)|(\\ |~|\\q?quad(?![A-Za-z]))|(?<=,)\s*\\!\s*|\\[,;:!]"
    r"|\\displaystyle|\\(?:left|right)(?![A-Za-z])"
    r"|\\?\$|\\?%|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])")
_TEXT_COMMAND = r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm|mathbf|operatorname)\s*"
_UNIT_TEXT = re.compile(r"(?<=\S)\s*" + _TEXT_COMMAND + r"\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\{?\d\}?)?$")
_UNIT_WORD = re.compile(
    r"(?<=[\d}])(?:\s+(?:cm|mm|km|meters?|inch(?:es)?|feet|foot|ft|yards?|miles?|units?|"
    r"square units|degrees?|cents?|dollars?|hours?|minutes?|seconds?|days?|years?|"
    r"pounds?|grams?|kg|mph)(?:\^\{?\d\}?)?|\s*(?:percent(?:age)?|pct))$")
_TRAILING_PUNCTUATION = re.compile(r"(?<!\.)\s*[.,]\s*$")  # `5.`, `5,` but not an ellipsis `...`
_RELATION_SPELLING = re.compile(
    r"\\(?:(leq?(?:slant)?|leqq)|(geq?(?:slant)?|geqq)|(lt)|gt)(?![A-Za-z])|(≤|<=)|(≥|>=)")
_CONJUNCTION = re.compile(r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])")
_ALTERNATIVE = re.compile(r" ?(?<![A-Za-z\\])or(?![A-Za-z]) ?")  # the word `or` (normal forms keep a space by a letter)
_RELATION_SIGN = re.compile(r"\\le(?![A-Za-z])|\\ge(?![A-Za-z])|[<>=]")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_VARIABLE_LETTER = re.compile(r"[A-Za-df-hj-z]")  # e and i are constants
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PLAIN_MIXED = re.compile(r"(?<![\w.}^\\/])(\d+) (\d+) ?/ ?(\d+)(?![\w.^])")
# A space matters only between two letters (`\cot x`, `\frac a b`) or two digits (`4 9/4`).
_SPACE = re.compile(r"(?<![A-Za-z\d]) | (?![A-Za-z\d])|(?<=[A-Za-z]) (?=\d)|(?<=\d) (?=[A-Za-z])")


@functools.lru_cache(maxsize=100_000)
def _normalize(answer):
    s = _DROP.sub(lambda m: m.group(1) or (" " if m.group(2) else ""), answer)
    s = re.sub(r"\\[dtc]frac(?![A-Za-z])", r"\\frac", s).replace("{,}", ",")
    s = re.sub(r"\\[dt]binom(?![A-Za-z])", r"\\binom", s)
    s = re.sub(_TEXT_COMMAND + r"\{\s*\}", "", s)
    s = _UNIT_TEXT.sub("", _TRAILING_PUNCTUATION.sub("", s))
    s = re.sub(_TEXT_COMMAND + r"\{([^{}]*)\}", r"\1", s)
    s = _UNIT_WORD.sub("", _TRAILING_PUNCTUATION.sub("", s.strip()))
    s = _RELATION_SPELLING.sub(_relation_sign, s)
    if "=" in s or "\\in" in s:
        s = _drop_variable_name(_last_right_hand_side(s))
    s = re.sub(r"\s+", " ", s).strip()
    if _THOUSANDS.fullmatch(s):  # strict form only: `1, 234` is a list
        s = s.replace(",", "")
    s = _PLAIN_MIXED.sub(_plain_mixed_number, s)
    s = _SPACE.sub("", s)
    # One spelling for shorthand arguments: \frac12, \frac9{19}, \frac{270}7, \sqrt2.
    s = re.sub(r"\\frac ?([0-9A-Za-z]) ?([0-9A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac ?([0-9A-Za-z])(?=\{)", r"\\frac{\1}", s)
    s = re.sub(r"\\frac(\{[^{}]*\}) ?([0-9A-Za-z])", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt ?([0-9A-Za-z])", r"\\sqrt{\1}", s)
    # A mixed number is a sum: 2\frac{1}{3} -> (2+\frac{1}{3}), but x^2\frac{1}{3} is a product.
    s = re.sub(r"(?<![\w.}^\\])(\d+)\\frac\{(\d+)\}\{(\d+)\}", r"(\1+\\frac{\2}{\3})", s)
    s = s.rstrip(".")
    s = re.sub(r"^\(([A-Z])\)$", r"\1", s)  # multiple choice: (B) -> B
    if re.fullmatch(r"[A-Za-z]{3,}( [A-Za-z]+)*", s):  # words: East == east
        s = s.lower()
    return s if s and _nesting(s) is not None else None


def _relation_sign(match):
    """One spelling for each relation sign: \\le, \\ge, <, >."""
    le, ge, lt, plain_le, plain_ge = match.groups()
    return "\\le" if le or plain_le else "\\ge" if ge or plain_ge else "<" if lt else ">"


def _plain_mixed_number(match):
    """`4 4/9` -> (4+\\frac{4}{9}); `4 9/4` is ambiguous and stays as written."""
    whole, numerator, denominator = match.groups()
    return match.group(0) if int(numerator) >= int(denominator) else f"({whole}+\\frac{{{numerator}}}{{{denominator}}})"


def _last_right_hand_side(s):
    """`x = 2+3 = 5` -> `5`, `10 \\times 5 = 50` -> `50`; not lists, alternatives (`or`) or equations (`2x = 6`)."""
    sides, signs = _split_outside_brackets(s, _RELATION_SIGN)
    if not signs or set(signs) != {"="} or not sides[-1].strip():
        return s
    equation = len(signs) == 1 and (_has_variable(sides[0]) or _has_variable(sides[1]))
    listed = len(_split_top_level(s, ",")) > 1 or _CONJUNCTION.search(s)
    return s if equation or listed else sides[-1]


def _drop_variable_name(s):
    """`x = 3` -> `3`, `3 = x` -> `3`, `x \\in [1,2]` -> `[1,2]`; `y = 2x+1` stays (module docstring, step 1)."""
    if member := re.match(r"\s*[A-Za-z]\s*\\in(?![A-Za-z])\s*(?=\S)", s):
        return s[member.end():]
    sides, signs = _split_outside_brackets(s, _RELATION_SIGN)
    if signs != ["="]:
        return s
    left, right = sides[0].strip(), sides[1].strip()
    for name, value in ((left, right), (right, left)):
        if re.fullmatch(r"[A-Za-z]", name) and value and not _has_variable(value):
            return value
    return s


def _has_variable(s):
    """True when s names a variable: a Greek letter the reader knows, or any letter but e and i outside commands."""
    return (any(command[1:] in _GREEK for command in _COMMAND.findall(s))
            or _VARIABLE_LETTER.search(_COMMAND.sub("", s)) is not None)


def _nesting(s):
    """Deepest bracket nesting of s, or None if unbalanced or too deep."""
    depth = deepest = 0
    for char in s:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None
    return deepest if depth == 0 and deepest <= MAX_NESTING else None

# ------------------------------------------------------- structure and compare

@functools.lru_cache(maxsize=100_000)
def _equiv_normalized(a, b):
    """is_equiv on normal forms (given in sorted order, so the cache sees each pair once)."""
    if a == b:
        return True
    (kind_a, parts_a), (kind_b, parts_b) = _structure(a), _structure(b)
    if kind_a != kind_b or len(parts_a) != len(parts_b) or len(parts_a) > MAX_PARTS:
        return False
    if kind_a == "atom":  # plain numbers exactly; relations and expressions by sympy, under the time limit
        number_a, number_b = _as_fraction(parts_a[0]), _as_fraction(parts_b[0])
        if number_a is not None and number_b is not None:
            return number_a == number_b
        return _sympy.equal(parts_a[0], parts_b[0])
    if kind_a == "set":
        return _pair_off(parts_a, parts_b, is_equiv)
    return all(is_equiv(p, q) for p, q in zip(parts_a, parts_b))


def _pair_off(parts_a, parts_b, equal):
    """True when each of parts_a is `equal` to its own part of parts_b (the first not taken by an earlier one)."""
    unused = list(parts_b)
    for part in parts_a:
        if (match := next((q for q in unused if equal(part, q)), None)) is None:
            return False
        unused.remove(match)
    return True


def _structure(s):
    """(kind, parts): kind is "atom", "set", "matrix<rows>x<columns>" or a bracket pair such as "(]"."""
    if not s:
        return "atom", [s]
    if matrix := re.fullmatch(r"\\begin\{([pbv]?matrix)\}(.*)\\end\{\1\}", s):
        rows = [row.split("&") for row in matrix.group(2).split("\\\\")]
        if len(rows) > 1 and rows[-1] == [""]:  # a trailing \\ adds no row
            rows.pop()
        return f"matrix{len(rows)}x{len(rows[0])}", [x for row in rows for x in row]
    unions = _split_top_level(s, "\\cup")
    if len(unions) > 1:
        return "set", _union_members(unions)
    alternatives = _split_top_level(s, _ALTERNATIVE)  # x=2 or x=3: the set {2, 3}, as the list x=2, x=3
    if len(alternatives) > 1 and all(alternatives):
        return "set", alternatives
    if s.startswith("\\{") and s.endswith("\\}") and _encloses(s[1:]):
        return "set", _expand_pm(_split_top_level(s[2:-2], ","))
    if s[0] == "{" and _encloses(s):  # outer braces are invisible: {1, 2} is the list 1, 2
        return _structure(s[1:-1])
    if s[0] in "([" and s[-1] in ")]" and _encloses(s):
        items = _split_top_level(s[1:-1], ",")
        if len(items) > 1:
            return s[0] + s[-1], items
        if s[0] + s[-1] == "()":  # plain grouping: (5) is 5
            return _structure(s[1:-1])
    items = _split_top_level(s, ",")
    return ("set", _expand_pm(items)) if len(items) > 1 or s.count("\\pm") == 1 else ("atom", [s])


def _split_top_level(s, separator):
    """Split s at separators (a string, or a compiled pattern) that are not inside any brackets."""
    return _split_outside_brackets(s, separator)[0]


def _split_outside_brackets(s, separator):
    """(parts, the separators between them): s split at separators (a string or a compiled pattern) outside brackets."""
    pattern = re.compile(re.escape(separator)) if isinstance(separator, str) else separator
    parts, found, depth, start, i = [], [], 0, 0, 0
    while i < len(s):
        if s[i] in "([{":
            depth += 1
        elif s[i] in ")]}":
            depth -= 1
        elif depth == 0 and (match := pattern.match(s, i)):
            parts.append(s[start:i])
            found.append(match.group())
            start = i = match.end()
            continue
        i += 1
    return parts + [s[start:]], found


def _union_members(parts):
    """The members of a union: `\\{1,2\\}\\cup\\{2,3\\}` has 1, 2 and 3; a part that is not a set is one member."""
    members = []
    for part in parts:
        kind, items = _structure(part)
        for item in items if kind == "set" else [part]:
            if not any(is_equiv(item, member) for member in members):
                members.append(item)
    return members


def _encloses(s):
    """True when the bracket opening s is closed by the last character."""
    depth = 0
    for i, char in enumerate(s):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:
            return i == len(s) - 1
    return False


def _expand_pm(items):
    """`1\\pm\\sqrt5` stands for two items, `1+\\sqrt5` and `1-\\sqrt5`."""
    expanded = []
    for item in items:
        expanded += [item.replace("\\pm", sign) for sign in "+-"] if item.count("\\pm") == 1 else [item]
    return expanded

# ------------------------------------------------------------------- numbers

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_FRACTION_FORMS = [re.compile(rf"(?P<num>{_NUM})"), re.compile(rf"(?P<num>{_NUM})/(?P<den>{_NUM})"),
                   re.compile(rf"(?P<sign>[+-]?)\\frac\{{(?P<num>{_NUM})\}}\{{(?P<den>{_NUM})\}}")]


@functools.lru_cache(maxsize=100_000)
def _as_fraction(s):
    """Exact value of a plain number (integer, decimal, a/b, \\frac{a}{b})."""
    if len(s) > 200:
        return None
    for form in _FRACTION_FORMS:
        if match := form.fullmatch(s):
            parts = match.groupdict()
            value = Fraction(parts["num"])
            if parts.get("den") is not None:
                if Fraction(parts["den"]) == 0:
                    return None
                value /= Fraction(parts["den"])
            return -value if parts.get("sign") == "-" else value
    return None

# --------------------------------------------------------- LaTeX -> sympy

_TOKEN = re.compile(r"\s+|(\\[A-Za-z]+|\\[{}]|\d+(?:\.\d*)?|\.\d+|[A-Za-z]+|[-+*/^(){}\[\]_=!])")
_FUNCTIONS = {name: getattr(sympy, name) for name in
              ("sqrt", "root", "sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sinh", "cosh", "tanh")}
_FUNCTIONS.update(ln=sympy.log, arcsin=sympy.asin, arccos=sympy.acos, arctan=sympy.atan, Gamma=sympy.gamma)
_CONSTANTS = {"\\pi": "pi", "pi": "pi", "\\infty": "oo", "e": "E", "i": "I"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "mu", "phi", "omega"}
_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "\\cdot": "*", "\\times": "*", "\\div": "/"}
_CLOSERS = {"(": ")", "{": "}", "[": "]"}
# Opaque, never evaluated: x_1 is Subscript(x, 1), \sum_{k=a}^{b} t is SumOf(t, k, a, b); each a variable once read.
_OPAQUE = {name: sympy.Function(name) for name in ("Subscript", "SumOf", "ProductOf")}
_BIG_OPERATORS = {"\\sum": "SumOf", "\\prod": "ProductOf"}
_COMBINATORICS = {"factorial": sympy.factorial, "binomial": sympy.binomial}  # n!, \binom{n}{k}
# The reader writes each function as an undefined one of the same name (sympy computes factorial(10**10) as soon
# as it is built); they become sympy's own (_realized) only once _bit_bound has found the expression small enough.
_REAL = {**_FUNCTIONS, **_COMBINATORICS}
_DEFERRED = {name: sympy.Function(name) for name in _REAL}
_CALLS = {*_REAL, *_OPAQUE}  # names followed by their arguments, not by an implicit product
_NAMES = {**_DEFERRED, **_OPAQUE, "pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo, "Integer": sympy.Integer,
          "Rational": sympy.Rational, "Add": sympy.Add, "Mul": sympy.Mul, "Pow": sympy.Pow, "__builtins__": {}}
_BOUND = "#"  # marks a sum's variable in its body: `\sum_{i=1}^{n} i` sums i, not sqrt(-1)


class _NotMath(ValueError):
    """The text is outside the small LaTeX subset this module reads."""


@functools.lru_cache(maxsize=100_000)
def _to_sympy(s):
    """sympy expression for a short LaTeX expression, or None.  The reader emits Python text of whitelisted names,
    numbers and operators only, so handing it to parse_expr (which uses eval) is safe."""
    try:
        if len(s) > MAX_SYMPY_CHARS:
            return None
        python, _ = _read_sequence(_tokenize(s), 0, None)
        symbols = {t: sympy.Symbol(t) for t in python if t.isalpha() and t not in _NAMES}
        expr = parse_expr(_with_implicit_products(python), local_dict=symbols,
                          global_dict=dict(_NAMES), transformations=(), evaluate=False)
        if _bit_bound(expr) > MAX_BITS:  # a tower of powers, a huge factorial: refuse before evaluating
            return None
        if any(name in _DEFERRED for name in python):
            expr = _realized(expr)
        expr = expr.doit()
        if any(name in _OPAQUE for name in python):
            opaque = expr.atoms(AppliedUndef)  # replaced outermost first: a sum's terms go with it
            expr = expr.xreplace({term: sympy.Symbol(str(term)) for term in opaque})
        return expr
    except Exception:  # sympy raises many exception types on odd input; any of them means "unreadable"
        return None


def _tokenize(s):
    """LaTeX tokens of s: `ab` is two letters (a product), `sin` one name; three or more other letters are a word,
    refused, and so are two numbers in a row (`4 4`), but not after `^` or `_` (`x^2 3`, `\\log_2 8`)."""
    tokens, pos = [], 0
    while pos < len(s):
        if (match := _TOKEN.match(s, pos)) is None:
            raise _NotMath(s[pos])
        pos, token = match.end(), match.group(1)
        if not token:
            continue
        if token[0].isalpha() and token not in _FUNCTIONS and token not in _CONSTANTS:
            if len(token) > 2:
                raise _NotMath(token)
            tokens.extend(token)
        elif tokens and _is_number(token) and _is_number(tokens[-1]) and tokens[-2:-1] not in (["_"], ["^"]):
            raise _NotMath("two numbers in a row")
        else:
            tokens.append(token)
    return tokens


def _is_number(token):
    return token[0].isdigit() or token[0] == "."


def _read_sequence(tokens, pos, closer):
    """Python tokens for tokens[pos:] up to the closer; returns (tokens, next pos)."""
    out = []
    while pos < len(tokens) and tokens[pos] != closer:
        piece, pos = _read_item(tokens, pos)
        if tokens[pos:pos + 1] == ["!"]:  # n!, (n+1)!: the factorial of the item before
            if tokens[pos + 1:pos + 2] == ["!"] or piece[0] in ("**", *_OPERATORS.values()):
                raise _NotMath("a double factorial or a misplaced !")
            piece, pos = ["factorial", "(", *piece, ")"], pos + 1
        out += piece
    if closer is not None:
        if pos >= len(tokens):
            raise _NotMath("unclosed group")
        pos += 1
    return out, pos


def _read_item(tokens, pos):
    """Python tokens for one LaTeX item (a token, group, \\frac, \\sqrt, ...)."""
    if pos >= len(tokens):
        raise _NotMath("missing argument")
    token, pos = tokens[pos], pos + 1
    name = token.lstrip("\\")
    if token[0] == _BOUND:
        return [token[1:]], pos
    variable = len(token) == 1 and token.isalpha() or name in _GREEK
    if variable and pos < len(tokens) and tokens[pos] == "_":  # x_1, F_{n-k-1}: an opaque variable
        index, pos = _read_item(tokens, pos + 1)
        return ["Subscript", "(", name, ",", *index, ")"], pos
    if token in _CLOSERS:
        inner, pos = _read_sequence(tokens, pos, _CLOSERS[token])
        if not inner:
            raise _NotMath("empty group")
        return ["(", *inner, ")"], pos
    if token in ("\\frac", "\\binom"):
        top, pos = _read_item(tokens, pos)
        bottom, pos = _read_item(tokens, pos)
        if token == "\\frac":
            return ["(", *top, ")", "/", "(", *bottom, ")"], pos
        return ["binomial", "(", *top, ",", *bottom, ")"], pos
    if token == "\\sqrt" and pos < len(tokens) and tokens[pos] == "[":
        index, pos = _read_sequence(tokens, pos + 1, "]")
        radicand, pos = _read_item(tokens, pos)
        return ["root", "(", *radicand, ",", *index, ")"], pos
    if name in _FUNCTIONS:  # \sin x, \sin(x), \sin^2 x, \sqrt{2}, \log_2 8
        base, power = [], []
        if name == "log" and pos < len(tokens) and tokens[pos] == "_":
            index, pos = _read_item(tokens, pos + 1)
            base = [",", *index]
        if pos < len(tokens) and tokens[pos] == "^":
            exponent, pos = _read_item(tokens, pos + 1)
            power = ["**", "(", *exponent, ")"]
        argument, pos = _read_item(tokens, pos)
        return ["(", name, "(", *argument, *base, ")", ")", *power], pos
    if token in _BIG_OPERATORS:
        return _read_big_operator(tokens, pos, _BIG_OPERATORS[token])
    if token == "^":
        exponent, pos = _read_item(tokens, pos)
        return ["**", "(", *exponent, ")"], pos
    if token in _OPERATORS:
        return [_OPERATORS[token]], pos
    if token in _CONSTANTS:
        return [_CONSTANTS[token]], pos
    if _is_number(token):
        return [f"Integer({int(token)})" if token.isdigit() else f"Rational('{token}')"], pos
    if variable:
        return [name], pos
    raise _NotMath(token)


def _read_big_operator(tokens, pos, name):
    """`\\sum_{k=a}^{b} body` (or \\prod): the opaque term name(body, k, a, b), the body running to the next + or -."""
    if tokens[pos:pos + 1] == ["\\limits"]:
        pos += 1
    variable = tokens[pos + 2] if pos + 3 < len(tokens) else ""
    if not (tokens[pos:pos + 2] == ["_", "{"] and len(variable) == 1 and variable.isalpha()
            and tokens[pos + 3] == "="):
        raise _NotMath("a sum needs _{k=a}^{b}")
    lower, pos = _read_sequence(tokens, pos + 4, "}")
    if not lower or tokens[pos:pos + 1] != ["^"]:
        raise _NotMath("a sum needs _{k=a}^{b}")
    upper, pos = _read_item(tokens, pos + 1)
    bound, body = tokens[:pos] + [_BOUND + variable if t == variable else t for t in tokens[pos:]], []
    while (pos < len(bound) and bound[pos] not in (")", "}", "]", "=")
           and not (body and bound[pos] in ("+", "-"))):
        piece, pos = _read_item(bound, pos)
        body += piece
    if not body:
        raise _NotMath("a sum needs a body")
    arguments = ["(", *body, ")", ",", variable, ",", "(", *lower, ")", ",", "(", *upper, ")"]
    return [name, "(", *arguments, ")"], pos


def _with_implicit_products(python):
    """Join Python tokens, writing the `*` that LaTeX leaves out (`2x`, `(a)(b)`)."""
    out = []
    for token in python:
        ends_operand = out and (out[-1] == ")" or (out[-1][0].isalnum() and out[-1] not in _CALLS))
        if ends_operand and (token == "(" or token[0].isalnum()):
            out.append("*")
        out.append(token)
    return " ".join(out)


_ATOM_BITS = 4  # a symbol or a constant counts as a number below 16, as every sample value is
_EXPONENTIAL = {"exp", "sinh", "cosh"}  # f(x) has about 1.45 |x| bits
_FACTORIAL = {"factorial", "Gamma"}      # f(x) has about |x| log2 |x| bits


def _bit_bound(expr):
    """Upper estimate of the bits of any number the reader's unevaluated expr evaluates to (math.inf: unbounded).  An
    argument of b bits is below 2^b, so x^y (and a root) has at most bits(x) * 2^bits(y) bits, e^x, sinh and cosh
    about 1.45 * 2^bits(x), x! and Gamma(x) 2^bits(x) * bits(x), a binomial as its larger argument's factorial.
    Other functions count as large as their arguments, which bounds their work too (sin(10^4000): 4,000 digits)."""
    if expr.is_Rational:
        return max(expr.p.bit_length(), expr.q.bit_length(), 1)
    if not expr.args:  # symbols and constants
        return _ATOM_BITS
    bits = [_bit_bound(arg) for arg in expr.args]
    name = expr.func.__name__ if isinstance(expr, AppliedUndef) else None
    if expr.is_Pow and expr.args[0] is sympy.E:  # e^x is exp(x)
        name, bits = "exp", bits[1:]
    if (expr.is_Pow and name is None) or name == "root":
        return math.inf if bits[1] > 24 else bits[0] * 2.0 ** bits[1]
    if name in _EXPONENTIAL or name in _FACTORIAL or name == "binomial":
        if (largest := max(bits)) > 24:
            return math.inf
        return 1.45 * 2.0 ** largest + 1 if name in _EXPONENTIAL else 2.0 ** largest * largest + 1
    return sum(bits) + 1 if expr.is_Add or expr.is_Mul or name is not None else math.inf  # no other kind is read


def _realized(expr):
    """expr with the reader's undefined functions made sympy's own (evaluated); the rest unevaluated, for .doit()."""
    if not expr.args:
        return expr
    args = [_realized(arg) for arg in expr.args]
    if isinstance(expr, AppliedUndef) and expr.func.__name__ in _REAL:
        return _REAL[expr.func.__name__](*args)
    return expr if all(new is old for new, old in zip(args, expr.args)) else expr.func(*args, evaluate=False)

# ------------------------------------------------------- sympy comparison (module docstring, step 4)
# Variables take unrelated values, so a linear pattern between them (x + y = 1) holds at a point only by chance, and
# two different polynomials of degree d agree at a point with chance at most about d / 4,000 (Schwartz-Zippel).

SAMPLE_POINTS = 6  # points at which expressions with variables are compared
MIN_AGREEING = 4   # points that must be defined on both sides (for a ratio: nonzero on both)
_PRIMES = (11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)
_TOLERANCE = sympy.Float("1e-30")  # relative: constants that are not rationals are compared to 40 digits
_ZERO = (sympy.S.Zero, sympy.S.Zero)


@functools.lru_cache(maxsize=100_000)
def _sample_value(name, point):
    """The value of the variable `name` at sample point `point`: p/q with 1 <= |p| <= 99 and q a prime in _PRIMES."""
    digest = hashlib.blake2b(f"{name}@{point}".encode(), digest_size=8).digest()
    numerator = int.from_bytes(digest[:4], "big") % 198 - 99
    numerator += numerator >= 0  # -99..-1 or 1..99
    return sympy.Rational(numerator, _PRIMES[int.from_bytes(digest[4:], "big") % len(_PRIMES)])


@dataclasses.dataclass(frozen=True)
class _Sampled:
    """An expression and its values at the sample points, each an (exact, 40-digit) pair, None where not finite."""
    expr: sympy.Expr
    values: tuple
    has_variables: bool
    undefined: bool  # it holds 1/0 or 0/0: no answer, not even equal to itself


def _sampled(expr):
    symbols = sorted(expr.free_symbols, key=str)
    if expr.has(sympy.zoo, sympy.nan):
        return _Sampled(expr, (None,) * SAMPLE_POINTS, bool(symbols), True)
    if not symbols:
        return _Sampled(expr, (_numeric(expr),) * SAMPLE_POINTS, False, False)
    values = tuple(_numeric(expr.xreplace({symbol: _sample_value(str(symbol), point) for symbol in symbols}))
                   for point in range(SAMPLE_POINTS))
    return _Sampled(expr, values, True, False)


def _numeric(value):
    """(value, its 40-digit number), or None where value is not finite (a pole)."""
    if value.is_Rational:
        return value, value
    if not value.is_finite:
        return None
    number = sympy.N(value, 40)
    return (value, number) if number.is_finite else None


@functools.lru_cache(maxsize=100_000)
def _reading(s):
    """What the atom s says, read and sampled once: ("expression", [(e, False)]); ("=", [(lhs - rhs, False)]);
    ("<", [(d, strict), ...]), each link of an inequality chain written d < 0 or d <= 0; ("?", []) for relations
    compared as text (module docstring, Limits); None when s cannot be read.  Each e and d is _Sampled."""
    try:
        sides, signs = _split_outside_brackets(s, _RELATION_SIGN) if _RELATION_SIGN.search(s) else ([s], [])
        if not signs:
            expr = _to_sympy(s)
            return None if expr is None else ("expression", [(_sampled(expr), False)])
        if len(signs) > MAX_PARTS:
            return "?", []
        expressions = [_to_sympy(side) for side in sides]
        # unreadable sides, chains with `=`, relations without a variable (`1 < 2` and `3 < 4` are not one answer)
        if None in expressions or (len(signs) > 1 and "=" in signs) or not any(e.free_symbols for e in expressions):
            return "?", []
        if signs == ["="]:
            return "=", [(_sampled(expressions[0] - expressions[1]), False)]
        return "<", [(_sampled(left - right if sign in ("<", "\\le") else right - left), sign in ("<", ">"))
                     for left, sign, right in zip(expressions, signs, expressions[1:])]
    except Exception:
        return None


def _math_equal(a, b, progress=lambda: None):
    """True when atoms a and b (not both plain numbers) are the same expression or relation (the module's step 4)."""
    reading_a = _reading(a)
    progress()
    reading_b = _reading(b)
    progress()
    if reading_a is None or reading_b is None:
        return False
    (kind_a, links_a), (kind_b, links_b) = reading_a, reading_b
    if kind_a != kind_b or kind_a == "?" or len(links_a) != len(links_b):
        return False
    try:
        if kind_a == "expression":
            return _same_expression(links_a[0][0], links_b[0][0])
        if kind_a == "=":
            return _proportional(links_a[0][0], links_b[0][0], positive=False)
        return _pair_off(links_a, links_b, lambda p, q: p[1] == q[1] and _proportional(p[0], q[0], positive=True))
    except Exception:  # sympy's failures come in many types; all mean "not shown equal"
        return False


def _same_expression(a, b):
    """Equal _Sampled expressions: equal at every sample point where both are defined (at a pole, neither is)."""
    if a.undefined or b.undefined:
        return False
    pairs = _both_defined(a, b)
    return a.expr == b.expr or (all(_same_value(x, y) for x, y in pairs) and len(pairs) >= MIN_AGREEING)


def _proportional(a, b, positive):
    """True when a == c * b for a constant c != 0 (c > 0 when positive): zero at the same points, the same ratio at
    the others (at least MIN_AGREEING); without variables, only when a == b."""
    if a.undefined or b.undefined:
        return False
    if a.expr == b.expr:
        return True
    if not (a.has_variables or b.has_variables):  # `1 = 2` and `3 = 5` are not one answer
        return False
    ratios = []
    for value_a, value_b in _both_defined(a, b):
        zero_a, zero_b = _same_value(value_a, _ZERO), _same_value(value_b, _ZERO)
        if zero_a != zero_b:
            return False
        if not zero_a:
            ratios.append((value_a, value_b))
    if len(ratios) < MIN_AGREEING:
        return False
    (first_a, first_b), rest = ratios[0], ratios[1:]
    if positive and _sign(first_a) * _sign(first_b) != 1:
        return False
    return all(_same_value(_times(value_a, first_b), _times(value_b, first_a)) for value_a, value_b in rest)


def _both_defined(a, b):
    """(value of a, value of b) at each sample point where both _Sampled a and b are defined."""
    return [(x, y) for x, y in zip(a.values, b.values) if x is not None and y is not None]


def _same_value(a, b):
    """Equal (exact, number) pairs: exactly when their difference is rational, else to a relative 1e-30."""
    if (difference := a[0] - b[0]) == 0:
        return True
    return False if difference.is_Rational else bool(abs(a[1] - b[1]) < _TOLERANCE * max(1, abs(a[1])))


def _times(a, b):
    return a[0] * b[0], a[1] * b[1]


def _sign(value):
    """1, -1 or 0 (zero, or not a real number) for an (exact, number) pair."""
    number = value[1]
    return 0 if not number.is_real else 1 if number > 0 else -1 if number < 0 else 0

# ------------------------------------------------------- the helper process

_STARTUP_LIMIT = 120.0  # seconds a new helper may take to import sympy and warm up
# Compared by a new helper before it is ready, as sympy imports parts of itself on first use: not in a time limit.
_WARM_UP = [("p - q", "-q + p"), ("x^2 - 1", "(x - 1)(x + 1)"), ("2\\sqrt{2}", "\\sqrt{8}"),
            ("\\sin x", "\\cos(\\pi/2 - x)"), ("x \\le 3", "3 \\ge x")]
_HELPER = "import json, sys; sys.path.insert(0, sys.argv[1]); from harness import answers; answers._serve(json.loads(sys.argv[2]))"
_refused = set()  # normal forms whose reading took over half the time limit


class _SympyProcess:
    """_math_equal in a helper process: a request a line on its stdin; on its stdout `.` as each side is read, then
    the verdict.  One per grading process (a forked child starts its own), shared by its threads."""

    def __init__(self):
        self._lock, self._process, self._owner, self._ready = threading.Lock(), None, None, False

    def equal(self, a, b):
        if a in _refused or b in _refused or getattr(_call, "cut", False):
            return False
        asked = time.monotonic()
        with self._lock:
            self._start_if_needed()
            _call.deadline += time.monotonic() - asked  # waiting for the lock or for a start is not counted
            return self._ask(["equal", a, b], _call.deadline, blame=(a, b))

    def clear(self):
        """Clear the helper's caches (bench/grader.py times it cold); a new helper has none."""
        with self._lock:
            if self._ready and self._owner == os.getpid() and self._process.poll() is None:
                self._ask(["clear"], time.monotonic() + _STARTUP_LIMIT, blame=())

    def _ask(self, request, deadline, blame):
        """The helper's reply to request, or on time-out or a dead helper _give_up's False."""
        self._process.stdin.write((json.dumps(request) + "\n").encode())
        self._process.stdin.flush()
        reply, side, side_started = b"", 0, time.monotonic()
        while not reply.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._process.stdout], [], [], remaining)[0]:
                return self._give_up(blame, side, side_started, f"the time limit ({TIME_LIMIT:g} s) ran out")
            if not (chunk := os.read(self._process.stdout.fileno(), 64)):
                return self._give_up(blame, side, side_started,
                                     f"the sympy helper process died (exit code {self._process.wait()})")
            side += chunk.count(b".")
            side_started = time.monotonic() if b"." in chunk else side_started
            reply += chunk.replace(b".", b"")
        return reply.strip() == b"1"

    def _give_up(self, blame, side, side_started, why):
        """Replace the helper, refuse the answer it was reading for over half the limit, judge different."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None
        self._start_if_needed(wait=False)  # the next helper imports sympy while this call goes on
        if getattr(_call, "deadline", None) is not None:
            _call.cut = True
        if side < len(blame) and time.monotonic() - side_started >= TIME_LIMIT / 2:
            _refused.add(blame[side])
            why += f" reading {blame[side][:200]!r}; it is compared as text from now on"
        else:
            why += f" comparing {blame[0][:100]!r} with {blame[1][:100]!r}; judged different"
        warnings.warn(f"answers: {why}", RuntimeWarning, stacklevel=2)
        return False

    def _start_if_needed(self, wait=True):
        if self._process is None or self._owner != os.getpid() or self._process.poll() is not None:
            limits = {"MAX_SYMPY_CHARS": MAX_SYMPY_CHARS, "MAX_PARTS": MAX_PARTS, "MAX_BITS": MAX_BITS}
            folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # above harness/
            # Own session: a SIGTERM/Ctrl-C the run catches must not stop the helper mid-step; it ends when stdin closes
            self._process = subprocess.Popen([sys.executable, "-c", _HELPER, folder, json.dumps(limits)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                             start_new_session=True)
            self._owner, self._ready = os.getpid(), False
        if wait and not self._ready:
            ready = select.select([self._process.stdout], [], [], _STARTUP_LIMIT)[0]
            line = self._process.stdout.readline() if ready else b""
            if line != b"ready\n":
                self._process.kill()
                self._process = None
                raise RuntimeError(f"answers: the sympy helper process did not start within {_STARTUP_LIMIT:g} s "
                                   f"(it said {line!r}); its error, if any, is above")
            self._ready = True

    def close(self):
        if self._process is not None and self._owner == os.getpid():
            self._process.stdin.close()
            self._process.wait()


def _serve(limits):
    """The helper process, with the parent's `limits`: replies until stdin closes or a reply finds no reader."""
    globals().update(limits)
    progress = lambda: print(".", end="", flush=True)
    try:
        for a, b in _WARM_UP:
            _math_equal(normalize(a), normalize(b))
        _clear_local_caches()
        print("ready", flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            if request[0] == "clear":
                _clear_local_caches()
                print("0", flush=True)
            else:
                print(int(_math_equal(request[1], request[2], progress)), flush=True)
    except BrokenPipeError:
        os._exit(0)                     # at once: a normal exit would flush stdout again, and report that too


_sympy = _SympyProcess()
atexit.register(_sympy.close)


def _clear_local_caches():
    for function in (_normalize, _equiv_normalized, _as_fraction, _to_sympy, _reading, _sample_value):
        function.cache_clear()
