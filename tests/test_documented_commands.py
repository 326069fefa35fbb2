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
import shutil
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


# The programs the documents' commands start that no Python package installs, each with where it comes from; every
# other program a command starts must be among the environment's scripts (the venv's bin/).
SYSTEM_TOOLS = {"bash": "the shell", "apt-get": "Debian's and Ubuntu's package manager",
                "srun": "Slurm, on a cluster", "sbatch": "Slurm, on a cluster", "scontrol": "Slurm, on a cluster",
                "nvidia-smi": "the NVIDIA driver", "mkdir": "coreutils", "cp": "coreutils",
                "cat": "coreutils", "head": "coreutils"}
SHELL_WORDS = {".", "[", "[[", "cd", "echo", "exit", "export", "kill", "source", "set", "if", "then", "else", "elif",
               "fi", "do", "done", "while", "until", "for", "case", "esac", "!"}
LAUNCHING = ("srun", "sudo")                       # their program comes after their own flags
# inline code that starts with a word and more, but is no command: Python, and what a run prints
NOT_COMMANDS = {"import", "eval", "views", "wrong", "within"}


def programs_of(command):
    """The programs a shell command starts: the first word of each part (`&&`, `||`, `;`, `|`), environment
    assignments and shell keywords before it aside, a `for` header skipped; a launcher's program too; `$(...)` a
    command of its own. Quoted strings are read as words, a comment as nothing."""
    inner = re.findall(r"\$\(([^()]*)\)", command)
    command = re.sub(r"\"[^\"]*\"|'[^']*'", "Q", re.sub(r"\$\([^()]*\)", "Q", command), flags=re.S)
    found = [p for sub in inner for p in programs_of(sub)]
    for line in command.splitlines():
        line = "" if line.lstrip().startswith("#") else line.split(" #")[0]
        for part in re.split(r"&&|\|\||;|\|", line):
            words = part.split()
            while words and (re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]) or words[0] in ("if", "then", "do", "else",
                                                                                        "elif", "while", "!")):
                words = words[1:]
            if not words or words[0] == "for":
                continue
            found.append(words[0])
            if words[0] in LAUNCHING:
                found += [w for w in words[1:] if not w.startswith("-")][:1]
    return found


def documented_programs():
    """{program: the first (document, its line) that starts it}: every document's bash blocks, each heredoc's body
    aside, and their inline code spans that read as a command (two words or more, the first a program's name)."""
    from test_figures import documents
    found = {}
    for doc in documents():
        text = open(os.path.join(ROOT, doc)).read()
        blocks = [re.sub(r"<<-?'?(\w+)'?([^\n]*)\n.*?\n\1\n", r"\2\n", block.replace("\\\n", " "), flags=re.S)
                  for block in re.findall(r"```bash\n(.*?)```", text, re.S)]
        spans = [span for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
                 if re.fullmatch(r"(?:[A-Za-z_]\w*=\S* )*([a-z][\w+-]*) \S.*", span)
                 and span.split()[0] not in NOT_COMMANDS]
        for command in blocks + spans:
            for program in programs_of(command):
                line = next((line for line in command.splitlines() if program in line.split()), command)
                found.setdefault(program, (doc, line.strip()[:100]))
    return found


def test_each_documented_program_is_installed():
    """Every program the documents' commands start is a shell word, a system tool (SYSTEM_TOOLS, with its reason), or
    among the scripts of the environment the install made, so that a command naming a program no package here
    installs (`huggingface-cli`, which huggingface_hub no longer ships: `hf`) fails here."""
    import sysconfig
    scripts = sysconfig.get_path("scripts")
    found = documented_programs()
    assert {"python", "pip", "torchrun", "bash"} <= set(found), sorted(found)
    missing = {program: where for program, where in found.items()
               if program not in SHELL_WORDS | set(SYSTEM_TOOLS) and shutil.which(program, path=scripts) is None}
    assert not missing, f"programs the documents run that are not in {scripts}: {missing}; name the program the " \
        "install brings, or add a system tool to SYSTEM_TOOLS with where it comes from"


