"""Co-rewarding-II's EMA teacher, the answer-free rewards, and coreward2/3 labels."""
import math

import pytest
import torch

from harness import world
from harness.logprobs import token_logprobs
from rewards import METHODS, label_groups, negative_entropy, self_certainty


def labels_for(*args):
    return label_groups(*args)[0]
from rollout import make_engine, request_seed
from harness.sharding import gather_full_weights, shard
from teacher import ema_alpha, ema_decay, ema_update, teacher_rollout
import config

EMA = config.PRESETS["classroom"]["ema_start"], config.PRESETS["classroom"]["ema_end"]     # --ema_start, --ema_end


def test_ema_update_by_hand(dist_world):
    teacher, policy = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        teacher.weight.copy_(torch.tensor([[1.0, -2.0]]))
        policy.weight.copy_(torch.tensor([[3.0, 4.0]]))
    ema_update(teacher, policy, alpha=0.25)
    # 0.75 * [1, -2] + 0.25 * [3, 4] = [1.5, -0.5]
    assert torch.allclose(teacher.weight, torch.tensor([[1.5, -0.5]]))
    assert torch.equal(policy.weight, torch.tensor([[3.0, 4.0]]))


def test_ema_update_on_sharded_models(dist_world, tiny_model_dir):
    from transformers import AutoModelForCausalLM
    load = lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain_t, plain_p = load(), load()
    with torch.no_grad():
        for p in plain_p.parameters():
            p.add_(1.0)
    expected = {k: 0.9 * v + 0.1 * plain_p.state_dict()[k] for k, v in plain_t.state_dict().items()}
    teacher, policy = shard(plain_t), shard(plain_p)
    ids = torch.tensor([[2, 3, 4, 5]])
    teacher(ids), policy(ids)              # as in training: forwards leave the root's parameters gathered
    ema_update(teacher, policy, alpha=0.1)
    for name, value in gather_full_weights(teacher):
        assert torch.allclose(value, expected[name], atol=1e-6), name


def test_cosine_schedule():
    """The paper's schedule (Eq. 11), both presets': from 0.99 to 0.9999."""
    assert EMA == (config.PRESETS["official"]["ema_start"], config.PRESETS["official"]["ema_end"]) == (0.99, 0.9999)
    assert ema_decay(0, 100, *EMA) == pytest.approx(0.99)
    assert ema_decay(50, 100, *EMA) == pytest.approx((0.99 + 0.9999) / 2)
    assert ema_decay(100, 100, *EMA) == pytest.approx(0.9999)
    assert ema_decay(25, 100, *EMA) == pytest.approx(0.9999 - 0.0099 * (1 + math.cos(math.pi / 4)) / 2)
    assert ema_decay(100, 100, 0.99, 0.99999) == pytest.approx(0.99999)
    values = [ema_decay(s, 100, *EMA) for s in range(101)]
    assert values == sorted(values)


def test_the_ema_weight_of_each_step_is_the_official_one():
    """α after step s of T is the official code's at the start of step s + 1 (`update_alpha`, t = global_steps - 1
    = s, alpha_start 0.01, alpha_end 1e-4): hand-computed at T = 60 for the first, a middle and the last two steps."""
    official = lambda s, T: 1e-4 + 0.5 * (0.01 - 1e-4) * (1 + math.cos(math.pi * max(0, min(s, T)) / T))
    # cos(pi / 60) = 0.9986295347545738: 1e-4 + 0.00495 x 1.9986295347545738; at 30: 1e-4 + 0.00495
    for step, expected in [(1, 0.009993216197035), (30, 0.00505), (59, 0.000106783802965)]:
        assert ema_alpha(step, 60, *EMA) == pytest.approx(expected, abs=1e-15)
        assert ema_alpha(step, 60, *EMA) == pytest.approx(official(step, 60), abs=1e-15)
    assert ema_alpha(60, 60, *EMA) == 0.0            # the policy after the last step: no step samples from it
    assert all(ema_alpha(s, 330, *EMA) == pytest.approx(official(s, 330), abs=1e-15) for s in range(330))


@pytest.mark.vllm
def test_the_teacher_samples_the_teacher_rollout(dist_world, tiny_model_dir):
    """The teacher's responses come from the teacher's weights; a load of the policy then serves the
    policy (train.py loads the updated policy after each step; test_train checks that every step's
    rollout runs the trainer's weights)."""
    from transformers import AutoModelForCausalLM
    load = lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    policy, teacher = shard(load()), shard(load())
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    from config import PRESETS
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=64, max_response_len=12, **{name: PRESETS["classroom"][
        name] for name in ("dtype", "cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib")})
    tok = world.build_tokenizer()
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:2]]

    def gap(model, groups):
        worst = 0.0
        for g in groups:
            for s in g:
                ids = torch.tensor([s.prompt_ids + s.token_ids])
                logp, _ = token_logprobs(model, ids, torch.ones(1, ids.shape[1] - 1), 1.0)
                worst = max(worst, (logp[0, len(s.prompt_ids) - 1:] - torch.tensor(s.logprobs)).abs().max().item())
        return worst

    seeds = [request_seed(0, "teacher", 1, i) for i in range(len(prompts))]
    taught = teacher_rollout(engine, teacher, prompts, seeds, n=2, temperature=1.0, max_tokens=12)
    assert gap(teacher, taught) < 1e-4 < gap(policy, taught)         # the teacher sampled these
    engine.load_weights(gather_full_weights(policy))
    after = engine.generate(prompts, n=2, temperature=1.0, max_tokens=12, seeds=seeds)
    assert gap(policy, after) < 1e-4 < gap(teacher, after)           # and the policy is back
    engine.close()


def test_certainty_rewards_by_hand():
    # two response positions over a vocabulary of 2
    logp = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    # KL(U || p) = -log 2 - (log p1 + log p2) / 2: 0 for uniform; -log2 - (log .9 + log .1)/2 = 0.51083
    sc = self_certainty(logp)
    assert torch.allclose(sc, torch.tensor([0.0, 0.5108256]), atol=1e-6)
    # -entropy: -log 2 = -0.693147; -0.325083
    ent = negative_entropy(logp)
    assert torch.allclose(ent, torch.tensor([-0.6931472, -0.3250830]), atol=1e-6)
    assert METHODS["self_certainty"].reward is self_certainty and METHODS["entropy"].reward is negative_entropy


def test_teacher_labels():
    answers = [["1", "1"], ["2", "2"], ["3", "3"], ["4", "4"]]          # the student's answers
    teacher = [["5", "5", "6"], ["7", "8", "8"], ["9", "9", "9"], [None, "0", "0"]]
    assert labels_for("coreward2", answers, ["?"] * 4, teacher) == ["5", "8", "9", "0"]
    # coreward2_rephrased: the teacher answered each group's rephrasing: its vote labels that group
    assert labels_for("coreward2_rephrased", answers, ["?"] * 4, teacher) == ["5", "8", "9", "0"]
    # coreward3: each view labelled by the teacher's vote on the other view
    assert labels_for("coreward3", answers, ["?"] * 4, teacher) == ["9", "0", "5", "8"]
    with pytest.raises(ValueError, match="needs the teacher's answers"):
        labels_for("coreward2", answers, ["?"] * 4)
    with pytest.raises(ValueError, match="has no labels"):
        labels_for("entropy", answers, ["?"] * 4)
