"""The rollout engines: after a weight sync, the sampler's log-probs are the trainer's.

Tolerance: 1e-4 per token (float32 on both sides; measured gaps are ~1e-7).
"""
import os

import pytest
import torch
from transformers import AutoTokenizer

from harness import world
from harness.logprobs import token_logprobs
from harness import weightcheck
from config import PRESETS
from rollout import SEED_STRIDE, make_engine, request_seed

TOL = 1e-4
# the classroom's engine settings (train.py passes the run's)
ENGINE = {name: PRESETS["classroom"][name] for name in ("dtype", "cpu_kv_cache_gib", "gpu_memory_utilization",
                                                        "hf_kv_budget_gib")}
BOTH_ENGINES = [pytest.param("vllm", marks=pytest.mark.vllm), "hf"]


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
    logp, _ = token_logprobs(model, ids, torch.ones(1, ids.shape[1] - 1), temperature)
    return logp[0, len(sample.prompt_ids) - 1:]


@pytest.mark.parametrize("backend", BOTH_ENGINES)
def test_sampler_logprobs_match_trainer_after_sync(tiny_model_dir, backend):
    engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=16, **ENGINE)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:3]]
    seeds = [request_seed(0, "policy", 1, i) for i in range(len(prompts))]
    model = _perturbed(tiny_model_dir)
    temperature = 0.7

    before = engine.generate(prompts, n=2, temperature=temperature, max_tokens=16, seeds=seeds)
    gap_before = max((_trainer_logprobs(model, s, temperature) - torch.tensor(s.logprobs)).abs().max().item()
                     for g in before for s in g)
    assert gap_before > 1e-2        # not synced yet: the engine still runs the saved weights

    engine.load_weights(model.state_dict().items())
    after = engine.generate(prompts, n=2, temperature=temperature, max_tokens=16, seeds=seeds)
    for group in after:
        assert len(group) == 2
        for s in group:
            assert len(s.token_ids) == len(s.logprobs) > 0
            trainer = _trainer_logprobs(model, s, temperature)
            assert torch.allclose(trainer, torch.tensor(s.logprobs), atol=TOL), (trainer, s.logprobs)
    engine.close()


def test_requests_the_engines_cannot_serve_are_refused(tiny_model_dir):
    engine = make_engine("hf", tiny_model_dir, max_prompt_len=8, max_response_len=4, **ENGINE)
    with pytest.raises(ValueError, match="exceed the prompt limit of 8 tokens"):
        engine.generate([[1] * 5, [1] * 9], n=1, temperature=1.0, max_tokens=4, seeds=[0, SEED_STRIDE])
    with pytest.raises(ValueError, match=r"a sampled request \(temperature > 0\) needs seeds"):
        engine.generate([[1] * 5], n=2, temperature=1.0, max_tokens=4)
    with pytest.raises(ValueError, match="1 seeds for 2 prompts"):
        engine.generate([[1] * 5, [2] * 5], n=2, temperature=1.0, max_tokens=4, seeds=[0])
    assert len(engine.generate([[1] * 5], n=1, temperature=0.0, max_tokens=4)[0]) == 1     # greedy needs none


def test_request_seeds_are_stable_and_their_streams_never_overlap():
    import subprocess
    import sys
    from conftest import ROOT
    keys = [(run, role, step, index, view) for run in (0, 1) for role in ("policy", "teacher", "eval")
            for step in range(3) for index in range(40) for view in (0, 1)]
    seeds = [request_seed(*k) for k in keys]
    # multiples of the stride, so that the children seed .. seed + n - 1 of two requests never meet
    assert all(s % SEED_STRIDE == 0 and 0 <= s < 2**62 for s in seeds) and len(set(seeds)) == len(keys)
    # the same in another process with another hash salt: a resumed run computes the same seeds
    code = "import rollout; print(rollout.request_seed(7, 'teacher', 12, 345, 1))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert res.stdout.strip() == str(request_seed(7, "teacher", 12, 345, 1)), res.stderr
    with pytest.raises(ValueError, match="unknown request role 'student'"):
        request_seed(0, "student", 1, 2)


def _texts(groups):
    return [[s.text for s in group] for group in groups]


