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


UNITS = {"GB": 1e9, "GiB": 2 ** 30, "MB": 1e6, "MiB": 2 ** 20, "s": 1.0, "minutes": 60.0, "min": 60.0,
         "hours": 3600.0}
NUMBER = r"(?P<v>\d+(?:\.\d+)?)"
HIGH = r"(?P<high>\d+(?:\.\d+)?)"
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
    Figure("the classroom's checkpoint", "bench/checkpoint.md", "MiB",
           rf"\| classroom \(0\.9M\) \| policy \+ AdamW \| {NUMBER} MiB",
           (rf"coreward1 on classroom\b[^\n]*?checkpoints of {NUMBER} (?P<unit>MB|MiB)\b",)),
    Figure("the training phase's memory, by the account", "bench/memory.md", "GB",
           rf"\| \*\*total\*\* \| \*\*{NUMBER}–{HIGH}\*\*",
           (rf"training phase's {ABOUT}{NUMBER}(?:–{HIGH})? GB",
            rf"[Tt]raining (?:takes|needs|uses|holds) {ABOUT}{NUMBER}(?:–{HIGH})? GB")),
    Figure("the seed run's time", "GPUS.md", "hours", rf"\| time \| {NUMBER}–{HIGH} hours",
           (rf"160 GB of disk[^.]*?{NUMBER}–{HIGH} hours", rf"should take {ABOUT}{NUMBER}–{HIGH} hours")),
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


def ends(match, unit):
    """[(low, high)] in base units of each end of what a match states, one for a value and two for a range, each
    widened by the rounding of its last digit ("about 48 GB": 47.5 to 48.5 GB)."""
    groups = match.groupdict()
    scale, seconds = UNITS[groups.get("unit") or unit], float(groups.get("s") or 0)
    rounding = lambda v: 0.5 * 10 ** -len(v.partition(".")[2])
    return [((float(v) - rounding(v)) * scale + seconds, (float(v) + rounding(v)) * scale + seconds)
            for v in (groups["v"], groups.get("high")) if v]


def agree(home, stated):
    """Whether `stated` (ends) is the figure `home` (ends) within the digits of both: a range end for end; a value
    within the other's range ("3 to 5 minutes" of 240.4 s)."""
    overlap = lambda a, b: a[0] <= b[1] and b[0] <= a[1]
    if len(home) == len(stated):
        return all(overlap(h, s) for h, s in zip(home, stated))
    return overlap((home[0][0], home[-1][1]), (stated[0][0], stated[-1][1]))


def disagreements(figure, texts):
    """The statements of `figure` in `texts` ({document: its text}) whose value is not its home's: [(document, the
    statement)]; or the home's own words when the home does not measure it."""
    home = re.search(figure.measured, texts.get(figure.home, ""))
    if home is None:
        return [(figure.home, f"does not state {figure.name} as {figure.measured!r}")]
    measured = ends(home, figure.unit)
    return [(doc, " ".join(match.group(0).split())) for doc, text in sorted(texts.items())
            for pattern in figure.quoted for match in re.finditer(pattern, text)
            if not agree(measured, ends(match, figure.unit))]


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


def test_a_range_agrees_end_for_end_and_a_coarser_home_by_its_digits():
    """A range quoted from a range agrees only end for end; a statement finer than its home agrees within the home's
    digits (11.7 MiB is 12.21 to 12.32 MB: 12.2 MB is it, 11.8 MB is not)."""
    run, checkpoint = (next(f for f in FIGURES if f.name == name) for name in ("the seed run's time",
                                                                               "the classroom's checkpoint"))
    home = {run.home: "| time | 6.7–8.6 hours: 162 steps"}
    assert disagreements(run, {**home, "R.md": "160 GB of disk, 6.5–8.5 hours"}) == \
        [("R.md", "160 GB of disk, 6.5–8.5 hours")]
    assert disagreements(run, {**home, "R.md": "160 GB of disk, 6.7–8.6 hours"}) == []
    home = {checkpoint.home: "| classroom (0.9M) | policy + AdamW | 11.7 MiB |"}
    line = "coreward1 on classroom, preset classroom: ...; checkpoints of {} MB, at most"
    assert disagreements(checkpoint, {**home, "R.md": line.format("12.2")}) == []
    assert disagreements(checkpoint, {**home, "R.md": line.format("11.8")}) == \
        [("R.md", "coreward1 on classroom, preset classroom: ...; checkpoints of 11.8 MB")]


