"""Rollouts: sample G responses per prompt, and keep the sampler's weights equal to the trainer's.

Two engines behind the same two calls:

    engine.generate(prompt_ids, n, temperature, max_tokens, seeds=None) -> [[Sample] * n] * len(prompt_ids)
    engine.load_weights(named_tensors)                       # the trainer's current weights

SEEDS. Every sampled request carries its own seed, and its response i samples from a stream seeded with seed + i
(vLLM seeds a request's n children so; HFEngine keeps a generator per row). Nothing draws from an engine's own random
state, so a request's responses depend on its seed alone: not on what the engine sampled before, the batch, or the
rank. A resumed run, with a fresh engine, samples what the uninterrupted run would have, and a question gets the same
responses at 1 rank and at 8: exactly on a CPU, on a GPU up to the kernels' arithmetic, which depends on the batch.
`generate` refuses a sampled (temperature > 0) request without a seed.

`request_seed` hashes (blake2b; Python's `hash()` is salted per process) the run's seed, the role (ROLES), the step,
the question's index and the view (0: original, 1: rephrased), not the rank, to a multiple of SEED_STRIDE, so that
two requests' children never share a stream. Evaluations pass step 0 (eval.eval_counts): they differ by the model
alone, and eval.py reproduces any of them.

- `VLLMEngine`: vLLM in this process, one engine per rank on its device (`engine_arguments`). Its log-probs are the
  sampler's after temperature (`logprobs_mode="processed_logprobs"`), as the trainer's of logits / temperature. Each
  weight load (vLLM's `reload_weights`) is checked bit for bit (harness/weightcheck.py). On a GPU it sleeps while the
  trainer trains. It samples token ids only; `response_texts` decodes them.
- `HFEngine`: transformers' model, a token at a time, for machines without vLLM: slower, the same results up to
  sampling noise; a request goes through in chunks that fit a KV budget (`HFEngine.generate`).

Both sample with plain temperature (no top-k, top-p or generation-config defaults): the log-probs are those of the
distribution the trainer optimises. A response ends at any of `end_tokens` (for Qwen3 base models `<|im_end|>` and
`<|endoftext|>`); the end token is its last token and is trained on, as in the official code's response mask.
"""
import hashlib
import logging
import os
from dataclasses import dataclass

import torch

from config import PRESETS
from harness.sharding import init_distributed
from harness.weightcheck import WeightCheck

CLASSROOM = PRESETS["classroom"]     # the engines' settings unless given (train.py gives every one)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM's INFO lines at every weight load break the progress bar. Read at vLLM's import, so set first.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# vLLM's messages that ask nothing of this project's users, hidden (`quiet_vllm`), each with why.
QUIET_VLLM = {
    "Triton is installed, but doesn't include CPU backend": "the CPU engine runs without Triton",
    "Triton is not installed. triton-cpu is expected": "the same",
    "Model Runner V2 requires Triton": "the same: the V1 runner is vLLM's CPU runner",
    "The global random seed is set to": "no request draws from the global random state: each has its own seed",
    "does not officially support disabling chunked prefill": "no chunked prefill on a CPU, on purpose "
                                                             "(engine_arguments)",
    "Enforce eager set": "eager execution on a CPU, on purpose (engine_arguments)",
    "Inductor compilation was disabled": "the same",
    "Reset SSM cache type": "these models have no SSM layers",
    "is not found in LD_PRELOAD": "advice on preloaded allocators for speed, not a fault",
    "doesn't allow to use `torch.set_num_threads`": "vLLM's CPU worker binds the threads when it starts and turns "
                                                    "later torch.set_num_threads calls into this warning",
    "Unknown vLLM environment variable detected: VLLM_DIST_IDENT": "vLLM's CPU worker sets it; a process started "
                                                                   "from one (a test's train.py) inherits it",
    "RotaryEmbedding: Failed to load weights": "at every load: the rotary table is computed from the config, "
                                               "never loaded, and vLLM puts it back unchanged",
}