def vllm_own_texts(engine, prompts, n, max_tokens, seeds):
    """The texts vLLM's own detokenizer gives for the engine's request (VLLMEngine samples without it)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    params = [SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0, skip_special_tokens=True,
                             stop_token_ids=engine.ends, seed=seed) for seed in seeds]
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [[o.text for o in sorted(out.outputs, key=lambda o: o.index)] for out in outs]


@pytest.mark.vllm
def test_the_texts_are_those_of_vllms_own_detokenizer(tiny_model_dir):
    """VLLMEngine samples without detokenizing and decodes afterwards (rollout.response_texts), to the
    texts vLLM would have given: a random model's responses put any word, space and punctuation mark
    anywhere."""
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=64, max_response_len=24, **ENGINE)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:8]]
    seeds = [request_seed(2, "policy", 1, i) for i in range(8)]
    ours = engine.generate(prompts, n=4, temperature=1.0, max_tokens=24, seeds=seeds)
    assert _texts(ours) == vllm_own_texts(engine, prompts, 4, 24, seeds)
    texts = [s.text for g in ours for s in g]
    assert len({w for t in texts for w in t.split()}) > 100
    assert any(" ." in t or " ?" in t for t in texts)         # what a decode that cleans up spaces would change
    engine.close()


@pytest.mark.parametrize("backend", BOTH_ENGINES)
def test_a_seeded_prompt_gets_the_same_responses_in_any_batch(tiny_model_dir, backend):
    """Each request samples from streams of its own seed: a share of the prompts, in another order,
    gets what the whole batch got, and so does a fresh engine (what an engine sampled before does
    not matter: a resumed run starts a new one); other seeds get other responses."""
    engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=12, **ENGINE)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:6]]
    seeds = [request_seed(5, "policy", 3, i) for i in range(6)]
    sample = lambda e, idx: _texts(e.generate([prompts[i] for i in idx], n=3, temperature=1.0, max_tokens=12,
                                              seeds=[seeds[i] for i in idx]))
    whole = sample(engine, range(6))
    assert sample(engine, [4, 3, 2]) == whole[4:1:-1]
    assert len({t for g in whole for t in g}) > 6                     # the responses of a group differ
    other = _texts(engine.generate(prompts, n=3, temperature=1.0, max_tokens=12,
                                   seeds=[request_seed(5, "policy", 4, i) for i in range(6)]))
    assert other != whole
    engine.close()
    if backend == "hf":
        engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=12, **ENGINE)
        assert sample(engine, [5, 0]) == [whole[5], whole[0]]


def test_kv_bytes_per_token_by_hand():
    """Qwen3-4B in bf16: 36 layers x 8 KV heads x 128 x (K, V) x 2 bytes; the classroom model in fp32: 4 x 2 x 32 x
    2 x 4."""
    from transformers import Qwen3Config
    from harness.hf_batches import kv_bytes_per_token
    qwen3_4b = Qwen3Config(vocab_size=151_936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    assert kv_bytes_per_token(qwen3_4b, torch.bfloat16) == 147_456
    assert kv_bytes_per_token(world.model_config(1000), torch.float32) == 2048


# MKL's sgemm on a CPU with AMX sums a row of a product otherwise as the product's rows change, in one thread too
# (an Intel Xeon with AMX, 2026-12-06): the premise of hf_batches.GEMM_ROWS, measured without AMX, does not hold there.
AMX = os.path.exists("/proc/cpuinfo") and " amx_tile" in open("/proc/cpuinfo").read()
NOT_ON_AMX = pytest.mark.skipif(AMX, reason="hf_batches.GEMM_ROWS's premise does not hold for MKL's sgemm with AMX")


@NOT_ON_AMX
def test_the_prompts_last_logits_are_those_of_the_whole_forward(tiny_model_dir):
    """HFEngine keeps the logits of the prompts' last GEMM_ROWS positions only: the last one's are, bit for bit,
    those of the forward that computes every position's, whatever the number of prompts. Keeping 1 position, a
    forward of 1-3 prompts sums the output layer otherwise (the premise of GEMM_ROWS: MKL's sgemm)."""
    from transformers import AutoModelForCausalLM
    from harness.hf_batches import GEMM_ROWS
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.randint(1, 1000, (5, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for prompts in range(1, 6):
            whole = model(input_ids=ids[:prompts]).logits[:, -1]
            assert torch.equal(model(input_ids=ids[:prompts], logits_to_keep=GEMM_ROWS).logits[:, -1], whole)
        assert not all(torch.equal(model(input_ids=ids[:p], logits_to_keep=1).logits[:, -1],
                                   model(input_ids=ids[:p]).logits[:, -1]) for p in (1, 2, 3))


@NOT_ON_AMX
@pytest.mark.parametrize("threads", [1, 2])
def test_a_request_in_chunks_samples_what_it_samples_in_one_batch(threads):
    """The classroom's step-1 request (16 prompts x G=8 x 48 tokens) with a KV budget of 1 prompt's rows, then of 3.
    In one thread, every token and log-prob is that of the request in one batch, bit for bit, up to the step where
    fewer than GEMM_ROWS of its 128 rows still sample (if it comes: the one batch computes those in a product of 1-3
    rows, the chunks with riders); the rows that end before it are the same whole. Most responses end early, so
    each chunk's batch shrinks to its riders (HFEngine.decode) long before the whole request's does. In two
    threads, the CPU kernels (MKL's sgemm, the attention) split a batch by its size, and a row's log-probs differ
    in the last bits: the tokens are the same."""
    from harness import data
    from harness.hf_batches import GEMM_ROWS, prompts_per_chunk
    engine = make_engine("hf", world.base_model_dir(), max_prompt_len=64, max_response_len=48, **ENGINE)
    encode = data.prompt_encoder(engine.tokenizer, classroom=True)
    prompts = [encode(pair.original) for pair in data.classroom_pairs("train")[:16]]
    seeds = [request_seed(0, "policy", 1, i) for i in range(16)]
    one_prompt = 8 * (max(map(len, prompts)) + 48) * engine.token_bytes
    flat = lambda groups: [(s.token_ids, s.logprobs, s.text, s.finished) for g in groups for s in g]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = flat(engine.generate(prompts, 8, 1.0, 48, seeds=seeds))
        sampling = [sum(len(ids) > t for ids, *_ in whole) for t in range(48)]       # the rows sampling token t
        tail = next((t for t in range(48) if sampling[t] < GEMM_ROWS), 48)
        assert sampling[24] < 8 * 16 / 4                                             # most have ended by token 24
        for chunk in (1, 3):
            engine.kv_budget_gib = (chunk + 0.5) * one_prompt / 2**30
            assert prompts_per_chunk(8, max(map(len, prompts)), 48, engine.token_bytes, engine.kv_budget_gib,
                                     engine.device) == chunk
            chunked = flat(engine.generate(prompts, 8, 1.0, 48, seeds=seeds))
            assert [(ids, text, finished) for ids, _, text, finished in chunked] == \
                [(ids, text, finished) for ids, _, text, finished in whole]
            if threads == 1:
                assert [lps[:tail] for _, lps, *_ in chunked] == [lps[:tail] for _, lps, *_ in whole], chunk
                assert [c for c, w in zip(chunked, whole) if len(w[0]) <= tail] == \
                    [w for w in whole if len(w[0]) <= tail]
            else:
                assert max(abs(a - b) for c, w in zip(chunked, whole) for a, b in zip(c[1], w[1])) < 1e-5
    finally:
        torch.set_num_threads(before)
    engine.kv_budget_gib = 0.5 * one_prompt / 2**30
    with pytest.raises(ValueError, match=r"one prompt's 8 responses need .* GiB of KV cache .* over the transformers "
                                         r"engine's budget of .* GiB: raise --hf_kv_budget_gib"):
        engine.generate(prompts, 8, 1.0, 48, seeds=seeds)


@pytest.mark.vllm
def test_seeded_prompts_longer_than_one_scheduler_step(tiny_model_dir):
    """16 prompts of 200 tokens overflow vLLM's per-step token budget (2048), so a prompt may be
    split over scheduler steps; seeded sampling must still work (on a CPU, vLLM cannot rewind a
    request's generator after a split prompt, so the engine does not split them) and give each
    prompt the responses it gets alone."""
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=220, max_response_len=8, **ENGINE)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 200, (200,), generator=g).tolist() for _ in range(16)]
    seeds = [request_seed(3, "eval", 0, i) for i in range(16)]
    whole = _texts(engine.generate(prompts, n=2, temperature=1.0, max_tokens=8, seeds=seeds))
    assert _texts(engine.generate(prompts[7:8], n=2, temperature=1.0, max_tokens=8, seeds=seeds[7:8])) == whole[7:8]
    engine.close()