def near(stated, value):
    """Whether a figure as written ("2.8") is `value` rounded to its digits."""
    return abs(float(stated.replace(",", "")) - value) <= 0.5 * 10 ** -len(stated.partition(".")[2]) + 1e-9


def test_the_seed_runs_time_adds_up():
    """GPUS.md's time row from the parts GPUS.md derives it from: a rank's training phase timed on one H200, the
    rollout at a multiple of it (twice that with Co-rewarding-III's teacher), a step's responses a GPU; an evaluation
    before the first step, every N steps and after the last, its responses a GPU sampled at the rollout's rate. Each
    column's hours, step minutes and evaluations, the evaluations' share of the run, the rollout's rate as stated,
    and eval.py --paper's hours on one GPU (its benchmarks' questions, each answered 1 + k times), within their
    digits."""
    import eval as evaluation
    from harness import data
    text = " ".join(read("GPUS.md").split())
    train_s = float(re.search(r"training phase, (\d+) s on one H200", text).group(1))
    rollout = [float(f) for f in re.search(r"taken as ([\d.]+) to ([\d.]+) times that", text).groups()]
    assert "twice for Co-rewarding-III" in text
    per_gpu = int(re.search(r"responses of up to [\d,]+ tokens, (\d+) per GPU", text).group(1))
    every, per_eval = map(int, re.search(r"every (\d+) steps and after the last, (\d+) responses per GPU",
                                         text).groups())
    steps = [int(n) for n in re.search(r"\| steps \| [^|]*?= (\d+) \| [^|]*?= (\d+) \|", text).groups()]
    columns = re.search(r"\| time \| ([^|]*) \| ([^|]*) \|", text).groups()
    wrong = []
    for column, n_steps, samplers in zip(columns, steps, (1, 2)):
        evals = 1 + n_steps // every + (n_steps % every > 0)
        step_s = [train_s * (1 + samplers * f) for f in rollout]
        eval_s = [per_eval / per_gpu * train_s * f for f in rollout]
        hours = [(n_steps * s + evals * e) / 3600 for s, e in zip(step_s, eval_s)]
        share = [100 * evals * e / (3600 * h) for e, h in zip(eval_s, hours)]
        stated = {"hours": (re.match(r"([\d.]+)–([\d.]+) hours", column), hours),
                  "step minutes": (re.search(rf"{n_steps} steps of ([\d.]+)–([\d.]+) minutes", column),
                                   [s / 60 for s in step_s]),
                  "evaluations": (re.search(r"(\d+) evaluations", column), [evals]),
                  "evaluation minutes": (re.search(r"evaluations of ([\d.]+)–([\d.]+) minutes", column),
                                         [e / 60 for e in eval_s]),
                  "evaluations' share": (re.search(r"(\d+)–(\d+)%", column), share)}
        for what, (match, values) in stated.items():
            if match is None and what in ("hours", "step minutes", "evaluations"):
                wrong.append(f"{column!r} gives no {what}")
            elif match and not all(map(near, match.groups(), values)):
                wrong.append(f"{column!r}: {what} {'–'.join(match.groups())}, derived "
                             f"{'–'.join(f'{v:.3g}' for v in values)}")
    for n, low, high in re.findall(r"(\d+) in (\d+)–(\d+) s\b", text):
        if not (int(n) == per_gpu and near(low, train_s * rollout[0]) and near(high, train_s * rollout[1])):
            wrong.append(f"the rollout's rate: {n} in {low}–{high} s, derived {per_gpu} in "
                         f"{train_s * rollout[0]:.3g}–{train_s * rollout[1]:.3g} s")
    questions = sum(len(data.load_benchmark(name)) for name in evaluation.PAPER_BENCHMARKS)
    paper = re.search(r"\(([\d,]+) questions\) greedily and (\d+) times.*? takes ([\d.]+)–([\d.]+) hours, derived "
                      r"as the run's time is \(([\d,]+) responses", text)
    responses = questions * (1 + evaluation.parse_args(["--model", "m", "--paper"]).k)
    hours = [responses / per_gpu * train_s * f / 3600 for f in rollout]
    if paper is None or not (near(paper.group(1), questions) and near(paper.group(2), responses // questions - 1)
                             and near(paper.group(5), responses) and all(map(near, paper.group(3, 4), hours))):
        wrong.append(f"eval.py --paper: {paper and paper.group(0)!r}, derived {questions} questions answered "
                     f"{responses // questions} times, {hours[0]:.3g}–{hours[1]:.3g} hours")
    assert not wrong, f"GPUS.md's time disagrees with the parts it is derived from: {wrong}"
