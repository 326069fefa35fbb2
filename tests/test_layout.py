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


def preset_names(tree):
    """The names a module binds to a preset (`CLASSROOM = config.PRESETS["classroom"]`, a tuple of them too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in getattr(target, "elts", [target])]
            values = getattr(node.value, "elts", [node.value])
            names |= {t.id for t, v in zip(targets, values) if isinstance(t, ast.Name) and reads_presets(v, set())}
    return names


def reads_presets(node, names):
    """Whether `node` is PRESETS[...] (config.PRESETS too), or a subscript of it or of a name bound to a preset."""
    if not isinstance(node, ast.Subscript):
        return False
    of = node.value
    return getattr(of, "id", getattr(of, "attr", None)) == "PRESETS" or (isinstance(of, ast.Name) and of.id in names) \
        or reads_presets(of, names)


def defaults_written(path, settings):
    """[(line, setting)] where `path` writes a default for a setting outside PRESET_TABLE: a value for a parameter,
    a dataclass field, a dict key or an argparse flag of a setting's name (None and False, a switch left off unless
    asked for, are no value), or a preset's value (`CLASSROOM["eval_k"]`) as a parameter's or a flag's default, which
    stands in for the setting the caller has. A method's own values (rewards.MORE_SETTINGS, as its row's β) are no
    default."""
    tree = ast.parse(open(path).read())
    presets = preset_names(tree)
    methods = {id(d) for node in ast.walk(tree) if isinstance(node, ast.Assign)            # a method's own values
               and any(getattr(t, "id", None) == "MORE_SETTINGS" for t in node.targets) for d in ast.walk(node.value)}
    written = lambda name, node: (name in settings and is_value(node)) or reads_presets(node, presets)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + \
                [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            found += [(d.lineno, arg.arg) for arg, d in pairs if written(arg.arg, d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if node.target.id in settings and is_value(node.value):
                found.append((node.lineno, node.target.id))
        elif isinstance(node, ast.Dict) and id(node) not in methods:
            found += [(k.lineno, k.value) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                      and k.value in settings and isinstance(v, ast.Constant)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args and \
                isinstance(node.args[0], ast.Constant):
            flag = node.args[0].value.lstrip("-")
            found += [(k.value.lineno, flag) for k in node.keywords if k.arg == "default" and written(flag, k.value)]
    return sorted(found)


def setting_names():
    """The settings' names, and the names of eval.py's flags that stand for one (eval.AS_IN_TRAINING: --k, ...)."""
    import config
    import eval as evaluation
    return {name for name, *_ in config.PRESET_TABLE} | {flag for flag, *_ in evaluation.AS_IN_TRAINING}


def test_a_default_is_written_once_in_the_preset_table():
    files = [os.path.join(ROOT, name) for name in RECIPE] + python_files("harness")
    twice = {os.path.relpath(f, ROOT): found for f in files if (found := defaults_written(f, setting_names()))}
    assert twice == {}, f"settings' defaults written outside config.PRESET_TABLE: {twice}"


def test_a_default_written_twice_is_found(tmp_path):
    twice = tmp_path / "twice.py"
    twice.write_text("from dataclasses import dataclass\n@dataclass\nclass C:\n    micro_batch_size: int = 64\n"
                     "def f(x, lr=1e-4, seed=None):\n    pass\nADDED = {'overlong_buffer': 8}\n")
    assert defaults_written(str(twice), {"micro_batch_size", "lr", "seed", "overlong_buffer"}) == \
        [(4, "micro_batch_size"), (5, "lr"), (7, "overlong_buffer")]


def test_a_flags_default_and_a_presets_value_as_a_default_are_found(tmp_path):
    """As eval.py had them: its own --k 8 and --gpu_memory_utilization 0.9, and the classroom preset's values as
    eval_counts' defaults, under any parameter's name; a flag or a parameter defaulting to None is no default."""
    old = tmp_path / "old.py"
    old.write_text('import config\nCLASSROOM, OFFICIAL = config.PRESETS["classroom"], config.PRESETS["official"]\n'
                   'def eval_counts(engine, k=CLASSROOM["eval_k"],\n'
                   '                tokens=config.PRESETS["official"]["max_response_len"], limit=None):\n    pass\n'
                   'ap.add_argument("--k", type=int, default=8)\n'
                   'ap.add_argument("--gpu_memory_utilization", type=float, default=0.9)\n'
                   'ap.add_argument("--limit", type=int, default=None)\n'
                   'ap.add_argument("--max_tokens", default=OFFICIAL["max_response_len"])\n')
    assert defaults_written(str(old), {"k", "gpu_memory_utilization", "limit", "max_response_len"}) == \
        [(3, "k"), (4, "tokens"), (6, "k"), (7, "gpu_memory_utilization"), (9, "max_tokens")]