@pytest.mark.vllm
def test_each_rank_has_its_own_engine_on_its_own_device(dist_world, tiny_model_dir, tmp_path):
    """At 2 CPU ranks under torchrun, each rank's vLLM worker runs as that rank (its LOCAL_RANK:
    vLLM's default single-process executor gave every rank local rank 0, so on a GPU every engine
    landed on GPU 0), and each rank samples its own question as one rank would: as this process's
    engine, a rank of one, samples both questions."""
    import json
    import os
    import subprocess
    import sys

    import engine_ranks_worker
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / "engines.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", "29642",
           os.path.join(root, "tests", "engine_ranks_worker.py"), tiny_model_dir, str(path)]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(path.read_text())
    assert [(r["rank"], r["LOCAL_RANK"], r["engine_local_rank"], r["engine_device"]) for r in records] == \
        [(0, 0, 0, "cpu"), (1, 1, 1, "cpu")]
    engine = engine_ranks_worker.engine_for(tiny_model_dir)
    one = engine_ranks_worker.sample(engine, tiny_model_dir, [0, 1])
    engine.close()
    assert [r["responses"][0] for r in records] == one and one[0] != one[1]


@pytest.mark.vllm
def test_a_load_that_misses_a_tensor_or_lands_wrong_is_reported(dist_world, tiny_model_dir):
    """VLLMEngine.load_weights says what is wrong: a tensor of the checkpoint not sent, or a parameter
    whose bits read back from the engine differ from what was sent; a whole, faithful load says nothing."""
    from transformers import AutoModelForCausalLM
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=64, max_response_len=8, **ENGINE)
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert engine.load_weights(state.items()) is None
    dropped = "model.layers.1.self_attn.q_proj.weight"      # fused into qkv_proj by vLLM: no name of its own there
    problem = engine.load_weights((n, t) for n, t in state.items() if n != dropped)
    assert problem.startswith("1 of the model's") and dropped in problem
    # a parameter the engine keeps under its own name, changed in the engine after the load
    check = engine.check
    name = check.checkable[(check.loads * weightcheck.CHECKED_PER_LOAD) % len(check.checkable)]

    def corrupt_after_load(worker, weights_iterator):
        worker.reload_weights(weights_iterator=weights_iterator)
        dict(worker.model_runner.get_model().named_parameters())[name].data.add_(1.0)
    real = engine.llm.collective_rpc
    engine.llm.collective_rpc = lambda method, **kw: real(corrupt_after_load if method == "reload_weights" else method,
                                                          **kw)
    problem = engine.load_weights(state.items())
    assert problem == f"the engine's {[name]} differ from the trainer's after the load"
    engine.llm.collective_rpc = real
    engine.close()


