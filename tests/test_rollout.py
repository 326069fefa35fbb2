"""The rollout engines: after a weight sync, the sampler's log-probs are the trainer's.

Tolerance: 1e-4 per token (float32 on both sides; measured gaps are ~1e-7).
"""
import pytest
import torch

import world
from grpo import token_logprobs
from rollout import make_engine

TOL = 1e-4


def _perturbed(model_dir):
    """The trainer's model after some 'training': the saved weights plus noise."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _trainer_logprobs(model, sample, temperature):
    ids = torch.tensor([sample.prompt_ids + sample.token_ids])
    logp, _ = token_logprobs(model, ids, temperature)
    return logp[0, len(sample.prompt_ids) - 1:]


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_sampler_logprobs_match_trainer_after_sync(tiny_model_dir, backend):
    engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=16, seed=0)
    tok = engine.tokenizer
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:3]]
    model = _perturbed(tiny_model_dir)
    temperature = 0.7

    before = engine.generate(prompts, n=2, temperature=temperature, max_tokens=16)
    gap_before = max((_trainer_logprobs(model, s, temperature) - torch.tensor(s.logprobs)).abs().max().item()
                     for g in before for s in g)
    assert gap_before > 1e-2        # not synced yet: the engine still runs the saved weights

    engine.load_weights(model.state_dict().items())
    after = engine.generate(prompts, n=2, temperature=temperature, max_tokens=16)
    for group in after:
        assert len(group) == 2
        for s in group:
            assert len(s.token_ids) == len(s.logprobs) > 0
            trainer = _trainer_logprobs(model, s, temperature)
            assert torch.allclose(trainer, torch.tensor(s.logprobs), atol=TOL), (trainer, s.logprobs)
    engine.close()


def test_a_prompt_over_the_limit_is_refused(tiny_model_dir):
    engine = make_engine("hf", tiny_model_dir, max_prompt_len=8, max_response_len=4)
    with pytest.raises(ValueError, match="exceed the prompt limit of 8 tokens"):
        engine.generate([[1] * 5, [1] * 9], n=1, temperature=1.0, max_tokens=4)


def _texts(groups):
    return [[s.text for s in group] for group in groups]


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_a_seeded_prompt_gets_the_same_responses_in_any_batch(tiny_model_dir, backend):
    """With a seed, each prompt samples from streams of its own: a share of the prompts, in another
    order, gets what the whole batch got; another seed gets other responses."""
    engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=12, seed=0)
    tok = engine.tokenizer
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:6]]
    whole = _texts(engine.generate(prompts, n=3, temperature=1.0, max_tokens=12, seed=5))
    share = _texts(engine.generate(prompts[4:1:-1], n=3, temperature=1.0, max_tokens=12, seed=5))
    assert share == whole[4:1:-1]
    assert len({t for g in whole for t in g}) > 6                     # the responses of a group differ
    other = _texts(engine.generate(prompts, n=3, temperature=1.0, max_tokens=12, seed=6))
    assert other != whole
    engine.close()


def test_seeded_prompts_longer_than_one_scheduler_step(tiny_model_dir):
    """16 prompts of 200 tokens overflow vLLM's per-step token budget (2048), so a prompt may be
    split over scheduler steps; seeded sampling must still work (on a CPU, vLLM cannot rewind a
    request's generator after a split prompt, so the engine does not split them) and give each
    prompt the responses it gets alone."""
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=220, max_response_len=8, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 200, (200,), generator=g).tolist() for _ in range(16)]
    whole = _texts(engine.generate(prompts, n=2, temperature=1.0, max_tokens=8, seed=3))
    assert _texts(engine.generate(prompts[7:8], n=2, temperature=1.0, max_tokens=8, seed=3)) == whole[7:8]
    engine.close()