def test_the_programs_of_a_command_are_read_as_the_shell_starts_them():
    assert programs_of('OMP_NUM_THREADS=1 python train.py --out "a b" && hf download x | tee log; kill -9 1') == \
        ["python", "hf", "tee", "kill"]
    assert programs_of('srun --nodes=2 torchrun --rdzv_endpoint="$(scontrol show hostnames "$L" | head -n1):29500" '
                       'x.py') == ["scontrol", "head", "srun", "torchrun"]
    assert programs_of("# a comment\nfor m in a b; do python x.py; done\npython -c \"import x\nprint(1)\"") == \
        ["python", "done", "python"]


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


SCALE = 50      # the fake scheduler's clock: one of its seconds is 50 of the real node's


@pytest.mark.launcher
def test_a_preemption_under_the_sbatch_script_saves_the_step_in_flight(tmp_path):
    """GPUS.md's sbatch script under a fake Slurm whose clock runs SCALE times fast: srun runs the script's torchrun,
    its own flags kept (the shutdown wait scaled, torchrun's default 30 s when the script gives none), on the classroom
    world, where step 2 lasts the longest step GPUS.md gives (4.4 minutes, scaled). The scheduler's SIGTERM
    (`--signal=TERM@LEAD`) lands in step 2, and LEAD seconds later the time limit kills what is left. torchrun passes
    the signal on and waits: the step in flight ends, is saved as checkpoints/step_2, and the job is requeued. With
    torchrun's default wait the worker is killed mid-step and step 2 is lost."""
    import signal
    import time
    from harness import launch
    lead = int(re.search(r"^#SBATCH --signal=TERM@(\d+)$", SBATCH, re.M).group(1))
    assert f"--shutdown-timeout={launch.SHUTDOWN_WAIT_S} " in SBATCH           # torchrun waits as --ranks does
    longest_step_s = 60 * max(float(m) for m in re.findall(r"steps of [0-9.]+–([0-9.]+) minutes",
                                                          open(os.path.join(ROOT, "GPUS.md")).read()))
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text(f"""#!{sys.executable}
import os, re, sys
open("srun.pid", "w").write(str(os.getpid()))
words = sys.argv[1:]
cut = words.index("train.py")
flags = " ".join(words[1:cut]).replace("--shutdown-timeout ", "--shutdown-timeout=")
wait = int(re.search(r"--shutdown[-_]timeout=(\\d+)", flags).group(1)) if "--shutdown" in flags else 30
restarts = re.search(r"--max-restarts=(\\d+)", flags).group(1)
out = words[words.index("--out") + 1]
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
         f"--max-restarts={{restarts}}", f"--shutdown-timeout={{wait // {SCALE}}}",
         {os.path.join(ROOT, "tests", "train_slow_step.py")!r}, "--method", "gt", "--steps", "3", "--save_every", "0",
         "--questions_per_step", "4", "--group_size", "4", "--out", out])
""")
    (bin_ / "scontrol").write_text('#!/bin/bash\necho "$@" >> scontrol.calls\n')
    for tool in ("srun", "scontrol"):
        os.chmod(bin_ / tool, 0o755)
    job = subprocess.Popen(["bash", "-c", SBATCH], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True,
                           env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
                                "SLOW_STEP": "2", "SLOW_S": str(longest_step_s / SCALE), "OMP_NUM_THREADS": "1"})
    printed = []
    for line in job.stdout:                                 # until the step in flight begins
        printed.append(line)
        if "in step 2" in line:
            break
    else:
        pytest.fail("the run never reached step 2:\n" + "".join(printed[-20:]))
    os.kill(int((tmp_path / "srun.pid").read_text()), signal.SIGTERM)      # Slurm signals the job step's tasks
    try:
        rest, _ = job.communicate(timeout=lead / SCALE)
    except subprocess.TimeoutExpired:                        # the time limit
        os.killpg(job.pid, signal.SIGKILL)
        rest, _ = job.communicate()
        pytest.fail(f"the job outlived its time limit ({lead / SCALE:.0f} s after the signal):\n{rest[-3000:]}")
    out = tmp_path / "runs" / "coreward1-Qwen3-4B-Base"
    assert (out / "checkpoints" / "step_2").is_dir(), "".join(printed) + rest
    assert not (out / "final").exists() and "stopped after step 2 of 3" in rest
    assert (tmp_path / "scontrol.calls").read_text() == "requeue 4242\n"