def test_checksum_by_hand():
    """The bits of each element times (its place mod 65521) + 1, summed: a permutation or a flipped bit
    changes it; the same bits in another dtype of that width give the same sum."""
    from harness.weightcheck import checksum
    t = torch.tensor([1.0, 2.0], dtype=torch.float32)       # bits 0x3F800000, 0x40000000
    assert checksum(t) == ((2,), 0x3F800000 * 1 + 0x40000000 * 2)
    assert checksum(t.flip(0)) != checksum(t)
    assert checksum(t, chunk=1) == checksum(t)
    assert checksum(torch.tensor([1.0], dtype=torch.bfloat16)) == ((1,), 0x3F80)


@pytest.mark.parametrize("backend", BOTH_ENGINES)
def test_a_response_ends_at_the_generation_configs_eos_too(tiny_model_dir, tmp_path, backend):
    """Qwen3 base models name one EOS in the tokenizer and another in generation_config.json: a
    response ends at either, as vLLM's default does for the official code. Here the model's first
    greedy token is made an end token of the generation config: the response is that one token."""
    import json
    import shutil
    from rollout import end_tokens
    engine = make_engine(backend, tiny_model_dir, max_prompt_len=64, max_response_len=8, **ENGINE)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok(world.format_prompt(world.make_split("test")[0].original))["input_ids"]
    first = engine.generate([prompt], n=1, temperature=0.0, max_tokens=8)[0][0]
    engine.close()
    assert len(first.token_ids) > 1 and first.token_ids[0] != tok.eos_token_id
    folder = tmp_path / "two_ends"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [0, first.token_ids[0]]}))
    assert end_tokens(str(folder), tok) == sorted({tok.eos_token_id, 0, first.token_ids[0]})
    engine = make_engine(backend, str(folder), max_prompt_len=64, max_response_len=8, **ENGINE)
    ended = engine.generate([prompt], n=1, temperature=0.0, max_tokens=8)[0][0]
    engine.close()
    assert ended.token_ids == first.token_ids[:1] and ended.finished


@pytest.mark.vllm
def test_the_engine_arguments_on_a_cpu_and_on_a_gpu():
    """One function builds vLLM's arguments; they differ in the KV cache's size, sleep mode, eager
    execution, chunked prefill and batch limits, and agree in the rest (the external launcher, the
    sampler's log-probs, no sampling defaults from the model folder)."""
    from harness.vllm_setup import engine_arguments
    common = dict(model="m", dtype="bfloat16", seed=0, max_model_len=512 + 3072, generation_config="vllm",
                  logprobs_mode="processed_logprobs", distributed_executor_backend="external_launcher",
                  use_tqdm_on_load=False)
    assert engine_arguments("m", 512, 3072, "bfloat16", True, 0.75, 2.0) == \
        {**common, "gpu_memory_utilization": 0.75, "enable_sleep_mode": True, "max_num_seqs": 256,
         "max_num_batched_tokens": 8192}
    assert engine_arguments("m", 512, 3072, "bfloat16", False, 0.75, 2.0) == \
        {**common, "enforce_eager": True, "kv_cache_memory_bytes": 2 * 2**30, "enable_chunked_prefill": False,
         "max_num_batched_tokens": 3584}                    # a whole sequence fits: no chunked prefill on a CPU
    assert engine_arguments("m", 64, 48, "float32", False, 0.75, 2.0)["max_num_batched_tokens"] == 2048   # vLLM's
    assert engine_arguments("m", 10000, 48, "float32", True, 0.75, 2.0)["max_num_batched_tokens"] == 10000


def test_a_sleeping_engine_wakes_its_weights_for_the_load_and_its_kv_cache_after():
    """On a GPU (`sleeps`), the engine sleeps at level 2 after the rollouts, once however often asked;
    the next load wakes the weights' memory, loads, then wakes the KV cache, as TRL does; a load into an
    engine that is awake (the teacher's, before the policy's training phase) wakes nothing."""
    import rollout

    class RecordingLLM:
        def __init__(self):
            self.calls = []

        def sleep(self, level):
            self.calls.append(("sleep", level))

        def wake_up(self, tags):
            self.calls.append(("wake_up", tags))

        def collective_rpc(self, method, kwargs):
            if method == "reload_weights":
                self.calls.append(("reload_weights", [name for name, _ in kwargs["weights_iterator"]]))
                return [None]
            return [{name: weightcheck.checksum(torch.ones(2)) for name in kwargs["names"]}]

        def reset_prefix_cache(self):
            self.calls.append(("reset_prefix_cache",))

    engine = object.__new__(rollout.VLLMEngine)
    engine.llm, engine.sleeps, engine.asleep, engine.dtype = RecordingLLM(), True, False, torch.float32
    check = engine.check = object.__new__(weightcheck.WeightCheck)
    check.llm, check.dtype, check.loads = engine.llm, torch.float32, 0
    check.readback = weightcheck.readback_plan({"w": (2,)}, {"w": ((2,), "torch.float32")}, torch.float32, {})
    check.expected, check.checkable = {"w": (2,)}, check.readback.checkable
    engine.sleep()
    engine.sleep()
    assert engine.load_weights([("w", torch.ones(2))]) is None
    assert engine.load_weights([("w", torch.ones(2))]) is None
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ["weights"]), ("reload_weights", ["w"]),
                                ("wake_up", ["kv_cache"]), ("reset_prefix_cache",),
                                ("reload_weights", ["w"]), ("reset_prefix_cache",)]


