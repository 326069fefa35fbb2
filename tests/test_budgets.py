"""The reader's budgets: the recipe, config.py and harness/ in 6,000 lines, no function over 60, README.md in 8,000
bytes and the tracked documents in 170,000, a default step through at most 35 recipe functions (tools/trace_step.py),
and the loss's sums read by the record only under the names the loss fills (harness/record.py's LossSums)."""
import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

RECIPE = ("rollout.py", "rewards.py", "teacher.py", "grpo.py", "train.py", "eval.py", "config.py")
LINES, FUNCTION_LINES, README_BYTES, DOCUMENT_BYTES, STEP_FUNCTIONS = 6000, 60, 8000, 170_000, 35


def code_files():
    return [os.path.join(ROOT, name) for name in RECIPE] + sorted(glob.glob(os.path.join(ROOT, "harness", "*.py")))


def long_functions(path, limit):
    """[(name, lines)] of the functions in `path` longer than `limit` lines (docstring included)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(open(path).read()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit]


def test_the_recipe_and_the_harness_fit_their_lines():
    lines = sum(len(open(path).read().splitlines()) for path in code_files())
    assert lines <= LINES, f"the recipe, config.py and harness/ hold {lines} lines, over {LINES}"


def test_no_function_is_over_60_lines():
    long = {os.path.relpath(path, ROOT): found for path in code_files() if (found := long_functions(path, FUNCTION_LINES))}
    assert long == {}


def test_a_long_function_is_found(tmp_path):
    planted = tmp_path / "long.py"
    planted.write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 60)
    assert long_functions(str(planted), FUNCTION_LINES) == [("long", 61)]


def test_the_readme_and_the_documents_fit_their_bytes():
    documents = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    total = sum(os.path.getsize(os.path.join(ROOT, name)) for name in documents.stdout.split())
    readme = os.path.getsize(os.path.join(ROOT, "README.md"))
    assert readme <= README_BYTES and total <= DOCUMENT_BYTES, (readme, total)


def stats_written(source):
    """The LossSums and ViewSums fields `source` (grpo.py) fills: the keywords of its `add(...)` calls and of its
    `LossSums(...)`, and the fields it assigns (`stats.grad_norm = ...`)."""
    written = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("add", "LossSums"):
            written |= {k.arg for k in node.keywords if k.arg}
        elif isinstance(node, ast.Assign):
            written |= {t.attr for t in node.targets if isinstance(t, ast.Attribute) and
                        getattr(t.value, "id", None) == "stats"}
    return written


def stats_read(source):
    """The fields `source` (harness/record.py) reads of a step's stats: s.stats.NAME, s.stats.views[v].NAME, and
    v.NAME over `for v in s.stats.views`."""
    read = set(re.findall(r"stats\.(\w+)", source)) - {"views"}
    return read | set(re.findall(r"views\[v\]\.(\w+)", source)) | \
        set(re.findall(r"\bv\.(\w+) for v in s\.stats\.views", source))


def test_the_record_reads_only_the_sums_the_loss_fills():
    import dataclasses
    from harness.record import LossSums, ViewSums
    fields = {f.name for cls in (LossSums, ViewSums) for f in dataclasses.fields(cls)} - {"views"}
    written = stats_written(open(os.path.join(ROOT, "grpo.py")).read())
    read = stats_read(open(os.path.join(ROOT, "harness", "record.py")).read())
    assert written == fields, "LossSums' fields that grpo.py never fills, or fills without a field"
    assert read and read <= written, f"the record reads sums the loss does not name: {read - written}"


def test_a_sum_the_loss_does_not_name_is_found():
    written = stats_written("def tally(stats):\n    add(stats, tokens=1, kl_sum=2)\n    stats.grad_norm = 3\n")
    read = stats_read('RECORD = [("kl", lambda s: s.stats.kl_total), ("t", lambda s, v=v: s.stats.views[v].tokens)]')
    assert written == {"tokens", "kl_sum", "grad_norm"} and read - written == {"kl_total"}


@pytest.mark.first
@pytest.mark.vllm
def test_a_default_step_passes_through_at_most_35_recipe_functions():
    """tools/trace_step.py traces the second step of the default coreward1 run (sys.setprofile), on vLLM: the default
    engine where it is installed."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "trace_step.py"), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    by_file = json.loads(run.stdout.strip().splitlines()[-1])
    count = sum(map(len, by_file.values()))
    assert count <= STEP_FUNCTIONS, f"a default step passes through {count} recipe functions: {by_file}"
    assert "training_step" in by_file["train.py"] and "train_step" in by_file["grpo.py"]
