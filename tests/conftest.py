import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.fixture
def dist_world():
    """A process group of one (gloo), as train.py has under `python train.py`. Per test: closing
    a vLLM engine tears down the process group it shares."""
    from sharding import init_distributed
    return init_distributed()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised classroom-sized Qwen3 with the classroom tokenizer, saved to disk."""
    import torch
    from transformers import Qwen3ForCausalLM
    import world
    out = str(tmp_path_factory.mktemp("tiny"))
    tok = world.build_tokenizer()
    torch.manual_seed(0)
    Qwen3ForCausalLM(world.model_config(len(tok))).save_pretrained(out)
    tok.save_pretrained(out)
    return out