# The weight check's read-back on a stand-in for vLLM: VLLMEngine itself, over a fake `vllm` module whose LLM
# holds a Qwen3-shaped model under vLLM's parameter names (q, k, v in one qkv_proj, gate and up in one
# gate_up_proj) and loads a checkpoint's tensors into them as vLLM does at tensor parallel 1.

STAND_IN_SHAPES = {"model.embed_tokens.weight": (8, 4), "model.norm.weight": (4,)}
for _layer in range(2):
    STAND_IN_SHAPES.update({f"model.layers.{_layer}.{name}": shape for name, shape in {
        "self_attn.q_proj.weight": (4, 4), "self_attn.k_proj.weight": (2, 4), "self_attn.v_proj.weight": (2, 4),
        "self_attn.o_proj.weight": (4, 4), "self_attn.q_norm.weight": (2,), "self_attn.k_norm.weight": (2,),
        "mlp.gate_proj.weight": (6, 4), "mlp.up_proj.weight": (6, 4), "mlp.down_proj.weight": (4, 6),
        "input_layernorm.weight": (4,), "post_attention_layernorm.weight": (4,)}.items()})
# where vLLM puts a checkpoint tensor of a fused projection: (the fused parameter, its first row there)
STAND_IN_SLICES = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 4), "v_proj": ("qkv_proj", 6),
                   "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 6)}
STAND_IN_N = -(-18 // 4)        # the stand-in engine has 18 parameters; CHECKED_PER_LOAD is 4


def _stand_in_checkpoint(shift=0.0):
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=g) + shift for name, shape in STAND_IN_SHAPES.items()}


def _stand_in_engine(monkeypatch, tmp_path, repacked=(), kernel=None):
    """A VLLMEngine on the stand-in, which starts from the checkpoint _stand_in_checkpoint() saved in tmp_path.
    Its `llm.drops`: checkpoint names it does not load (vLLM only warns of such a weight); `llm.corrupts`:
    parameters it changes after each load; `llm.corrupt_elements`: {parameter: (row, column)}, the one weight
    it changes after each load; `repacked`: parameters it holds as empty tensors, as vLLM's CPU kernels leave
    linear weights after repacking them, and loads nothing into, unless a `kernel` (packed weight, x) -> x W^T
    is given: the layer then keeps the weight in a `packed` tensor of its own, loads into that, and applies
    the kernel to it (its `quant_method.apply`, as vLLM's linear layers)."""
    import os
    import sys
    import types
    from safetensors.torch import load_file, save_file
    import rollout

    class StandInKernel:
        def apply(self, layer, x, bias=None):
            return kernel(layer.packed, x)

    class StandInLLM:
        def __init__(self, model, **arguments):
            state, self.drops, self.corrupts = load_file(os.path.join(model, "model.safetensors")), set(), set()
            self.corrupt_elements = {}
            params, parts = {}, {}
            for name, tensor in state.items():
                module, _, leaf = name.rpartition(".")
                parent, _, part = module.rpartition(".")
                if part in STAND_IN_SLICES:                     # the parts at their rows, whatever the file's order
                    fused, row = STAND_IN_SLICES[part]
                    parts.setdefault(f"{parent}.{fused}.{leaf}", []).append((row, tensor))
                else:
                    params[name] = tensor.clone()
            params.update({fused: torch.cat([t for _, t in sorted(rows, key=lambda r: r[0])])
                           for fused, rows in parts.items()})
            self.model = torch.nn.Module()
            for name, tensor in params.items():
                *path, leaf = name.split(".")
                module = self.model
                for part in path:
                    if part not in module._modules:
                        module.add_module(part, torch.nn.Module())
                    module = module._modules[part]
                module.register_parameter(leaf, torch.nn.Parameter(
                    torch.empty(0) if name in repacked else tensor, requires_grad=False))
                if name in repacked and kernel is not None:
                    module.packed, module.quant_method = tensor, StandInKernel()
            self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(
                model_config=types.SimpleNamespace(enable_sleep_mode=False)))

        def held(self, name):
            """The tensor that holds parameter `name`'s weights: the layer's `packed` one, or the parameter."""
            module, _, leaf = name.rpartition(".")
            module = self.model.get_submodule(module)
            return module.packed if name in repacked and kernel is not None else module.get_parameter(leaf)

        def reload_weights(self, weights_iterator):
            params = dict(self.model.named_parameters())
            for name, tensor in weights_iterator:
                module, _, leaf = name.rpartition(".")
                parent, _, part = module.rpartition(".")
                fused, row = STAND_IN_SLICES.get(part, (part, 0))
                target = f"{parent}.{fused}.{leaf}"
                if name not in self.drops and target not in repacked:
                    params[target].data[row:row + tensor.shape[0]] = tensor
                elif name not in self.drops and kernel is not None:
                    self.held(target).data[row:row + tensor.shape[0]] = tensor
            for name in self.corrupts:
                params[name].data.add_(1.0)
            for name, place in self.corrupt_elements.items():
                self.held(name).data[place] += 1.0

        def collective_rpc(self, method, args=(), kwargs=None):
            if method == "reload_weights":
                return [self.reload_weights(**kwargs)]
            worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: self.model))
            return [method(worker, *args, **(kwargs or {}))]

        def get_tokenizer(self):
            return types.SimpleNamespace(eos_token_id=0)

        def reset_prefix_cache(self):
            pass

    save_file(_stand_in_checkpoint(), str(tmp_path / "model.safetensors"))
    vllm = types.ModuleType("vllm")
    vllm.LLM = StandInLLM
    vllm_config = types.ModuleType("vllm.config")
    vllm_config.SchedulerConfig = types.SimpleNamespace(DEFAULT_MAX_NUM_BATCHED_TOKENS=2048)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.config", vllm_config)
    for variable in ("RANK", "LOCAL_RANK"):                    # VLLMEngine sets them for vLLM's launcher
        monkeypatch.setenv(variable, os.environ.get(variable, "0"))
    return rollout.VLLMEngine(str(tmp_path), 8, 8, ENGINE["dtype"], ENGINE["gpu_memory_utilization"],
                              ENGINE["cpu_kv_cache_gib"])


