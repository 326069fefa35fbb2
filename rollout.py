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
two requests' children never share a stream; evaluations pass step 0 (eval.eval_counts).

- `VLLMEngine`: vLLM in this process, one engine per rank on its device. Its log-probs are the sampler's after
  temperature (`logprobs_mode="processed_logprobs"`), as the trainer's of logits / temperature. Each weight load (vLLM's
  `reload_weights`) is checked bit for bit (harness/weightcheck.py). On a GPU it sleeps while the trainer trains.
- `HFEngine`: transformers' model, a token at a time, for machines without vLLM: slower, the same results up to
  sampling noise; a request goes through in chunks that fit a KV budget (harness/hf_batches.py).

Both sample with plain temperature (no top-k, top-p or generation-config defaults): the log-probs are those of the
distribution the trainer optimises. A response ends at any of `end_tokens` (for Qwen3 base models `<|im_end|>` and
`<|endoftext|>`); the end token is its last token and is trained on, as in the official code's response mask.
"""
import hashlib
import operator
import os
from dataclasses import dataclass

import torch

from harness import hf_batches, vllm_setup     # vllm_setup sets vLLM's environment: before vLLM's import
from harness.weightcheck import WeightCheck


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
    if too_long := [i for i, p in enumerate(prompt_ids) if len(p) > max_prompt_len]:
        raise ValueError(f"{len(too_long)} prompt(s) exceed the prompt limit of {max_prompt_len} tokens "
                         f"(first: #{too_long[0]}, {len(prompt_ids[too_long[0]])} tokens); drop them when "
                         f"loading the data or raise --max_prompt_len")


class VLLMEngine:
    def __init__(self, model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization, cpu_kv_cache_gib):
        self.max_prompt_len, self.dtype = max_prompt_len, getattr(torch, dtype)  # dtype: what load_weights takes
        self.llm = vllm_setup.start_llm(model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization,
                                        cpu_kv_cache_gib)
        self.sleeps, self.asleep = self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode, False  # on a GPU
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
        params = [SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=-1 if temperature > 0 else 1,
                                 max_tokens=max_tokens, logprobs=0, detokenize=False, stop_token_ids=self.ends,
                                 seed=seed) for seed in seeds or [None] * len(prompt_ids)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        outputs = [sorted(out.outputs, key=operator.attrgetter("index")) for out in outs]
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
    ends, path = {tokenizer.eos_token_id}, os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        eos = json.load(open(path)).get("eos_token_id")
        ends |= set(eos if isinstance(eos, list) else [eos])
    return sorted(e for e in ends if e is not None)


class HFEngine:
    """kv_budget_gib: the KV cache a chunk may take (0: derived per request, hf_batches.kv_budget)."""
    def __init__(self, model_dir, max_prompt_len, dtype, kv_budget_gib, device=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.max_prompt_len, self.kv_budget_gib, self.dtype = max_prompt_len, kv_budget_gib, getattr(torch, dtype)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tok = self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype).to(self.device).eval()
        self.ends = torch.tensor(end_tokens(model_dir, tok), device=self.device)
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.token_bytes = hf_batches.kv_bytes_per_token(self.model.config, self.dtype)

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperature, max_tokens, seeds=None):
        """The request in chunks of whole prompts that fit the KV budget, padded to the longest prompt: a chunk's
        prompts' forward (`prefill`), then its rows a token at a time (`decode`), with riders (hf_batches)."""
        check_request(prompt_ids, n, temperature, seeds, self.max_prompt_len)
        width = max(map(len, prompt_ids))
        chunk = hf_batches.prompts_per_chunk(n, width, max_tokens, self.token_bytes, self.kv_budget_gib, self.device)
        floor, groups = (hf_batches.GEMM_ROWS if chunk < len(prompt_ids) else 0), []
        for begin in range(0, len(prompt_ids), chunk):
            prompts = prompt_ids[begin:begin + chunk]
            uniforms = None if temperature == 0 else torch.stack([    # [R = P*n, max_tokens]: row i from seed + i
                torch.rand(max_tokens, generator=torch.Generator(self.device).manual_seed(seed + i), device=self.device,
                           dtype=torch.float64) for seed in seeds[begin:begin + chunk] for i in range(n)])
            ids, lps = self.decode(*self.prefill(prompts, n, width), uniforms, temperature, max_tokens, floor)
            groups += self.samples(prompts, n, ids, lps)
        return groups

    def prefill(self, prompt_ids, n, width):
        """Each prompt, left-padded to `width`, run once (logits kept for its last GEMM_ROWS positions), its KV cache
        and last logits repeated for its n rows: (the cache, logits [R = P*n, V], mask and positions [R, width])."""
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids for _ in range(n)],
                            device=self.device)                                                   # [R, width]
        pos = (attn.cumsum(-1) - 1).clamp(min=0)                                                  # [R, width]
        ids = torch.tensor([[self.pad] * (width - len(p)) + list(p) for p in prompt_ids],
                           device=self.device)                                                    # [P, width]
        res = self.model(input_ids=ids, attention_mask=attn[::n], position_ids=pos[::n], use_cache=True,
                         logits_to_keep=hf_batches.GEMM_ROWS)
        res.past_key_values.batch_repeat_interleave(n)
        return res.past_key_values, res.logits[:, -1].float().repeat_interleave(n, 0), attn, pos

    def decode(self, past, logits, attn, pos, uniforms, temperature, max_tokens, floor):
        """The rows a token at a time from the prefilled cache: (token ids, log-probs) [R, tokens], lists. A sampled
        row takes its token by the inverse CDF at its own `uniforms`; an ended row leaves the batch with its cache row,
        but rides along (its tokens cut off after its end: `samples`) while fewer than `floor` rows still sample."""
        live = torch.arange(len(logits), device=self.device)        # the rows in the batch, in the batch's order
        out_ids = torch.full((len(live), max_tokens), self.pad, device=self.device)           # [R, max_tokens]
        out_lps = torch.zeros(len(live), max_tokens, device=self.device)
        sampling = torch.ones(len(live), dtype=torch.bool, device=self.device)    # [batch]: False for a rider
        for t in range(max_tokens):
            if t > 0:
                res = self.model(input_ids=token[:, None], attention_mask=attn, position_ids=pos,
                                 past_key_values=past, use_cache=True)
                past, logits = res.past_key_values, res.logits[:, -1].float()                      # [batch, V]
            logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, -1)
            if temperature > 0:
                cdf = logp.double().exp().cumsum(-1)                                             # [batch, V]
                u = uniforms[live, t, None] * cdf[:, -1:]
                token = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
            else:
                token = logits.argmax(-1)
            out_ids[live, t], out_lps[live, t] = token, logp.gather(-1, token[:, None]).squeeze(-1)
            sampling &= ~torch.isin(token, self.ends)
            if not sampling.any():
                break
            if (staying := hf_batches.staying(sampling, floor)) is not None:
                live, token, attn, pos, sampling = (x[staying] for x in (live, token, attn, pos, sampling))
                past.batch_select_indices(staying)
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)                        # [batch, width + t + 1]
            pos = pos[:, -1:] + 1                                                             # [batch, 1]
        return out_ids[:, :t + 1].tolist(), out_lps[:, :t + 1].tolist()

    def samples(self, prompt_ids, n, out_ids, out_lps):
        """The decoded rows as Samples, each cut after its end token, if any: [[Sample] * n] * len(prompt_ids)."""
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
        problems = [f"{len(missing)} of the model's {len(params)} tensors were not sent ({missing[:3]})",
                    f"{len(unexpected)} tensors the engine does not have were sent ({unexpected[:3]})"]
        return "; ".join(line for line, names in zip(problems, (missing, unexpected)) if names) or None

    def sleep(self):
        pass

    def close(self):
        pass


def make_engine(backend, model_dir, max_prompt_len, max_response_len, *, dtype, cpu_kv_cache_gib,
                gpu_memory_utilization, hf_kv_budget_gib):
    """The one switch point between rollout backends."""
    if backend == "vllm":
        return VLLMEngine(model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization, cpu_kv_cache_gib)
    if backend == "hf":
        return HFEngine(model_dir, max_prompt_len, dtype, hf_kv_budget_gib)
    raise ValueError(f"unknown rollout backend {backend!r}; choose 'vllm' or 'hf'")
