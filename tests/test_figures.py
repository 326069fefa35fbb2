"""One figure, one value, across the documents. A figure lives in the document that measures it (its home), and
another document that states it must state the home's value, within the digits it gives. FIGURES names the figures
the documents quote: each its home, the pattern of its measurement there, and the patterns that find it stated
anywhere. A size given in two units, "7.1 GiB (7.6 GB)", must be one size. A figure that is added to the documents
and quoted elsewhere gets a row here."""
import glob
import os
import re
from dataclasses import dataclass

import pytest

from conftest import ROOT


UNITS = {"GB": 1e9, "GiB": 2 ** 30, "MB": 1e6, "MiB": 2 ** 20, "s": 1.0, "minutes": 60.0, "min": 60.0}
NUMBER = r"(?P<v>\d+(?:\.\d+)?)"
ABOUT = r"(?P<about>about\s+)?"


@dataclass
class Figure:
    """`measured`: its pattern in `home` (the first match is the figure); `quoted`: its patterns in any document. A
    pattern's groups: v, the value; optionally high (a range's top), s (seconds after minutes), about; `unit`, the
    unit of v unless the pattern has a group of that name."""
    name: str
    home: str
    unit: str
    measured: str
    quoted: tuple


FIGURES = [
    Figure("a Qwen3-4B checkpoint", "bench/memory.md", "GB", rf"At 4B that\s+is {NUMBER} GB",
           (rf"\b4B,?\s+(?:that\s+is\s+)?{ABOUT}{NUMBER} GB", rf"checkpoint every \d+ steps \({ABOUT}{NUMBER} GB",
            rf"checkpoints: {NUMBER} GB each(?!, with)")),
    Figure("a Qwen3-4B checkpoint with the teacher", "bench/memory.md", "GB", rf"\(coreward2: {NUMBER} GB\), and final",
           (rf"\({ABOUT}{NUMBER} GB with the teacher\)", rf"{NUMBER} GB each, with the teacher")),
    Figure("the seed run's checkpoints on disk", "bench/memory.md", "GB", rf"holds three:\s+{NUMBER} GB",
           (rf"at 4B, [\d.]+ GB and {NUMBER} GB", rf"and {NUMBER} GB for checkpoints")),
    Figure("the default run's wall clock", "bench/default_run.md", "s", rf"\*\*wall clock\*\* \| \*\*{NUMBER}\*\*",
           (rf"run takes {ABOUT}{NUMBER}(?: to (?P<high>\d+))? (?P<unit>minutes|s)\b",)),
    Figure("the whole test suite's time", "bench/suite.md", "min", rf"The whole suite[^*]*\*\*{NUMBER} min (?P<s>\d+) s",
           (rf"whole suite takes {ABOUT}{NUMBER} (?P<unit>minutes)",)),
]
TWO_UNITS = re.compile(r"(?P<a>\d+(?:\.\d+)?) (?P<ua>GiB|GB|MiB|MB)\b[^()\d.;]{0,30}? \((?:about )?(?P<b>\d+(?:\.\d+)?) (?P<ub>GiB|GB|MiB|MB)\b")


def documents():
    """The project's documents: every Markdown file but the study tables a script writes."""
    paths = glob.glob(os.path.join(ROOT, "*.md")) + glob.glob(os.path.join(ROOT, "*", "**", "*.md"), recursive=True)
    return sorted(os.path.relpath(p, ROOT) for p in paths
                  if ".venv" not in p and os.path.basename(p) not in ("table.md", "gaps.md", "views.md", "baseline.md")
                  and "/runs/" not in p)


def read(doc, root=ROOT):
    with open(os.path.join(root, doc)) as f:
        return f.read()


def span(match, unit):
    """(low, high) in base units of what a match states, widened by the rounding of its last digit ("about 48 GB":
    47.5 to 48.5 GB)."""
    groups = match.groupdict()
    scale = UNITS[groups.get("unit") or unit]
    low, high = float(groups["v"]), float(groups.get("high") or groups["v"])
    digits = groups["v"].split(".")[1] if "." in groups["v"] else ""
    rounding = 0.5 * 10 ** -len(digits)
    seconds = float(groups.get("s") or 0)
    return (low - rounding) * scale + seconds, (high + rounding) * scale + seconds


def disagreements(figure, texts):
    """The statements of `figure` in `texts` ({document: its text}) whose value is not its home's: [(document, the
    statement)]; or the home's own words when the home does not measure it."""
    home = re.search(figure.measured, texts.get(figure.home, ""))
    if home is None:
        return [(figure.home, f"does not state {figure.name} as {figure.measured!r}")]
    low, high = span(home, figure.unit)
    measured = (low + high) / 2
    wrong = []
    for doc, text in sorted(texts.items()):
        for pattern in figure.quoted:
            for match in re.finditer(pattern, text):
                stated_low, stated_high = span(match, figure.unit)
                if not stated_low <= measured <= stated_high:
                    wrong.append((doc, " ".join(match.group(0).split())))
    return wrong


def unit_pairs(text):
    """The sizes given in two units that are not one size: ["7.1 GiB of resident memory (7.4 GB", ...]."""
    wrong = []
    for m in (m for m in TWO_UNITS.finditer(text) if m["ua"] != m["ub"]):
        a, b = (float(m["a"]), m["ua"]), (float(m["b"]), m["ub"])
        ranges = [((v - 0.5 * 10 ** -d) * UNITS[u], (v + 0.5 * 10 ** -d) * UNITS[u])
                  for (v, u), d in ((a, len(m["a"].partition(".")[2])), (b, len(m["b"].partition(".")[2])))]
        if ranges[0][1] < ranges[1][0] or ranges[1][1] < ranges[0][0]:
            wrong.append(m.group(0))
    return wrong


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_a_figure_has_one_value_across_the_documents(figure):
    wrong = disagreements(figure, {doc: read(doc) for doc in documents()})
    assert not wrong, f"{figure.name} is measured in {figure.home}; these documents state another value: {wrong}. " \
                      f"State the home's value, or link to {figure.home} instead"


def test_a_size_in_two_units_is_one_size():
    wrong = {doc: pairs for doc in documents() if (pairs := unit_pairs(read(doc)))}
    assert not wrong, f"sizes whose two units disagree: {wrong}"


def test_the_checks_find_what_they_are_for():
    """Hand-made statements: a figure within its digits passes; another value, or a range that misses it, fails."""
    checkpoint, run = FIGURES[0], FIGURES[3]
    texts = {checkpoint.home: "At 4B that\n  is 49.8 GB (coreward2: 67.5 GB), and final/",
             "A.md": "at 4B, 49.8 GB and 149.5 GB", "B.md": "A checkpoint every 10 steps (about 48 GB: see",
             "C.md": "For Qwen3-4B that is about 50 GB"}
    assert disagreements(checkpoint, texts) == [("B.md", "checkpoint every 10 steps (about 48 GB")]
    exercises = "the default run takes 3 to 5 minutes on 2 idle cores"
    assert disagreements(run, {run.home: "| **wall clock** | **135.0** |", "E.md": exercises}) == \
        [("E.md", "run takes 3 to 5 minutes")]
    assert disagreements(run, {run.home: "| **wall clock** | **240.4** |", "E.md": exercises}) == []
    assert disagreements(run, {"E.md": exercises})[0][0] == run.home
    assert unit_pairs("at 7.1 GiB (7.6 GB) and 7.1 GiB of resident memory (7.4 GB; 2:48)") == \
        ["7.1 GiB of resident memory (7.4 GB"]