def test_the_checkpoint_tensors_each_engine_parameter_is_made_of():
    """vLLM fuses a Qwen3 layer's q, k and v projections into qkv_proj and its gate and up projections into
    gate_up_proj, each the concatenation of its parts along the output dimension in that order (at tensor
    parallel 1); every other parameter is the checkpoint's tensor of its name."""
    from harness.weightcheck import checkpoint_sources, composed_shape
    layer = "model.layers.17"
    assert checkpoint_sources(f"{layer}.self_attn.qkv_proj.weight") == (
        [f"{layer}.self_attn.q_proj.weight", f"{layer}.self_attn.k_proj.weight", f"{layer}.self_attn.v_proj.weight"],
        "concatenated")
    assert checkpoint_sources(f"{layer}.mlp.gate_up_proj.weight") == (
        [f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"], "concatenated")
    for plain in ("self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                  "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
        assert checkpoint_sources(f"{layer}.{plain}") == ([f"{layer}.{plain}"], "as is")
    for plain in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert checkpoint_sources(plain) == ([plain], "as is")
    # Qwen3-4B's layer: 32 query heads and 8 key-value heads of 128, width 2560, MLP 9728
    qwen3_4b = {f"{layer}.self_attn.q_proj.weight": (4096, 2560), f"{layer}.self_attn.k_proj.weight": (1024, 2560),
                f"{layer}.self_attn.v_proj.weight": (1024, 2560), f"{layer}.mlp.gate_proj.weight": (9728, 2560),
                f"{layer}.mlp.up_proj.weight": (9728, 2560)}
    assert composed_shape(f"{layer}.self_attn.qkv_proj.weight", qwen3_4b) == (6144, 2560)
    assert composed_shape(f"{layer}.mlp.gate_up_proj.weight", qwen3_4b) == (19456, 2560)
    assert composed_shape("model.layers.0.mlp.gate_up_proj.weight", qwen3_4b) is None     # no such parts


def test_a_fused_parameter_left_unloaded_is_reported(dist_world, monkeypatch, tmp_path):
    """vLLM loads a checkpoint's k_proj into the k rows of qkv_proj, and only warns of a weight it did not
    load: a k_proj or up_proj sent but not loaded leaves its fused parameter unequal to the concatenation
    sent, which the load that reads that parameter back reports, within N loads; a faithful load says nothing."""
    engine = _stand_in_engine(monkeypatch, tmp_path)
    trained = _stand_in_checkpoint(shift=1.0)
    assert [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)] == [None] * STAND_IN_N
    engine.llm.drops = {"model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"}
    trained = _stand_in_checkpoint(shift=2.0)
    reports = [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)]
    assert set(reports) == {
        None, "the engine's ['model.layers.0.mlp.gate_up_proj.weight'] differ from the trainer's after the load",
        "the engine's ['model.layers.1.self_attn.qkv_proj.weight'] differ from the trainer's after the load"}


def test_every_parameter_is_read_back_within_n_loads(dist_world, monkeypatch, tmp_path):
    """CHECKED_PER_LOAD parameters a load, in turn: within the first N = ceil(18 / 4) loads of a fresh
    engine each of the stand-in's 18 parameters, fused or not, is read back, so that one changed in the
    engine after every load is reported within them (and only it)."""
    engine = _stand_in_engine(monkeypatch, tmp_path)
    names = [n for n, _ in engine.llm.model.named_parameters()]
    assert len(names) == 18
    trained = _stand_in_checkpoint(shift=1.0)
    for name in names:
        engine = _stand_in_engine(monkeypatch, tmp_path)
        engine.llm.corrupts = {name}
        reports = [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)]
        wrong = f"the engine's {[name]} differ from the trainer's after the load"
        assert set(reports) == {wrong, None}, (name, reports)
    assert engine.check.readback.loads_to_check_all == STAND_IN_N


