"""Every relative link in the documents leads somewhere: its file exists, and its #anchor is a heading of that file
(GitHub's anchor of a heading: lower case, punctuation dropped but - and _, spaces as -)."""
import os
import re

from conftest import ROOT
from test_figures import documents

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


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


def test_an_anchor_is_githubs():
    assert anchor("The loss family and the controls (study/losses, study/controls, study/losses_lr5e-4)") == \
        "the-loss-family-and-the-controls-studylosses-studycontrols-studylosses_lr5e-4"
    assert anchor("Memory at scale") == "memory-at-scale"
