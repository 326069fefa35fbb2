"""Every relative link in the documents leads somewhere: its file exists, and its #anchor is a heading of that file
(GitHub's anchor of a heading: lower case, punctuation dropped but - and _, spaces as -). A section cited by its name
is in the file cited: a heading, or a paragraph's or item's bold lead (`**Several nodes.**`), within the #anchor's
section where the link has one."""
import os
import re

from conftest import ROOT
from test_figures import documents

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A section cited by name, in double or single quotes: after its file's link or path, `([RECIPE.md](RECIPE.md),
# "Co-rewarding-III against its script")`, `(bench/gpu.md, 'One H200, 2026-12-04')`; or before its link, `"A real
# model on a CPU" in [GPUS.md](../GPUS.md)`. Groups: the link or path, the name.
NAME = r"(?:\"(?P<{0}>[^\"\n]+)\"|'(?P<{0}_>[^'\n]+)'(?=[\s).,;:]))"
CITATIONS = [re.compile(r"\[[^\]]*\]\((?P<link>[^)\s]+)\),\s+" + NAME.format("name")),
             re.compile(r"(?<![\w/.-])(?P<link>(?:[\w.-]+/)*[\w-]+\.md),\s+" + NAME.format("name")),
             re.compile(NAME.format("name") + r" in \[[^\]]*\]\((?P<link>[^)\s]+)\)")]


def anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def sections(path):
    """{anchor: the section's text, to the next heading of its level or above}, and "" for the whole file."""
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)
    headings = [(m.start(), len(m.group(1)), anchor(m.group(2))) for m in re.finditer(r"^(#+) (.*)$", text, re.M)]
    found = {"": text}
    for i, (start, level, name) in enumerate(headings):
        end = next((s for s, lv, _ in headings[i + 1:] if lv <= level), len(text))
        found.setdefault(name, text[start:end])
    return found


def names(text):
    """The section names of a text: its headings and its bold leads (of a paragraph or an item), without a closing
    full stop or colon."""
    heads = re.findall(r"^#+ (.*)$", text, re.M) + re.findall(r"^(?:[-*] |\d+\. )?\*\*([^*\n]+)\*\*", text, re.M)
    return {" ".join(h.split()).rstrip(".:").casefold() for h in heads}


def broken_citations(doc, text=None):
    """[(file, the name, why)] of the sections `doc` cites by name (CITATIONS) that its file does not have."""
    text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, doc)).read() if text is None else text, flags=re.S)
    broken = []
    for pattern in CITATIONS:
        for m in pattern.finditer(" ".join(text.split())):
            link, name = m.group("link"), m.group("name") or m.group("name_")
            if re.match(r"[a-z]+:", link):
                continue
            path, _, fragment = link.partition("#")
            target = next((t for t in (os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)),
                                       os.path.join(ROOT, path)) if os.path.isfile(t)), None)
            if target is None:
                broken.append((link, name, "no such file"))
            elif target.endswith(".md") and (section := sections(target).get(fragment)) is not None and \
                    " ".join(name.split()).rstrip(".:").casefold() not in names(section):
                broken.append((link, name, f"no heading or bold lead of that name in {os.path.relpath(target, ROOT)}"
                                           + (f"#{fragment}" if fragment else "")))
    return broken


def broken_links(doc):
    """[(link, why)] of the relative links of `doc` that lead nowhere."""
    broken = []
    text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, doc)).read(), flags=re.S)
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):                     # https:, mailto:
            continue
        path, _, fragment = link.partition("#")
        target = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else \
            os.path.join(ROOT, doc)
        if not os.path.exists(target):
            broken.append((link, "no such file"))
        elif fragment and target.endswith(".md") and fragment not in anchors(target):
            broken.append((link, "no such heading"))
    return broken


def test_every_link_leads_somewhere():
    broken = {doc: b for doc in documents() if (b := broken_links(doc))}
    assert not broken, f"links that lead nowhere: {broken}"


def test_every_section_cited_by_name_is_there():
    broken = {doc: b for doc in documents() if (b := broken_citations(doc))}
    assert not broken, f"sections cited by a name their file does not have: {broken}; cite the file that has it"


def test_a_citation_by_name_is_read_and_checked():
    """Hand-made citations in each form: a heading, a bold lead, within an anchor's section; a name the file lacks,
    one outside the anchor's section, and a section that moved to another file are reported."""
    cited = lambda text: [(link, name) for link, name, _ in broken_citations("GPUS.md", text)]
    assert cited('([RECIPE.md](RECIPE.md), "Co-rewarding-III against its script") and ([GPUS.md](GPUS.md), '
                 '"Several nodes"); "A real model on a CPU" in [GPUS.md](GPUS.md); [memory](bench/memory.md'
                 '#the-memory-account-at-scale), "Disk"; (bench/gpu.md, \'One H200, 2026-12-04\')') == []
    assert cited('([RECIPE.md](RECIPE.md), "Co-rewarding-IV against its script"); [memory](bench/memory.md'
                 '#the-savings), "Disk"; (bench/README.md, \'One H200, 2026-12-04\'); the seed model\'s run') == \
        [("RECIPE.md", "Co-rewarding-IV against its script"), ("bench/memory.md#the-savings", "Disk"),
         ("bench/README.md", "One H200, 2026-12-04")]


def test_an_anchor_is_githubs():
    assert anchor("The loss family and the controls (study/losses, study/controls, study/losses_lr5e-4)") == \
        "the-loss-family-and-the-controls-studylosses-studycontrols-studylosses_lr5e-4"
    assert anchor("Memory at scale") == "memory-at-scale"
