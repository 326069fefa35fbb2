"""Rollouts: sample G responses per prompt, and keep the sampler's weights equal to the trainer's.

Two engines behind the same two calls:

    engine.generate(prompt_ids, n, temperature, max_tokens, seeds=None) -> [[Sample] * n] * len(prompt_ids)
    engine.load_weights(named_tensors)                       # the trainer's current weights

SEEDS. Every sampled request carries its own seed, and response i of a request samples from a
random stream seeded with seed + i (vLLM seeds a request's n children so; the transformers engine
keeps a generator per row and does the same). Nothing is drawn from an engine's own random state,
so what a request samples depends on its seed alone: not on what the engine sampled since it
started, nor on what else is in the batch, nor on the rank that asks. A run resumed from a
checkpoint, with a fresh engine, therefore samples exactly what the uninterrupted run would have,
and a question gets the same responses at 1 rank and at 8. `generate` refuses a sampled
(temperature > 0) request without a seed; greedy requests need none.

`request_seed` derives a request's seed from who asks for what: the run's seed, the role (the
policy's or the teacher's rollout, an evaluation; rephrase.py's own two), the step, the question's index in its
dataset and the view (0: the original question, 1: its rephrasing), through a stable hash
(blake2b; Python's `hash()` is salted per process). The rank is not part of it. Seeds are
multiples of 2**16, so the n ≤ 2**16 children of two requests never share a stream. Evaluations
pass step 0 whatever the step (eval.eval_counts): each evaluation samples a question from the
same streams, so that evaluations differ by the model alone, and eval.py reproduces any of them.

- `VLLMEngine`: vLLM in this process (no engine subprocess), one engine per rank. Its
  log-probs are the sampler's, after temperature (`logprobs_mode="processed_logprobs"`), so
  they are comparable to the trainer's log-probs of logits / temperature. Weights are synced
  with vLLM's `reload_weights`, which takes an iterator of (Hugging Face name, tensor).
- `HFEngine`: transformers' `generate` on its own copy of the model, for machines without
  vLLM (and on GPUs where vLLM is not installed). Slower, same results up to sampling noise.

Both sample with plain temperature: no top-k, no top-p, no generation config from the model
folder, so that the log-probs are those of the distribution the trainer optimises.
"""
import hashlib
import logging
import os
from dataclasses import dataclass

import torch

# The vLLM engine runs in this process, not in a subprocess of its own.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM logs INFO lines at every weight load (about 140 in a default run), which break the progress bar:
# warnings and errors only, unless the user chose a level. Read when vLLM is imported, so set it first.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class RotaryIsNotAWeight(logging.Filter):
    """vLLM's in-place reload warns at every load that the rotary embedding "failed to load weights":
    its cos/sin table is computed from the config, never loaded, and vLLM puts it back unchanged.
    The per-step sampler-gap check is what guards the sync."""
    def filter(self, record):
        return not (record.getMessage() == "RotaryEmbedding: Failed to load weights")


@dataclass
class Sample:
    prompt_ids: list      # the prompt's token ids
    token_ids: list       # the response's token ids, ending with EOS when `finished`
    logprobs: list        # the sampler's log-prob of each response token, at the sampling temperature
    text: str             # the response decoded, without special tokens
    finished: bool        # False when it was cut at max_tokens


ROLES = ("policy", "teacher", "eval", "rephrase", "answer_check")
SEED_STRIDE = 2**16         # at most this many responses per request: a request's streams are seed .. seed + n - 1


def request_seed(run_seed, role, step, index, view=0):
    """The seed of one request (see SEEDS): a multiple of SEED_STRIDE below 2**62."""
    if role not in ROLES:
        raise ValueError(f"unknown request role {role!r}; one of {ROLES}")
    key = f"{run_seed}/{role}/{step}/{index}/{view}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % 2**46 * SEED_STRIDE


def check_request(prompt_ids, n, temperature, seeds, max_prompt_len):
    """Refuse a request the engines cannot sample reproducibly, or at all."""
    if temperature > 0 and seeds is None:
        raise ValueError("a sampled request (temperature > 0) needs seeds=[one per prompt] (rollout.request_seed): "
                         "without them its responses would depend on the engine's random state")
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts; give one per prompt")
    if n > SEED_STRIDE:
        raise ValueError(f"n={n} responses per prompt; at most {SEED_STRIDE} (rollout.SEED_STRIDE)")
    check_prompt_lengths(prompt_ids, max_prompt_len)


def check_prompt_lengths(prompt_ids, max_prompt_len):
    too_long = [i for i, p in enumerate(prompt_ids) if len(p) > max_prompt_len]
    if too_long:
        raise ValueError(f"{len(too_long)} prompt(s) exceed the prompt limit of {max_prompt_len} tokens "
                         f"(first: #{too_long[0]}, {len(prompt_ids[too_long[0]])} tokens); drop them when "
                         f"loading the data or raise --max_prompt_len")


