"""bench/scale.py's accounts against what the code they describe counts: parameters, and a checkpoint's and
the final model's bytes (checkpoint.checkpoint_bytes, final_model_bytes)."""
import os
import sys

import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from harness import checkpoint
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import scale  # noqa: E402


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("teacher", [False, True])
def test_the_disk_account_counts_as_the_checkpoint_does(tied, teacher):
    c = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, tie_word_embeddings=tied)
    model = Qwen3ForCausalLM(Qwen3Config(**c))
    assert scale.param_count(c)[0] == sum(p.numel() for p in model.parameters())
    one, final, most = scale.disk_account(c, steps=25, save_every=10, keep_last=2, teacher=teacher)
    assert one == checkpoint.checkpoint_bytes(model, model if teacher else None)
    assert final == checkpoint.final_model_bytes(model)
    assert most == checkpoint.run_disk_bytes(one, final, 2, 3) == 3 * one        # 3 saves, 2 kept while one is written


def test_the_official_account_is_of_a_card_as_cuda_reports_it():
    """The rollout's share of the device is of the 85.0e9 bytes an "80 GB" card reports, not of 80e9."""
    phases, _ = scale.gpu_phases(scale.QWEN3_4B, utilization=0.75)
    assert phases["rollout"]["vLLM: 0.75 of the device"] == (0.75 * 85.0e9, 0.75 * 85.0e9)
