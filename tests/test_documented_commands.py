"""Every command the documents give, read out of them: README.md, RECIPE.md, GPUS.md, DATA.md, RESUME.md, METRICS.md, EXERCISES.md, WALKTHROUGH.md, bench/'s
files and the READMEs of classroom/ and of every folder of study/, in their bash blocks and their inline code. Each script a
command names runs from the repository root, in a subprocess, with --help (the whole command is long: a run, a
study), so that a script that cannot start (a lost import, a moved file) fails here; a train.py or eval.py command's
flags are parsed and checked as the script would before it runs anything, so that a flag the script does not know, or
a setting it refuses, fails here too. A block that feeds Python a snippet (`python - <<'EOF'`) runs whole. A new
command is covered when it is written."""
import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

import config
from conftest import ROOT

DOCUMENTS = ["README.md", "RECIPE.md", "GPUS.md", "DATA.md", "RESUME.md", "METRICS.md", "EXERCISES.md", "WALKTHROUGH.md", "classroom/README.md"] + \
    sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "bench", "*.md"))) + \
    sorted(os.path.relpath(path, ROOT)
           for path in glob.glob(os.path.join(ROOT, "study", "**", "README.md"), recursive=True))
LAUNCHERS = ("python", "python3", "torchrun")
# methods the exercises have the reader add to rewards.METHOD_TABLE, and the method whose settings each has
EXERCISE_METHODS = {"coreward1_soft": "coreward1"}


def shell_lines(text):
    """The lines of the bash blocks, continuation lines joined, and each heredoc as (line, its body)."""
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines, body = iter(block.replace("\\\n", " ").splitlines()), None
        for line in lines:
            heredoc = re.search(r"<<'?(\w+)'?", line)
            if heredoc:
                body = "\n".join(iter(lambda: next(lines), heredoc.group(1)))
            yield line, body
            body = None


def words_of(command):
    """A command's words as the shell splits them; a line that opens a quote it closes on a later line
    (`python -c "...`) is split at its spaces."""
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def commands():
    """(document, command words, heredoc body or None) of every command a document gives that starts one of the
    repository's scripts: the bash blocks' lines and the inline code spans that start with a launcher."""
    found = []
    for doc in DOCUMENTS:
        text = open(os.path.join(ROOT, doc)).read()
        inline = [(span, None) for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
        for line, body in list(shell_lines(text)) + inline:
            for part in re.split(r"&&|;|\|", line.split(" #")[0]):
                words = words_of(part.split("<<")[0])
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):       # OMP_NUM_THREADS=1 python ...
                    words = words[1:]
                if words and words[0] in LAUNCHERS:
                    found.append((doc, words, body if "<<" in part else None))
    return found


def script_of(words):
    """(the repository's script a command starts, its arguments), or (None, None): `python -m ...`, a heredoc,
    a script outside the repository (the exercises' /tmp/ex/show.py)."""
    args = [w for w in words[1:] if w != "..."]                      # "...": the prose's other flags
    if words[0] == "torchrun":                                         # its own flags, then the script's
        args = args[next((i for i, w in enumerate(args) if w.endswith(".py")), len(args)):]
    if not args or args[0] in ("-", "-c", "-m") or not args[0].endswith(".py") or os.path.isabs(args[0]):
        return None, None
    return args[0], args[1:]


COMMANDS = commands()
SCRIPTS = sorted({script_of(words)[0] for _, words, _ in COMMANDS} - {None})
# the bash blocks that feed Python a snippet, each with what it needs before it (a copy, a drawing): run whole
SNIPPET_BLOCKS = [(doc, block) for doc in DOCUMENTS
                  for block in re.findall(r"```bash\n(.*?)```", open(os.path.join(ROOT, doc)).read(), re.S)
                  if re.search(r"^python3? - <<", block, re.M)]


def test_the_documents_give_commands():
    """The reader finds them: the README's default run, RECIPE.md's seed run, the study's and the exercises."""
    given = {" ".join(words) for _, words, _ in COMMANDS}
    assert {"python train.py --method coreward1", "python classroom/check_reward.py"} <= given
    assert {"train.py", "eval.py", "study/study.py", "study/plot.py", "tools/smollm.py"} <= set(SCRIPTS)


@functools.cache
def runs_help(script):
    res = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_documented_script_starts(script):
    assert os.path.isfile(os.path.join(ROOT, script)), f"{script} is named in the documents but does not exist"
    status, out = runs_help(script)
    assert status == 0 and "usage:" in out, f"python {script} --help failed (status {status}):\n{out[-2000:]}"