class VLLMEngine:
    def __init__(self, model_dir, max_prompt_len, max_response_len, dtype="float32", gpu_memory_utilization=0.3,
                 cpu_kv_cache_gib=1.0):
        from vllm import LLM
        from vllm.config import SchedulerConfig
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(RotaryIsNotAWeight())
        self.max_prompt_len = max_prompt_len
        self.dtype = getattr(torch, dtype)            # the weights load_weights expects
        on_cpu = not torch.cuda.is_available()
        max_model_len = max_prompt_len + max_response_len
        # the KV cache: a fraction of the GPU, or on a CPU a fixed size (VLLM_CPU_KVCACHE_SPACE overrides it).
        # On a CPU, no chunked prefill: after a prompt split over scheduler steps vLLM rewinds the request's
        # random generator, which a CPU generator cannot do, so seeded requests (the evaluation) would fail.
        budget = max(max_model_len,
                     SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)  # tokens a step; a whole prompt fits
        device = dict(kv_cache_memory_bytes=int(cpu_kv_cache_gib * 2**30), enable_chunked_prefill=False,
                      max_num_batched_tokens=budget) if on_cpu else dict(gpu_memory_utilization=gpu_memory_utilization)
        # seed=0: vLLM seeds the global random state with it; every sampled request brings its own seed
        self.llm = LLM(model=model_dir, dtype=dtype, seed=0, max_model_len=max_model_len,
                       enforce_eager=on_cpu, generation_config="vllm",
                       logprobs_mode="processed_logprobs", **device)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        check_request(prompt_ids, n, temperature, seeds, self.max_prompt_len)
        seeds = [None] * len(prompt_ids) if seeds is None else seeds
        params = [SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=-1 if temperature > 0 else 1,
                                 max_tokens=max_tokens, logprobs=0, skip_special_tokens=True,
                                 seed=seed) for seed in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        groups = []
        for p, out in zip(prompt_ids, outs):
            group = []
            for o in sorted(out.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                lps = [d[t].logprob for d, t in zip(o.logprobs, ids)]
                group.append(Sample(list(p), ids, lps, o.text, o.finish_reason == "stop"))
            groups.append(group)
        return groups

    def load_weights(self, named_tensors):
        """named_tensors: (Hugging Face name, tensor in self.dtype), consumed one at a time (in this process,
        so a generator that gathers each tensor when asked streams the model through)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        self.llm.reset_prefix_cache()   # cached KV blocks were computed with the old weights

    def close(self):
        """Shut the engine down now, while the process group it shares is still alive."""
        self.llm.llm_engine.engine_core.shutdown()


class HFEngine:
    def __init__(self, model_dir, max_prompt_len, max_response_len, dtype="float32", device=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.max_prompt_len = max_prompt_len
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = (AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
                      .to(self.device).eval())
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        check_request(prompt_ids, n, temperature, seeds, self.max_prompt_len)
        # one random stream per response row, as vLLM's children: seed + i
        streams = None if temperature == 0 else [torch.Generator(self.device).manual_seed(seed + i)
                                                 for seed in seeds for i in range(n)]
        width = max(map(len, prompt_ids))
        # left-padded prompts, each repeated n times: [P * n, width]
        rows = [[self.pad] * (width - len(p)) + list(p) for p in prompt_ids for _ in range(n)]
        ids = torch.tensor(rows, device=self.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids for _ in range(n)],
                            device=self.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        out_ids, out_lps = [], []
        past = None
        position = attn.cumsum(-1) - 1
        step_ids, step_pos = ids, position.clamp(min=0)
        for _ in range(max_tokens):
            res = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                             past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1].float()                                  # [P*n, V]
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, -1)
                probs = logp.exp()
                token = torch.cat([torch.multinomial(probs[j], 1, generator=g) for j, g in enumerate(streams)])
            else:
                logp = torch.log_softmax(logits, -1)
                token = logits.argmax(-1)
            token = torch.where(done, torch.full_like(token, self.pad), token)
            out_ids.append(token); out_lps.append(logp.gather(-1, token[:, None]).squeeze(-1))
            done = done | (token == self.eos)
            if done.all():
                break
            step_ids = token[:, None]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)
            step_pos = step_pos[:, -1:] + 1
        out_ids = torch.stack(out_ids, 1).tolist(); out_lps = torch.stack(out_lps, 1).tolist()
        groups = []
        for i, p in enumerate(prompt_ids):
            group = []
            for j in range(i * n, (i + 1) * n):
                ids_j = out_ids[j]
                end = ids_j.index(self.eos) + 1 if self.eos in ids_j else len(ids_j)
                text = self.tokenizer.decode(ids_j[:end], skip_special_tokens=True)
                group.append(Sample(list(p), ids_j[:end], out_lps[j][:end], text, self.eos in ids_j))
            groups.append(group)
        return groups

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """Copies each (name, tensor) into place as it comes; a tied parameter may come under either name."""
        params, loaded, unexpected = dict(self.model.named_parameters(remove_duplicate=False)), set(), []
        for name, tensor in named_tensors:
            if name in params:
                params[name].copy_(tensor)
                loaded.add(id(params[name]))
            else:
                unexpected.append(name)
        missing = [name for name, p in params.items() if id(p) not in loaded]
        if missing or unexpected:
            raise RuntimeError(f"weight sync into the transformers engine failed: missing {missing[:5]}, "
                               f"unexpected {unexpected[:5]}; the trainer's and the engine's models differ")

    def close(self):
        pass


def make_engine(backend, model_dir, max_prompt_len, max_response_len, dtype="float32", cpu_kv_cache_gib=1.0,
                gpu_memory_utilization=0.3):
    """The one switch point between rollout backends."""
    if backend == "vllm":
        return VLLMEngine(model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization, cpu_kv_cache_gib)
    if backend == "hf":
        return HFEngine(model_dir, max_prompt_len, max_response_len, dtype)
    raise ValueError(f"unknown rollout backend {backend!r}; choose 'vllm' or 'hf'")