def quiet_vllm():
    """Hide QUIET_VLLM's warnings by making each a DEBUG record as it is created (a log record factory: vLLM replaces
    its handlers and their filters when an engine starts); VLLM_LOGGING_LEVEL=DEBUG shows them. Also hides the
    FutureWarning of a deprecated torch name at vLLM's import."""
    import warnings
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
    previous = logging.getLogRecordFactory()
    if getattr(previous, "quiets_vllm", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if record.name.startswith("vllm") and record.levelno == logging.WARNING and \
                any(quiet in record.getMessage() for quiet in QUIET_VLLM):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return record
    factory.quiets_vllm = True
    logging.setLogRecordFactory(factory)


@dataclass
class Sample:
    prompt_ids: list      # the prompt's token ids
    token_ids: list       # the response's token ids, ending with an end token (`end_tokens`) when `finished`
    logprobs: list        # the sampler's log-prob of each response token, at the sampling temperature
    text: str             # the response decoded, without special tokens
    finished: bool        # False when it was cut at max_tokens


ROLES = ("policy", "teacher", "eval", "rephrase", "answer_check", "reward")
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


# vLLM's batch limits on a GPU: one rank's largest request (a two-view step's 2 x 16 x 8 sequences at 8 ranks), and
# prefill chunks that leave the KV cache its memory (bench/memory.md, the memory account). A CPU keeps vLLM's defaults.
GPU_MAX_NUM_SEQS = 256
GPU_MAX_NUM_BATCHED_TOKENS = 8192


def engine_arguments(model_dir, max_prompt_len, max_response_len, dtype, on_gpu,
                     gpu_memory_utilization=CLASSROOM["gpu_memory_utilization"],
                     cpu_kv_cache_gib=CLASSROOM["cpu_kv_cache_gib"]):
    """The arguments of vLLM's `LLM`, the one place where the CPU and the GPU engine differ. Both join the trainer's
    process group as vLLM's external launcher. A GPU engine takes `gpu_memory_utilization` of the device while it
    samples, and sleeps while the trainer trains. A CPU engine has a fixed KV cache (VLLM_CPU_KVCACHE_SPACE overrides
    it), no sleep mode and no chunked prefill: vLLM rewinds a split prompt's random generator, which a CPU's cannot."""
    from vllm.config import SchedulerConfig
    max_model_len = max_prompt_len + max_response_len
    common = dict(model=model_dir, dtype=dtype, seed=0, max_model_len=max_model_len, generation_config="vllm",
                  logprobs_mode="processed_logprobs", distributed_executor_backend="external_launcher",
                  use_tqdm_on_load=False)
    if on_gpu:
        return {**common, "gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": True,
                "max_num_seqs": GPU_MAX_NUM_SEQS,
                "max_num_batched_tokens": max(GPU_MAX_NUM_BATCHED_TOKENS, max_prompt_len)}
    budget = max(max_model_len, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)   # tokens a step; a whole prompt fits
    return {**common, "enforce_eager": True, "kv_cache_memory_bytes": int(cpu_kv_cache_gib * 2**30),
            "enable_chunked_prefill": False, "max_num_batched_tokens": budget}


class VLLMEngine:
    def __init__(self, model_dir, max_prompt_len, max_response_len, dtype=CLASSROOM["dtype"],
                 gpu_memory_utilization=CLASSROOM["gpu_memory_utilization"], cpu_kv_cache_gib=CLASSROOM["cpu_kv_cache_gib"]):
        quiet_vllm()
        from vllm import LLM
        self.max_prompt_len = max_prompt_len
        self.dtype = getattr(torch, dtype)            # the weights load_weights expects
        rank, _, device = init_distributed()          # a world of one, unless torchrun started several ranks
        os.environ["RANK"] = str(rank)
        os.environ["LOCAL_RANK"] = str(device.index if device.type == "cuda" else os.environ.get("LOCAL_RANK", 0))
        self.llm = LLM(**engine_arguments(model_dir, max_prompt_len, max_response_len, dtype, device.type == "cuda",
                                          gpu_memory_utilization, cpu_kv_cache_gib))
        self.sleeps = self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode      # on a GPU
        self.asleep = False
        self.check = WeightCheck(self.llm, model_dir, self.dtype)        # what each load reads back
        self.tokenizer = self.llm.get_tokenizer()
        self.ends = end_tokens(model_dir, self.tokenizer)

    def weight_check_report(self):
        """One line: what each weight load reads back on this device (weightcheck.Readback.report)."""
        return self.check.readback.report()

    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        check_request(prompt_ids, n, temperature, seeds, self.max_prompt_len)
        seeds = [None] * len(prompt_ids) if seeds is None else seeds
        params = [SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=-1 if temperature > 0 else 1,
                                 max_tokens=max_tokens, logprobs=0, detokenize=False, stop_token_ids=self.ends,
                                 seed=seed) for seed in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        outputs = [sorted(out.outputs, key=lambda o: o.index) for out in outs]
        texts = iter(response_texts(self.tokenizer, [o.token_ids for group in outputs for o in group]))
        return [[Sample(list(p), list(o.token_ids), [d[t].logprob for d, t in zip(o.logprobs, o.token_ids)],
                        next(texts), o.finish_reason == "stop") for o in group]
                for p, group in zip(prompt_ids, outputs)]

    def sleep(self):
        """Free the engine's GPU memory (weights and KV cache) for the training phase; on a CPU, nothing."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)           # the weights are reloaded before the next rollout anyway
            self.asleep = True

    def load_weights(self, named_tensors):
        """named_tensors: (Hugging Face name, tensor in self.dtype), consumed one at a time (a generator that gathers
        each tensor when asked streams the model through), then checked (harness/weightcheck.py). A sleeping engine
        wakes its weights first, its KV cache after the load, as TRL does. Returns None, or what is wrong, in words."""
        was_asleep, self.asleep = self.asleep, False
        if was_asleep:
            torch.cuda.empty_cache()          # the trainer's cached free blocks back to the device, for vLLM
            self.llm.wake_up(tags=["weights"])
        sent = self.check.sending()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sent.watch(named_tensors)})
        if was_asleep:
            self.llm.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()   # cached KV blocks were computed with the old weights
        return self.check.after_load(sent)

    def close(self):
        """Shut the engine down; this also ends the process group it shares, so close it last (train.py)."""
        self.llm.llm_engine.engine_core.shutdown()


def response_texts(tokenizer, token_ids):
    """Token ids decoded in one call, as vLLM's detokenizer (off while VLLMEngine samples: `detokenize=False`) would."""
    return tokenizer.batch_decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def end_tokens(model_dir, tokenizer):
    """The tokens that end a response, as vLLM's default: the tokenizer's EOS and generation_config's eos_token_id."""
    import json
    ends = {tokenizer.eos_token_id}
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        eos = json.load(open(path)).get("eos_token_id")
        ends |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(e for e in ends if e is not None)


# HFEngine.kv_budget's defaults (--hf_kv_budget_gib 0); a CPU's is fixed, so that a CPU run chunks alike on any machine.
HF_KV_SHARE = 0.8
HF_CPU_KV_BUDGET_GIB = 4.0
# MKL's sgemm sums a row alike in any product of GEMM_ROWS or more rows in one thread, and of a multiple of GEMM_ROWS
# in 1-16 threads (measured: tests/test_rollout.py); so the prompts' forward keeps its last GEMM_ROWS positions' logits.
GEMM_ROWS = 4


def kv_bytes_per_token(config, dtype):
    """K and V of one token in every layer: layers x KV heads x head_dim x 2 x the dtype's bytes."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers * heads * head_dim * 2 * dtype.itemsize


class HFEngine:
    """transformers' model, sampled a token at a time; a request's rows go through in chunks of whole prompts whose
    caches, grown to the longest response, fit kv_budget_gib (0: `kv_budget` derives it when a request starts)."""
    def __init__(self, model_dir, max_prompt_len, max_response_len, dtype=CLASSROOM["dtype"], device=None,
                 kv_budget_gib=CLASSROOM["hf_kv_budget_gib"]):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.max_prompt_len = max_prompt_len
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = (AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
                      .to(self.device).eval())
        self.ends = torch.tensor(end_tokens(model_dir, self.tokenizer), device=self.device)
        eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        self.kv_budget_gib = kv_budget_gib
        self.token_bytes = kv_bytes_per_token(self.model.config, self.dtype)

    def kv_budget(self):
        """Bytes of KV cache a chunk may take: --hf_kv_budget_gib, else HF_KV_SHARE of a GPU's free memory, or
        HF_CPU_KV_BUDGET_GIB on a CPU."""
        if self.kv_budget_gib:
            return self.kv_budget_gib * 2**30
        if torch.device(self.device).type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            return HF_KV_SHARE * (free + cached)
        return HF_CPU_KV_BUDGET_GIB * 2**30

    def prompts_per_chunk(self, n, width, max_tokens):
        """How many prompts' n rows, at `width` prompt tokens and `max_tokens` response tokens each, fit the KV
        budget; a request one prompt of which does not fit is refused."""
        one = n * (width + max_tokens) * self.token_bytes
        budget = self.kv_budget()
        if one > budget:
            raise ValueError(f"one prompt's {n} responses need {one / 2**30:.2f} GiB of KV cache ({n} x {width} + "
                             f"{max_tokens} tokens x {self.token_bytes / 1024:.0f} KiB), over the transformers "
                             f"engine's budget of {budget / 2**30:.2f} GiB: raise --hf_kv_budget_gib if the memory "
                             f"is there, or lower --group_size, --max_prompt_len or --max_response_len")
        return int(budget // one)

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        """The request in chunks of whole prompts that fit the KV budget (`prompts_per_chunk`), each by
        `generate_chunk`. Each row draws from its own stream and every chunk is padded to the longest prompt, so only
        a batch's size differs from the unchunked request's. On a CPU that changes last bits below GEMM_ROWS rows, so
        a chunk keeps riders up to GEMM_ROWS: in one thread a row's tokens and log-probs are the unchunked request's
        bit for bit, until fewer than GEMM_ROWS rows of the whole request still sample. In several threads the kernels
        split a batch by its size: log-probs move in their last bits with the batch, and a nearly flat distribution
        (a random model at the real vocabulary: bench/hf_engine.py) may give another token; on a GPU too. Checked in
        tests/test_rollout.py at one and two CPU threads."""
        check_request(prompt_ids, n, temperature, seeds, self.max_prompt_len)
        width = max(map(len, prompt_ids))
        chunk = self.prompts_per_chunk(n, width, max_tokens)
        groups = []
        for begin in range(0, len(prompt_ids), chunk):
            groups += self.generate_chunk(prompt_ids[begin:begin + chunk], n, temperature, max_tokens,
                                          None if seeds is None else seeds[begin:begin + chunk], width,
                                          floor=GEMM_ROWS if chunk < len(prompt_ids) else 0)
        return groups

    def generate_chunk(self, prompt_ids, n, temperature, max_tokens, seeds, width, floor=0):
        """Every row of these prompts in one batch: each prompt, left-padded to `width`, run once (logits kept for its
        last GEMM_ROWS positions) and its KV cache repeated for its n rows, then decoded a token at a time. Ended rows
        leave the batch with their cache rows, but ride along (tokens cut off after their end) while fewer than `floor`
        rows still sample. A sampled row draws its uniforms from its own stream (seed + i, as vLLM's children) and
        takes its token by the inverse CDF: it depends on its seed, not on the batch (up to last bits: `generate`)."""
        rows = [[self.pad] * (width - len(p)) + list(p) for p in prompt_ids for _ in range(n)]        # [R = P*n]
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids for _ in range(n)],
                            device=self.device)                                                   # [R, width]
        uniforms = None if temperature == 0 else torch.stack([
            torch.rand(max_tokens, generator=torch.Generator(self.device).manual_seed(seed + i), device=self.device,
                       dtype=torch.float64) for seed in seeds for i in range(n)])                # [R, max_tokens]
        out_ids = torch.full((len(rows), max_tokens), self.pad, device=self.device)              # [R, max_tokens]
        out_lps = torch.zeros(len(rows), max_tokens, device=self.device)
        live = torch.arange(len(rows), device=self.device)         # the rows in the batch, in the batch's order
        sampling = torch.ones(len(rows), dtype=torch.bool, device=self.device)    # [batch]: False for a rider
        step_pos = (attn.cumsum(-1) - 1).clamp(min=0)
        res = self.model(input_ids=torch.tensor(rows[::n], device=self.device), attention_mask=attn[::n],
                         position_ids=step_pos[::n], use_cache=True, logits_to_keep=GEMM_ROWS)
        past, logits = res.past_key_values, res.logits[:, -1].float().repeat_interleave(n, 0)         # [R, V]
        past.batch_repeat_interleave(n)
        for t in range(max_tokens):
            if t > 0:
                res = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, past_key_values=past,
                                 use_cache=True)
                past, logits = res.past_key_values, res.logits[:, -1].float()                      # [live, V]
            logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, -1)
            if temperature > 0:
                cdf = logp.double().exp().cumsum(-1)                                             # [live, V]
                u = uniforms[live, t, None] * cdf[:, -1:]
                token = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
            else:
                token = logits.argmax(-1)
            out_ids[live, t], out_lps[live, t] = token, logp.gather(-1, token[:, None]).squeeze(-1)   # a rider's
            sampling &= ~torch.isin(token, self.ends)                   # are after its end token: cut off below
            if not sampling.any():
                break
            keep = sampling.clone()                      # ended rows leave, but for riders up to `floor` rows
            riders = min(floor, len(keep)) - int(sampling.sum())
            if riders > 0:
                keep[(~sampling).nonzero().squeeze(-1)[:riders]] = True
            if not keep.all():
                staying = keep.nonzero().squeeze(-1)
                live, token, attn, step_pos = live[staying], token[staying], attn[staying], step_pos[staying]
                sampling = sampling[staying]
                past.batch_select_indices(staying)
            step_ids = token[:, None]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)
            step_pos = step_pos[:, -1:] + 1
        out_ids, out_lps = out_ids[:, :t + 1].tolist(), out_lps[:, :t + 1].tolist()
        ends = set(self.ends.tolist())
        ended = [next((k + 1 for k, tok in enumerate(ids_j) if tok in ends), None) for ids_j in out_ids]   # [R]
        kept = [ids_j[:end] for ids_j, end in zip(out_ids, ended)]                # up to the end token, if any
        texts = response_texts(self.tokenizer, kept)
        return [[Sample(list(p), kept[j], out_lps[j][:len(kept[j])], texts[j], ended[j] is not None)
                 for j in range(i * n, (i + 1) * n)] for i, p in enumerate(prompt_ids)]

    def weight_check_report(self):
        """One line: what each weight load checks (the engine's parameters are the tensors copied in)."""
        return (f"weight check: each of the engine's {len(dict(self.model.named_parameters()))} parameters is "
                f"copied in place from the trainer's tensor of its name, and every load must send each")

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """Copies each (name, tensor) into place as it comes; a tied parameter may come under either name.
        Returns None, or what is wrong, in words (as VLLMEngine.load_weights)."""
        params, loaded, unexpected = dict(self.model.named_parameters(remove_duplicate=False)), set(), []
        for name, tensor in named_tensors:
            if name in params:
                params[name].copy_(tensor)
                loaded.add(id(params[name]))
            else:
                unexpected.append(name)
        missing = [name for name, p in params.items() if id(p) not in loaded]
        problems = [f"{len(missing)} of the model's {len(params)} tensors were not sent ({missing[:3]})"] * \
            bool(missing)
        problems += [f"{len(unexpected)} tensors the engine does not have were sent ({unexpected[:3]})"] * \
            bool(unexpected)
        return "; ".join(problems) or None

    def sleep(self):
        pass

    def close(self):
        pass


def make_engine(backend, model_dir, max_prompt_len, max_response_len, dtype=CLASSROOM["dtype"],
                cpu_kv_cache_gib=CLASSROOM["cpu_kv_cache_gib"], gpu_memory_utilization=CLASSROOM["gpu_memory_utilization"],
                hf_kv_budget_gib=CLASSROOM["hf_kv_budget_gib"]):
    """The one switch point between rollout backends."""
    if backend == "vllm":
        return VLLMEngine(model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization, cpu_kv_cache_gib)
    if backend == "hf":
        return HFEngine(model_dir, max_prompt_len, max_response_len, dtype, kv_budget_gib=hf_kv_budget_gib)
    raise ValueError(f"unknown rollout backend {backend!r}; choose 'vllm' or 'hf'")