def test_parameters_held_in_another_layout_are_named_not_reported(dist_world, monkeypatch, tmp_path):
    """On a CPU vLLM repacks the linear layers' weights for its kernels and leaves an empty tensor in each
    one's place: the engine says at its start which parameters it cannot read back and what share of the
    model's bytes it can, and no load reports the others as wrong."""
    linear = [f"model.layers.{layer}.{name}.weight" for layer in range(2)
              for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]
    engine = _stand_in_engine(monkeypatch, tmp_path, repacked=linear)
    readback = engine.check.readback
    assert sorted(readback.unreadable) == sorted(linear) and len(readback.checkable) == 10
    assert readback.unreadable["model.layers.0.self_attn.qkv_proj.weight"] == \
        "held as (0,) float32, the checkpoint's (8, 4) float32"
    # bytes: 300 floats in all, of which the linear layers hold 2 x 120
    assert (readback.readable_bytes, readback.total_bytes) == (60 * 4, 300 * 4)
    assert readback.report().startswith(
        "weight check: 10 of the engine's 18 parameters (20.0% of the model's bytes) are read back, 4 a load, "
        "each within 3 loads; 8 cannot be read back on this device and are not checked: "
        "model.layers.*.mlp.down_proj.weight x2 (held as (0,) float32, the checkpoint's (4, 6) float32), ")
    trained = _stand_in_checkpoint(shift=1.0)
    assert [engine.load_weights(trained.items()) for _ in range(3)] == [None] * 3


STAND_IN_LINEAR = [f"model.layers.{layer}.{name}.weight" for layer in range(2)
                   for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]


def test_the_columns_read_through_a_kernel_by_hand():
    """A layer's kernel applied to the unit vectors e_j gives the columns W e_j of its weight, whatever the
    kernel holds in the parameter's place; the columns a load reads come in turns of ceil(inputs / loads), the
    last wrapping round, every column within `loads` loads; -0.0 and subnormals compare as 0.0."""
    import types
    from harness.weightcheck import _kernel_columns, comparable, kernel_columns, same_bits
    layer = torch.nn.Module()
    layer.register_parameter("weight", torch.nn.Parameter(torch.empty(0), requires_grad=False))
    layer.packed = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])             # W: 2 outputs x 3 inputs
    layer.quant_method = types.SimpleNamespace(apply=lambda layer, x, bias=None: x @ layer.packed.T)
    model = torch.nn.Module()
    model.add_module("proj", layer)
    model.add_module("norm", torch.nn.LayerNorm(2))
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: model))
    read = _kernel_columns(worker, {"proj.weight": (3, [2, 0]), "norm.weight": (2, [0])}, torch.float32)
    assert torch.equal(read["proj.weight"], torch.tensor([[3.0, 1.0], [6.0, 4.0]])) and read["norm.weight"] is None
    assert [kernel_columns(10, load, 4) for load in range(5)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1],
                                                                  [0, 1, 2]]
    assert kernel_columns(3, 0, 1) == [0, 1, 2] and kernel_columns(2, 3, 5) == [1]
    subnormal = torch.finfo(torch.float32).tiny / 4
    assert comparable(torch.tensor([-0.0, subnormal, -subnormal, 1.0, -2.0])).tolist() == [0.0, 0.0, 0.0, 1.0, -2.0]
    assert comparable(torch.tensor([-0.0])).view(torch.int32).item() == 0                   # +0.0's bits
    assert same_bits(torch.tensor([[0.0, 1.0]]), torch.tensor([[-0.0, 1.0]]))
    assert not same_bits(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 1.0000001]]))
    assert not same_bits(torch.tensor([[1.0]]), None) and not same_bits(torch.tensor([[1.0]]), torch.tensor([1.0]))


def _exact(packed, x):
    return x @ packed.T