@pytest.mark.parametrize("doc, words", [(doc, words) for doc, words, _ in COMMANDS
                                         if script_of(words)[0] in ("train.py", "eval.py")],
                         ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_each_documented_run_is_one_the_script_accepts(doc, words):
    """The flags as train.py (config.parse_args, then check_settings in the world --ranks asks for) or eval.py
    (its parser) take them; a --resume is checked against its checkpoint only when it runs."""
    import eval as evaluation
    script, args = script_of(words)
    if script == "eval.py":
        evaluation.parse_args(args)
        return
    args = [EXERCISE_METHODS.get(a, a) for a in args]
    if "--method" not in args and "--resume" not in args:             # a fragment in the prose: its flags
        args += ["--method", "gt"]
    settings = config.parse_args(args)
    if settings.resume is None:
        config.check_settings(settings, settings.ranks or 1)


@pytest.mark.parametrize("doc, block", SNIPPET_BLOCKS, ids=lambda x: x if x in DOCUMENTS else None)
def test_each_documented_snippet_runs(doc, block, tmp_path):
    """The block as bash runs it from the repository root, /tmp/ex (the exercises' folder) in a fresh folder."""
    script = block.replace("/tmp/ex", str(tmp_path / "ex"))
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, f"a block of {doc} failed:\n{block[:800]}\n{res.stderr[-2000:]}"


def test_no_two_documented_runs_write_into_one_folder():
    """config.default_out's promise: two different documented train.py runs never share an --out, so that a reader who
    runs one after the other is not refused (the same command given in two documents is one run)."""
    outs = {}
    for doc, words, _ in COMMANDS:
        script, args = script_of(words)
        if script != "train.py" or "--resume" in args or "--method" not in args:
            continue
        given = [EXERCISE_METHODS.get(a, a) for a in args]
        out = os.path.normpath(config.parse_args(given).out if "--out" in args else config.default_out(
            args[args.index("--method") + 1], config.parse_args(given).model))
        outs.setdefault(out, {})[" ".join(args)] = doc
    shared = {out: runs for out, runs in outs.items() if len(runs) > 1}
    assert not shared, f"documented runs that write into one folder: {shared}; give one of them --out"


SBATCH = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", open(os.path.join(ROOT, "GPUS.md")).read(), re.S).group(1)


def test_the_sbatch_scripts_run_is_one_train_py_accepts():
    """The seed run of GPUS.md's sbatch script, its words after torchrun's own flags, as train.py checks them on 8
    ranks; and the folder its requeue looks at is the run's --out."""
    line = re.search(r"^srun (.*?)$", SBATCH.replace("\\\n", " "), re.M).group(1)
    words = [w.replace('"$out"', "") for w in words_of(line)]
    assert words[0] == "torchrun" and "--max-restarts=3" in words
    script, args = script_of(words)
    args = [a if a else re.search(r"^out=(\S+)$", SBATCH, re.M).group(1) for a in args]
    assert script == "train.py"
    config.check_settings(config.parse_args(args), 8)


@pytest.mark.parametrize("status, finished, requeued", [(75, False, True), (1, False, True), (137, False, True),
                                                        (0, True, False), (2, False, False), (3, False, False)])
def test_the_sbatch_script_requeues_a_run_that_stopped_before_its_end(tmp_path, status, finished, requeued):
    """GPUS.md's sbatch script run by bash with a fake srun (which ends with the run's status, and writes final/ for
    a finished run) and a fake scontrol: a stop with its checkpoint (75), a lost rank (1) or a kill (137) requeue the
    job; a finished run, a refused one (2) and a guard's stop (3) do not; the script exits with the run's status."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text(f"#!/bin/bash\n{'mkdir -p runs/coreward1-Qwen3-4B-Base/final' if finished else ''}\n"
                               f"exit {status}\n")
    (bin_ / "scontrol").write_text('#!/bin/bash\necho "$@" >> scontrol.calls\n')
    for tool in ("srun", "scontrol"):
        os.chmod(bin_ / tool, 0o755)
    res = subprocess.run(["bash", "-c", SBATCH], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"})
    assert res.returncode == status, res.stderr
    calls = (tmp_path / "scontrol.calls").read_text() if (tmp_path / "scontrol.calls").exists() else ""
    assert calls == ("requeue 4242\n" if requeued else "")
