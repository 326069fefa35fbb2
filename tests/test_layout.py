"""The layout: the recipe on top, the harness beneath. Arrows go down only (nothing in harness/ imports a recipe
file), and a setting's default is written once, in config.py's PRESET_TABLE."""
import ast
import glob
import os

from conftest import ROOT

RECIPE = ("rollout.py", "rewards.py", "teacher.py", "grpo.py", "train.py", "eval.py", "config.py")


def python_files(where):
    return sorted(glob.glob(os.path.join(ROOT, where, "*.py")))


def imported(path):
    """The top-level names of every module `path` imports (`from harness import x` gives harness)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def arrows_up(harness_files):
    """[(harness module, the recipe file it imports)]."""
    recipe = {name.removesuffix(".py") for name in RECIPE}
    return [(os.path.relpath(path, ROOT), name) for path in harness_files for name in sorted(imported(path) & recipe)]


def test_the_top_level_is_the_recipe_and_nothing_beneath_imports_it():
    assert sorted(os.path.basename(p) for p in python_files(".")) == sorted(RECIPE)
    assert python_files("harness") and arrows_up(python_files("harness")) == []


def test_an_arrow_up_is_found(tmp_path):
    up = tmp_path / "up.py"
    up.write_text("import os\nfrom grpo import make_batch\n")
    assert arrows_up([str(up)]) == [(os.path.relpath(str(up), ROOT), "grpo")]


def is_value(node):
    return isinstance(node, ast.Constant) and node.value is not None and node.value is not False


def defaults_written(path, settings):
    """[(line, setting)] where `path` writes a value for a setting outside PRESET_TABLE: a parameter's default or a
    dataclass field's value, or a dict literal that maps a setting's name to a constant. None and False (a switch
    left off unless asked for) are no value."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + \
                [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            found += [(d.lineno, arg.arg) for arg, d in pairs if arg.arg in settings and is_value(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if node.target.id in settings and is_value(node.value):
                found.append((node.lineno, node.target.id))
        elif isinstance(node, ast.Dict):
            found += [(k.lineno, k.value) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                      and k.value in settings and isinstance(v, ast.Constant)]
    return sorted(found)


def test_a_default_is_written_once_in_the_preset_table():
    import config
    settings = {name for name, *_ in config.PRESET_TABLE}
    files = [os.path.join(ROOT, name) for name in RECIPE] + python_files("harness")
    twice = {os.path.relpath(f, ROOT): found for f in files if (found := defaults_written(f, settings))}
    assert twice == {}, f"settings' defaults written outside config.PRESET_TABLE: {twice}"


def test_a_default_written_twice_is_found(tmp_path):
    twice = tmp_path / "twice.py"
    twice.write_text("from dataclasses import dataclass\n@dataclass\nclass C:\n    micro_batch_size: int = 64\n"
                     "def f(x, lr=1e-4, seed=None):\n    pass\nADDED = {'overlong_buffer': 8}\n")
    assert defaults_written(str(twice), {"micro_batch_size", "lr", "seed", "overlong_buffer"}) == \
        [(4, "micro_batch_size"), (5, "lr"), (7, "overlong_buffer")]