def test_repacked_weights_are_read_through_their_kernel_and_one_wrong_weight_is_found(dist_world, monkeypatch,
                                                                                         tmp_path):
    """The stand-in holds its 8 linear weights repacked, behind a kernel: each is read back through it, 1/N of
    its input columns a load, so that a single weight changed in the engine after every load is reported within
    N loads (and only its parameter), and a layer that the loads leave as it was (a frozen o_proj) at the first
    load; faithful loads report nothing."""
    engine = _stand_in_engine(monkeypatch, tmp_path, repacked=STAND_IN_LINEAR, kernel=_exact)
    readback = engine.check.readback
    assert sorted(readback.through_kernel) == sorted(STAND_IN_LINEAR) and readback.unreadable == {}
    assert readback.through_kernel["model.layers.0.mlp.down_proj.weight"] == 6
    assert readback.report() == (
        "weight check: 10 of the engine's 18 parameters (20.0% of the model's bytes) are read back, 4 a load, "
        "each within 3 loads; 8 repacked for this device's kernels are read back through those kernels, 1/3 of "
        "their input columns a load, each whole within 3 loads")
    trained = _stand_in_checkpoint(shift=1.0)
    assert [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)] == [None] * STAND_IN_N
    for name in STAND_IN_LINEAR:
        engine = _stand_in_engine(monkeypatch, tmp_path, repacked=STAND_IN_LINEAR, kernel=_exact)
        engine.llm.corrupt_elements = {name: (1, -1)}                    # row 1, the last input column
        reports = [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)]
        assert set(reports) == {f"the engine's {[name]} differ from the trainer's after the load", None}, reports
    engine = _stand_in_engine(monkeypatch, tmp_path, repacked=STAND_IN_LINEAR, kernel=_exact)
    engine.llm.drops = {f"model.layers.{layer}.self_attn.o_proj.weight" for layer in range(2)}
    assert engine.load_weights(trained.items()) == (
        "the engine's ['model.layers.0.self_attn.o_proj.weight', 'model.layers.1.self_attn.o_proj.weight'] "
        "differ from the trainer's after the load")


def test_a_kernel_that_does_not_give_its_weights_back_is_named_at_the_start(dist_world, monkeypatch, tmp_path):
    """A kernel that rounds its weights (here to bf16) does not give back the start checkpoint's columns: the
    engine says so at its start, with the parameters it cannot check, and no load reports them."""
    engine = _stand_in_engine(monkeypatch, tmp_path, repacked=STAND_IN_LINEAR,
                              kernel=lambda packed, x: (x.bfloat16() @ packed.bfloat16().T).float())
    readback = engine.check.readback
    assert readback.through_kernel == {} and sorted(readback.unreadable) == sorted(STAND_IN_LINEAR)
    assert readback.unreadable["model.layers.0.self_attn.o_proj.weight"] == (
        "held as (0,) float32, the checkpoint's (4, 4) float32, and its kernel does not give back the start "
        "checkpoint's columns")
    assert "; 8 cannot be read back on this device and are not checked: model.layers.*.mlp.down_proj.weight x2 " \
           "(held as (0,) float32, the checkpoint's (4, 6) float32, and its kernel does not give back the start " \
           "checkpoint's columns)" in readback.report()
    trained = _stand_in_checkpoint(shift=1.0)
    assert [engine.load_weights(trained.items()) for _ in range(STAND_IN_N)] == [None] * STAND_IN_N


@pytest.mark.vllm
def test_the_cpu_engine_says_what_it_reads_back(dist_world, tiny_model_dir):
    """vLLM's CPU engine repacks every linear layer's weight (an empty tensor is left in the parameter's place):
    of the classroom-sized model's 34 engine parameters the embedding and the norms are read back as they are,
    16% of its bytes, and the 16 linear weights through their kernel; N whole loads report nothing, and a single
    weight of a linear layer that the kernel runs otherwise than sent is reported within N loads."""
    from transformers import AutoModelForCausalLM
    engine = make_engine("vllm", tiny_model_dir, max_prompt_len=64, max_response_len=8, **ENGINE)
    readback = engine.check.readback
    linear = {f"model.layers.{layer}.{name}.weight" for layer in range(4)
              for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert readback.parameters == 34 and set(readback.through_kernel) == linear and len(readback.checkable) == 18
    assert readback.unreadable == {} and round(readback.readable_bytes / readback.total_bytes, 3) == 0.159
    assert readback.report() == (
        "weight check: 18 of the engine's 34 parameters (15.9% of the model's bytes) are read back, 4 a load, "
        "each within 5 loads; 16 repacked for this device's kernels are read back through those kernels, 1/5 of "
        "their input columns a load, each whole within 5 loads")
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    n = readback.loads_to_check_all
    assert n == 5 and [engine.load_weights(state.items()) for _ in range(n)] == [None] * n
    name = "model.layers.2.mlp.down_proj.weight"

    def one_weight_off(worker, weights_iterator):      # after the load the kernel runs W + E(5, 383): one weight off
        worker.reload_weights(weights_iterator=weights_iterator)
        layer = worker.model_runner.get_model().get_submodule(name.rpartition(".")[0])
        kernel = layer.cpu_linear
        layer.cpu_linear = lambda x, weight, bias: kernel(x, weight, bias) + \
            torch.nn.functional.pad(x[..., 383:], (5, 122))
    real = engine.llm.collective_rpc
    engine.llm.collective_rpc = lambda method, **kw: real(one_weight_off if method == "reload_weights" else method,
                                                          **kw)
    reports = [engine.load_weights(state.items()) for _ in range(n)]
    assert set(reports) == {f"the engine's {[name]} differ from the trainer's after the load", None}, reports
    engine.llm.collective_rpc = real
    engine.close()
