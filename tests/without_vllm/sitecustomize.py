"""With this folder on PYTHONPATH, vLLM cannot be imported by any Python process started so (its children
inherit PYTHONPATH), as on a machine where it does not install: `import vllm` raises ImportError and
`importlib.util.find_spec("vllm")` finds nothing. .ci/run runs the suite's vLLM-free part this way:

    PYTHONPATH=tests/without_vllm python -m pytest -m "not vllm"
"""
import sys

sys.modules["vllm"] = None
