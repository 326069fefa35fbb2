"""The official preset's path at Qwen3-4B-Base's shape on one GPU, phase by phase: the process group,
the model folder, sharded loading, a model checkpoint, training steps, the weight gather and sync, and
transformers' sampling, with random weights (no download, no vLLM). Each phase's seconds and peak
memory, beside bench/scale.py's account.

    python3 bench/gpu_probe.py                      # one H200, within --budget_s (450 s)
    python3 bench/gpu_probe.py --tiny               # the same code at a tiny shape, on a CPU

(`bash bench/gpu_check.sh` runs it after the classroom check, with the budget that is left.)

The model is a Qwen3ForCausalLM from a config with Qwen3-4B-Base's sizes (bench/scale.py's QWEN3_4B:
hidden 2560, 36 layers, 32 query and 8 key-value heads of 128, MLP 9728, vocabulary 151,936, tied
embeddings; 4.02B parameters, 3.63B of them outside the embedding, as the model card's 4.0B and 3.6B),
and, as its config.json has them, rotary base 1e6, RMSNorm eps 1e-6, 32,768 positions (these three
change neither memory nor FLOPs). The phases, in order, each announced by a timestamped line as it
starts and summed up by one as it ends (seconds since the process started, imports included):

1. all-reduce: --allreduce_s seconds of all-reduces of a 256 MiB tensor in the process group that
   `sharding.init_distributed` makes (a world of one: NCCL on a GPU, gloo on a CPU), and their
   bandwidth; at one rank this times NCCL's own copy, not a network.
2. random model, save_pretrained: the model made with random weights in bf16 on the device, then
   written to a temporary folder with the classroom tokenizer (`save_pretrained`, as the hub's bf16
   checkpoint is stored).
3. load the policy, load the reference, the engine: that folder loaded as train.py's `build_models`
   loads it: `sharding.load_sharded` (built on the meta device, sharded, given empty shards, filled
   from rank 0's CPU copy) for the policy (fp32 weights, bf16 compute, activation checkpointing per
   decoder layer) and the reference (bf16), and `rollout.make_engine("hf", ...)` in bf16.
4. step S: train: one `grpo.train_step` (AdamW at the official learning rate and weight decay) on a
   fresh synthetic batch shaped like one rank's share of the official Co-rewarding-I step
   (config.PRESETS["official"]: 128 questions over 8 ranks, G=8, two views): 16 questions x 2 views x
   8 responses = 256 `rollout.Sample`s of random token ids through `grpo.make_batch`, each view's G
   responses sharing their prompt; prompt lengths uniform in [--min_prompt_len, 512], response
   lengths uniform in [--min_response_len, 3,072] (--min_response_len 3072: every response at the
   limit); passes of at most 16,384 padded tokens, one update. Then step S: gather (one pass of
   `sharding.gather_full_weights` in bf16) and step S: sync (`sharding.sync_engine_weights` into the
   engine, checked).
5. sample (after step 1, as a run samples between steps): `engine.generate` (its public call only) on
   --sample_prompts prompts of random ids, their lengths uniform in [--min_prompt_len, 512], x
   --sample_n responses of at most --sample_tokens tokens (32 x 8 x 256); tokens a second, and that
   every log-prob it returns is finite (the probe fails otherwise).
6. checkpoint save, checkpoint load: the policy alone through torch.distributed.checkpoint, as
   checkpoint.py saves and loads the EMA teacher (`get_model_state_dict`, `dcp.save`; `dcp.load`,
   `set_model_state_dict`; its shards resharded first, as `checkpoint.save` does). Between the two
   every weight is zeroed; the loaded weights must equal the saved ones bit for bit (weightcheck.checksum
   of every shard), or the probe fails.
7. the steps after the first (--steps, 3 in all), each as in 4.

Phases 1-3 always run; a step, the sampling and the checkpoint start only if they are expected to
end within --budget_s of the start (the imports counted): a step as long as the last one (the first:
STEP_ESTIMATE_S), the other two by ESTIMATE_S. A phase that does not fit is left out, and named.

Memory: the CUDA allocator's peaks (allocated, reserved) of every phase apart, read and reset at each
phase's end, so that no phase's peak hides another's; within a training step also the reference's
scoring, each forward and backward pass (hooks on the policy's forward and on the optimizer) and
AdamW's step. Beside them, bench/scale.py's account for one rank at the step's largest pass
(`memory_account`: the trainer's tensors; world of one, bf16 compute, bf16 reference,
checkpointing, no vLLM), and the tensors of its training and optimizer-step phases (`gpu_phases`:
low and high estimates, without vLLM, the CUDA runtime and fragmentation, none of which the
allocated figure holds). The engine's bf16 copy of the model stays on the device throughout (the
transformers engine's `sleep` frees nothing), so every peak holds it; its bytes are given apart.
Step 1's passes run before AdamW has made its moments (at its first step), so the account of those
passes is taken without them. The passes' peaks are fitted by least squares to a + b x padded
tokens, b beside the account's bytes a token.

Speed: each step's seconds (`train_step`, device synchronised) and its MFU against the H200's dense
bf16 peak, 989e12 FLOP/s (--peak_flops), and against the ~790e12 FLOP/s of bf16 matrix products
measured on that machine (--measured_flops), with

    FLOPs = T x (6 N  +  2 N x E  +  2 N_layers x C)

T the positions the step's passes compute (rows x padded width, summed over passes: the reference's
scoring passes are the same), N the parameters (the tied embedding once: scale.param_count),
N_layers those of the decoder layers, E the extra forwards (1, the reference's log-probs; 2 with
several mini-batches, which add the old log-probs' pass), C 1 with activation checkpointing (the
backward recomputes each decoder layer's forward) else 0. It is the 6 N T convention: attention's
products over the sequence are left out, and the output layer is counted at every position though
the chunked log-probs run it at response positions only.

The JSON (`$OUT/gpu_probe.json` when OUT is set, else --out, else a temporary folder) is rewritten
after every phase, so that a run stopped from outside keeps what it measured.

--tiny runs everything at a tiny shape (2 layers of width 64, prompts of at most 32 tokens, responses
of 64, passes of 512 tokens, a 1 MiB all-reduce for half a second) in bf16, which a CPU runs too;
there the memory fields are null (no CUDA allocator) and the MFU is still taken against the H200's
peaks (tests/test_gpu_probe.py recomputes it).
"""
import time

START = time.perf_counter()           # the budget and the timestamps count the imports too


def stamp(text):
    print(f"[{time.perf_counter() - START:7.1f} s] {text}", flush=True)


stamp("gpu_probe: importing torch")
import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

stamp("importing the project's modules")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import config  # noqa: E402
import grpo  # noqa: E402
import scale  # noqa: E402   bench/scale.py: the memory account
from harness import sharding  # noqa: E402
from harness.weightcheck import checksum  # noqa: E402
from rollout import Sample, make_engine, request_seed  # noqa: E402

H200_BF16_DENSE = 989e12              # FLOP/s: the H200's dense bf16 tensor-core peak (1,979e12 is with sparsity)
H200_BF16_MEASURED = 790e12           # FLOP/s: bf16 matrix products as measured on the H200 these runs use
OFFICIAL = config.PRESETS["official"]
OFFICIAL_RANKS = 8                    # the official run's GPUs (bench/memory.md's account: 8 x 80 GB)
VIEWS = 2                             # Co-rewarding-I: each question and its rephrasing
STEP_ESTIMATE_S = {"qwen3-4b": 90.0, "tiny": 5.0}       # the first step's seconds, before one has run
ESTIMATE_S = {"qwen3-4b": {"sample": 45.0, "checkpoint": 60.0}, "tiny": {"sample": 5.0, "checkpoint": 5.0}}

# Qwen3-4B-Base's sizes (scale.QWEN3_4B) and the rest of its config.json, which changes no memory or FLOP
QWEN3_4B_BASE = {**scale.QWEN3_4B, "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=256,
            rope_theta=1e6, rms_norm_eps=1e-6)

# (shape, its lengths and batch); the official column of config.PRESET_TABLE for the full shape
SHAPES = {
    "qwen3-4b": dict(model=QWEN3_4B_BASE, max_prompt_len=OFFICIAL["max_prompt_len"], min_prompt_len=64,
                     max_response_len=OFFICIAL["max_response_len"], min_response_len=64,
                     max_tokens_per_micro_batch=OFFICIAL["max_tokens_per_micro_batch"],
                     questions=OFFICIAL["questions_per_step"] // OFFICIAL_RANKS, group_size=OFFICIAL["group_size"],
                     steps=3, sample_prompts=32, sample_n=8, sample_tokens=256, allreduce_s=10.0,
                     allreduce_bytes=256 * 2**20),
    "tiny": dict(model=TINY, max_prompt_len=32, min_prompt_len=8, max_response_len=64, min_response_len=8,
                 max_tokens_per_micro_batch=512, questions=2, group_size=4, steps=2, sample_prompts=4, sample_n=2,
                 sample_tokens=8, allreduce_s=0.5, allreduce_bytes=2**20),
}
COMPUTE_DTYPE = torch.bfloat16
FORMULA = "flops = tokens * (6 * params + 2 * params * extra_forwards + 2 * layer_params * checkpointing)"


def train_flops(tokens, params, layer_params, extra_forwards, checkpointing):
    """The step's FLOPs by the docstring's formula (FORMULA)."""
    return tokens * (6 * params + 2 * params * extra_forwards + 2 * layer_params * int(checkpointing))


def output_path(out_arg, environ=os.environ):
    """Where the JSON goes: $OUT/gpu_probe.json when OUT is set, else --out, else a temporary folder."""
    if environ.get("OUT"):
        return os.path.join(environ["OUT"], "gpu_probe.json")
    if out_arg:
        return out_arg
    return os.path.join(tempfile.mkdtemp(prefix="gpu_probe-"), "gpu_probe.json")


def fits(estimate_s, budget_s):
    """Whether a phase of `estimate_s` seconds started now ends within the budget (seconds from the start)."""
    return time.perf_counter() - START + estimate_s <= budget_s


def step_config():
    """grpo.StepConfig from the official preset (as train.py makes it from a run's settings)."""
    return grpo.StepConfig.of(OFFICIAL)


def phase_tensors(phases, name):
    """(low, high) bytes of a gpu_phases phase without vLLM, the CUDA runtime and fragmentation: the tensors
    the allocator holds."""
    return [sum(v[i] for k, v in phases[name].items() if not k.startswith(("vLLM", "CUDA", "fragmentation")))
            for i in (0, 1)]


def account(model_config, micro_tokens):
    """bench/scale.py's account for one rank at a pass of `micro_tokens` padded tokens: the tensors
    (`memory_account`, by part), and the tensors of gpu_phases' training and optimizer-step phases
    ((low, high), bytes)."""
    tensors = scale.memory_account(model_config, world_size=1, micro_tokens=micro_tokens, compute_bytes=2,
                                   ref_bytes=2, checkpointing=True, defer_grad_sync=False, vllm_share=0,
                                   weight_sync=False)
    phases, _ = scale.gpu_phases(model_config, world_size=1, teacher=False, micro_tokens=micro_tokens)
    return tensors, phase_tensors(phases, "training"), phase_tensors(phases, "optimizer step")


def account_per_token(model_config, tokens=16_384):
    """(low, high) bytes a padded token of a pass adds to the training phase's tensors (gpu_phases)."""
    at = lambda n: phase_tensors(scale.gpu_phases(model_config, world_size=1, micro_tokens=n)[0], "training")
    (a0, a1), (b0, b1) = at(tokens), at(2 * tokens)
    return [(b0 - a0) / tokens, (b1 - a1) / tokens]


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Memory:
    """The CUDA allocator's peaks (allocated, reserved) window by window: `mark` returns the peaks since the
    previous mark and starts the next window. Every figure is None on a CPU (no CUDA allocator)."""
    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.widest = (None, None)
        self.mark()

    def allocated(self):
        return torch.cuda.memory_allocated() if self.cuda else None

    def mark(self):
        if not self.cuda:
            return None, None
        peaks = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        self.widest = tuple(p if w is None else max(w, p) for w, p in zip(self.widest, peaks))
        return peaks

    def open_phase(self):
        self.mark()
        self.widest = (0, 0) if self.cuda else (None, None)

    def close_phase(self):
        self.mark()
        return self.widest


class StepWindows:
    """Within a train_step: the peak of the reference's scoring, of each forward and backward pass (a window
    opens at each forward of the policy) and of AdamW's step, from hooks on the policy and the optimizer;
    live only between `start` and `finish`."""
    def __init__(self, memory, policy, optimizer):
        self.memory, self.windows, self.live = memory, [], False
        policy.register_forward_pre_hook(lambda *a: self._close("pass"))
        optimizer.register_step_pre_hook(lambda *a: self._close("optimizer"))
        optimizer.register_step_post_hook(lambda *a: self._close("after"))

    def start(self):
        self.memory.mark()
        self.windows, self.opening, self.live = [], "reference scoring", True

    def _close(self, next_window):
        if self.live:
            self.windows.append((self.opening, self.memory.mark()[0]))
            self.opening = next_window

    def finish(self):
        """{"reference scoring": peak, "passes": [peak of each pass], "optimizer": peak} (bytes allocated)."""
        self._close(None)
        self.live = False
        peaks = {"reference scoring": None, "passes": [], "optimizer": None}
        windows, self.windows = self.windows, []
        for name, peak in windows:
            if name == "pass":
                peaks["passes"].append(peak)
            elif name in ("reference scoring", "optimizer"):
                peaks[name] = peak
        return peaks


def line_fit(xs, ys):
    """(a, b) of the least-squares line y = a + b x; None for fewer than two distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def synthetic_batch(shape, seed, device):
    """One rank's share of a two-view step: questions x views groups of G samples of random ids; each group
    shares its prompt. Sampler log-probs -log V (a random model's), advantages from random 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    vocab, G = shape["model"]["vocab_size"], shape["group_size"]
    randint = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))
    samples = []
    for _ in range(VIEWS * shape["questions"]):
        prompt = torch.randint(1, vocab, (randint(shape["min_prompt_len"], shape["max_prompt_len"]),),
                               generator=g).tolist()
        for _ in range(G):
            n = randint(shape["min_response_len"], shape["max_response_len"])
            samples.append(Sample(prompt, torch.randint(1, vocab, (n,), generator=g).tolist(),
                                  [-math.log(vocab)] * n, "", False))
    batch = grpo.make_batch(samples, 0, device)
    batch.view = torch.arange(VIEWS, device=device).repeat_interleave(shape["questions"] * G)
    rewards = torch.randint(0, 2, (VIEWS * shape["questions"], G), generator=g).float()
    batch.advantages = grpo.group_advantages(rewards).flatten().to(device)
    return batch


def all_reduce_bandwidth(shape, device, world_size):
    """All-reduces of one tensor for shape["allreduce_s"] seconds: {ops, bytes, loop_seconds, algbw, busbw} (GB/s;
    busbw = algbw x 2 (W - 1) / W, what each rank's link carries in a ring)."""
    import torch.distributed as dist
    t = torch.ones(shape["allreduce_bytes"] // 4, dtype=torch.float32, device=device)
    dist.all_reduce(t)                                                  # the first: the communicator's setup
    synchronize()
    ops, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < shape["allreduce_s"]:
        dist.all_reduce(t)
        synchronize()
        ops += 1
    seconds = time.perf_counter() - t0
    nbytes = t.numel() * t.element_size()
    algbw = ops * nbytes / seconds / 1e9
    return {"backend": dist.get_backend(), "ops": ops, "bytes": nbytes, "loop_seconds": seconds, "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (world_size - 1) / world_size}


def random_model(shape, device, seed):
    """The shape's Qwen3 with random weights, in bf16 on `device` (the hub's checkpoint is stored in bf16)."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(Qwen3Config(**shape["model"]), dtype=COMPUTE_DTYPE)


def save_model_folder(model, folder):
    """The model and the classroom tokenizer, as a Hugging Face folder."""
    from harness import world
    tokenizer = world.build_tokenizer()
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError("the classroom tokenizer is larger than the model's vocabulary")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def shard_checksums(model):
    """{name: weightcheck.checksum of this rank's shard}: an exact fingerprint of the weights a checkpoint holds."""
    from torch.distributed.tensor import DTensor
    return {name: checksum(p.to_local() if isinstance(p, DTensor) else p) for name, p in model.named_parameters()}


def save_model_checkpoint(model, path):
    """The model alone through DCP, as checkpoint.save writes the EMA teacher (its shards resharded first)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    sharding.reshard(model)
    dcp.save({"policy": get_model_state_dict(model)}, checkpoint_id=path)


def load_model_checkpoint(model, path):
    """The model from `path`, as checkpoint.load reads the EMA teacher."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    state = {"policy": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["policy"])


def time_gather(policy):
    """One full pass over sharding.gather_full_weights in the compute dtype: (tensors, bytes)."""
    last, count, nbytes = None, 0, 0
    for _, tensor in sharding.gather_full_weights(policy, COMPUTE_DTYPE):
        count += 1
        if tensor is not last:                      # a tied parameter comes once, under each of its names in turn
            nbytes += tensor.numel() * tensor.element_size()
        last = tensor
    return count, nbytes


def sample(engine, shape, vocab, memory):
    """engine.generate on the shape's sampling request: what it returned, its speed and its KV cache's size
    were the whole batch held at once (rows x (longest prompt + max tokens))."""
    c = shape["model"]
    g = torch.Generator().manual_seed(10_000)
    lengths = torch.randint(shape["min_prompt_len"], shape["max_prompt_len"] + 1, (shape["sample_prompts"],),
                            generator=g).tolist()
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]
    seeds = [request_seed(0, "policy", 1, i) for i in range(len(prompts))]
    before = memory.allocated()
    synchronize()
    t0 = time.perf_counter()
    groups = engine.generate(prompts, shape["sample_n"], 1.0, shape["sample_tokens"], seeds=seeds)
    synchronize()
    seconds = time.perf_counter() - t0
    responses = [s for group in groups for s in group]
    tokens = sum(len(s.token_ids) for s in responses)
    per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2      # K and V, bf16
    return {"prompts": len(prompts), "prompt_lengths": lengths, "n": shape["sample_n"],
            "max_tokens": shape["sample_tokens"], "responses": len(responses), "tokens": tokens,
            "finished": sum(s.finished for s in responses), "generate_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "response_lengths": sorted({len(s.token_ids) for s in responses}),
            "logprobs": sum(len(s.logprobs) for s in responses),
            "nonfinite_logprobs": sum(not math.isfinite(x) for s in responses for x in s.logprobs),
            "allocated_before": before,
            "kv_cache_whole_batch": len(responses) * (max(lengths) + shape["sample_tokens"]) * per_token}


def write(doc, path):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def gib(n):
    return "-" if n is None else f"{n / 2**30:.4g}"


class Phases:
    """The run's record: `with phases("name") as r:` announces the phase, times it (device synchronised),
    takes its peak memory (Memory), adds the record r (with what the phase put in it) to doc["phases"],
    rewrites the JSON and sums the phase up in one line, with r["says"] when the phase set it."""
    def __init__(self, doc, path, memory):
        self.doc, self.path, self.memory = doc, path, memory

    @contextlib.contextmanager
    def __call__(self, name):
        stamp(f"{name} ...")
        record = {"name": name}
        self.memory.open_phase()
        t0 = time.perf_counter()
        yield record
        synchronize()
        record["seconds"] = time.perf_counter() - t0
        record["peak_allocated"], record["peak_reserved"] = self.memory.close_phase()
        record["allocated_after"] = self.memory.allocated()
        self.doc["phases"].append(record)
        write(self.doc, self.path)
        held = "" if record["peak_allocated"] is None else \
            (f"; peak allocated {gib(record['peak_allocated'])} GiB (reserved {gib(record['peak_reserved'])}), "
             f"{gib(record['allocated_after'])} GiB after")
        stamp(f"{name}: {record['seconds']:.1f} s{held}" + (f"; {record['says']}" if "says" in record else ""))

    def skip(self, name, estimate_s, budget_s):
        self.doc["skipped"].append(name)
        write(self.doc, self.path)
        stamp(f"{name}: left out, it would end past --budget_s {budget_s:.0f} (about {estimate_s:.0f} s from "
              f"{time.perf_counter() - START:.0f} s)")


def step_lines(r, setup):
    """The lines that sum a training step up."""
    yield (f"step {r['step']}: train {r['seconds']:.2f} s, MFU {100 * r['mfu']:.3g}% of {r['peak_flops'] / 1e12:.0f} "
           f"TFLOP/s, {100 * r['mfu_measured']:.3g}% of the measured {r['measured_flops'] / 1e12:.0f} "
           f"({r['flops']:.3e} FLOP on {r['tokens']:,} positions in {r['passes']} passes, largest "
           f"{r['micro_tokens']:,}; padding efficiency {r['padding_efficiency']:.2f}; {r['sequences']} sequences, "
           f"{r['response_tokens']:,} response tokens)")
    engine = setup["engine_bytes"]
    low, high = r["account_training"]
    yield (f"  weights: gather {r['gather_seconds']:.3f} s ({r['gather_tensors']} tensors, "
           f"{r['gather_bytes'] / 1e9:.4g} GB in bf16), sync into the engine {r['sync_seconds']:.3f} s")
    if r["peak_allocated_passes"] is None:
        yield (f"  memory: not measured (no CUDA allocator here); account: training tensors {gib(low)}-{gib(high)} "
               f"GiB, optimizer step {gib(r['account_optimizer'][0])} GiB")
        return
    yield (f"  memory, allocated: reference scoring {gib(r['peak_allocated_reference'])} GiB, passes "
           f"{gib(r['peak_allocated_passes'])} (largest at {r['peak_pass_rows']} x {r['peak_pass_width']}), AdamW's "
           f"step {gib(r['peak_allocated_optimizer'])}; reserved {gib(r['peak_reserved'])}; the engine's "
           f"{gib(engine)} GiB held throughout")
    moments = "" if r["moments_exist"] else ", less AdamW's moments, which its first step makes"
    yield (f"  account + the engine: passes {gib(low + engine)}-{gib(high + engine)} GiB (scale.gpu_phases' "
           f"training tensors{moments}), AdamW's step {gib(r['account_optimizer'][0] + engine)} GiB "
           f"(its optimizer-step tensors); scale.memory_account: {gib(r['account_tensors'])} GiB")
    if r["pass_fit"]:
        a, b = r["pass_fit"]
        per_token = setup["account_per_token"]
        yield (f"  passes' peaks ~ {gib(a)} GiB + {b / 1024:.0f} KiB x padded tokens ({r['passes']} passes); the "
               f"account: {per_token[0] / 1024:.0f}-{per_token[1] / 1024:.0f} KiB a token")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny shape that a CPU runs in seconds")
    ap.add_argument("--steps", type=int, help="training steps (default: 3; --tiny 2)")
    ap.add_argument("--min_prompt_len", type=int)
    ap.add_argument("--min_response_len", type=int, help="3072: every response at the limit")
    ap.add_argument("--sample_prompts", type=int)
    ap.add_argument("--sample_n", type=int)
    ap.add_argument("--sample_tokens", type=int)
    ap.add_argument("--allreduce_s", type=float)
    ap.add_argument("--budget_s", type=float, default=450.0,
                    help="start no phase that would end later than this many seconds after the start")
    ap.add_argument("--peak_flops", type=float, default=H200_BF16_DENSE)
    ap.add_argument("--measured_flops", type=float, default=H200_BF16_MEASURED)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="the JSON file, when OUT is not set")
    args = ap.parse_args(argv)
    name = "tiny" if args.tiny else "qwen3-4b"
    shape = dict(SHAPES[name])
    for key in ("steps", "min_prompt_len", "min_response_len", "sample_prompts", "sample_n", "sample_tokens",
                "allreduce_s"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    path = output_path(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    stamp("importing transformers")
    import transformers
    transformers.utils.logging.disable_progress_bar()          # saving and loading the model folder
    stamp("joining the process group (sharding.init_distributed)")
    rank, world_size, device = sharding.init_distributed()
    c = shape["model"]
    params, layer = scale.param_count(c)
    layer_params = c["num_hidden_layers"] * layer
    cfg = step_config()
    cfg.max_tokens_per_micro_batch = shape["max_tokens_per_micro_batch"]
    extra_forwards = 1 + (cfg.mini_batches > 1)
    checkpointing = True
    gpu = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    doc = {"setup": {
        "shape": name, "model_config": c, "device": gpu.name if gpu else "cpu",
        "device_total_bytes": gpu.total_memory if gpu else None, "world_size": world_size,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "params": params, "layer_params": layer_params, "extra_forwards": extra_forwards,
        "checkpointing": checkpointing, "peak_flops": args.peak_flops, "measured_flops": args.measured_flops,
        "formula": FORMULA, "compute_dtype": "bfloat16", "master_dtype": "float32", "reference_dtype": "bfloat16",
        "step_config": vars(cfg), "batch": {k: v for k, v in shape.items() if k != "model"} | {"views": VIEWS},
        "budget_s": args.budget_s, "account_per_token": account_per_token(c)},
        "phases": [], "skipped": [], "steps": []}
    stamp(f"gpu_probe: {'tiny shape' if args.tiny else 'Qwen3-4B-Base shape'}: {params:,} parameters "
          f"({c['num_hidden_layers']} layers, hidden {c['hidden_size']}, vocabulary {c['vocab_size']:,}, tied), "
          f"random, on {device} ({doc['setup']['device']}" + (f", {gpu.total_memory / 2**30:.1f} GiB" if gpu else "")
          + f"); torch {torch.__version__}, transformers {transformers.__version__}; world of {world_size}; "
          f"budget {args.budget_s:.0f} s; JSON: {path}")
    memory = Memory(device)
    phase = Phases(doc, path, memory)
    failures = []
    try:
        with phase("all-reduce") as r:
            r.update(all_reduce_bandwidth(shape, device, world_size))
            r["says"] = (f"{r['backend']}: {r['ops']} all-reduces of {r['bytes'] / 2**20:.0f} MiB, algorithm bandwidth "
                         f"{r['algbw_GBps']:.1f} GB/s, bus bandwidth {r['busbw_GBps']:.1f} GB/s (0 at one rank)")
        with tempfile.TemporaryDirectory(prefix="gpu_probe-model-") as folder:
            with phase("random model") as r:
                model = random_model(shape, device, args.seed)
                counted = sum(p.numel() for p in model.parameters())
                if counted != params:
                    raise ValueError(f"the model has {counted:,} parameters, bench/scale.py's param_count {params:,}")
            with phase("save_pretrained") as r:
                save_model_folder(model, folder)
                del model
                if memory.cuda:
                    torch.cuda.empty_cache()
                r["bytes"] = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
                r["says"] = f"{r['bytes'] / 1e9:.2f} GB written"
            # as train.build_models loads the policy, the frozen reference and the engine
            with phase("load the policy") as r:
                policy = sharding.load_sharded(folder, device, torch.float32, COMPUTE_DTYPE, checkpointing)
                r["says"] = "fp32 weights, bf16 compute, activation checkpointing (sharding.load_sharded)"
            with phase("load the reference") as r:
                ref = sharding.load_sharded(folder, device, COMPUTE_DTYPE, COMPUTE_DTYPE).requires_grad_(False)
                r["says"] = "bf16 (sharding.load_sharded)"
            with phase("the engine") as r:
                before = memory.allocated()
                engine = make_engine("hf", folder, shape["max_prompt_len"], shape["sample_tokens"], dtype="bfloat16",
                                     **{name: OFFICIAL[name] for name in ("cpu_kv_cache_gib", "gpu_memory_utilization",
                                                                          "hf_kv_budget_gib")})
                engine_bytes = None if before is None else memory.allocated() - before
                r["engine_bytes"] = doc["setup"]["engine_bytes"] = engine_bytes
                r["says"] = "rollout.make_engine('hf', bf16)" + (
                    "" if engine_bytes is None else f", holding {gib(engine_bytes)} GiB")
        optimizer = torch.optim.AdamW(policy.parameters(), lr=OFFICIAL["lr"], weight_decay=OFFICIAL["weight_decay"])
        windows = StepWindows(memory, policy, optimizer)
        doc["setup"]["resident_bytes"] = memory.allocated()
        stamp(f"per step {shape['questions']} questions x {VIEWS} views x G={shape['group_size']} = "
              f"{VIEWS * shape['questions'] * shape['group_size']} sequences, prompts "
              f"{shape['min_prompt_len']}-{shape['max_prompt_len']} tokens, responses "
              f"{shape['min_response_len']}-{shape['max_response_len']}, passes of at most "
              f"{cfg.max_tokens_per_micro_batch:,} padded tokens")

        last = STEP_ESTIMATE_S[name]
        for step in range(1, shape["steps"] + 1):
            if not fits(last, args.budget_s):
                phase.skip(f"step {step}" + (f" and after ({shape['steps']})" if step < shape["steps"] else ""),
                           last, args.budget_s)
                break
            t_begin = time.perf_counter()
            batch = synthetic_batch(shape, args.seed + step, device)
            passes = grpo.micro_batches_for_all_ranks(grpo.sequence_lengths(batch.mask), cfg)
            shapes = [(len(p), batch.rows(p).input_ids.shape[1]) for p in passes]
            tokens = sum(n * w for n, w in shapes)
            micro_tokens = max(n * w for n, w in shapes)
            with phase(f"step {step}: train") as r:
                windows.start()
                synchronize()
                t0 = time.perf_counter()
                stats = grpo.train_step(policy, ref, optimizer, batch, cfg, world_size,
                                        order=torch.arange(len(batch)))
                synchronize()
                seconds = time.perf_counter() - t0
                peaks = windows.finish()
                r["seconds_step"] = seconds
            tensors, training, optimizer_step = account(c, micro_tokens)
            moments = tensors["AdamW moments (fp32, sharded)"]
            if step == 1:                         # AdamW makes its moments at its first step, after the passes
                training = [t - moments for t in training]
            flops = train_flops(tokens, params, layer_params, extra_forwards, checkpointing)
            record = {
                "step": step, "seconds": seconds, "tokens": tokens, "response_tokens": int(stats.tokens),
                "sequences": len(batch), "passes": len(passes), "micro_tokens": micro_tokens,
                "padding_efficiency": stats.tokens / tokens, "flops": flops,
                "mfu": flops / (seconds * args.peak_flops), "peak_flops": args.peak_flops,
                "mfu_measured": flops / (seconds * args.measured_flops), "measured_flops": args.measured_flops,
                "peak_allocated": r["peak_allocated"], "peak_reserved": r["peak_reserved"],
                "peak_allocated_reference": peaks["reference scoring"],
                "peak_allocated_passes": max(peaks["passes"]) if memory.cuda else None,
                "peak_allocated_optimizer": peaks["optimizer"],
                "pass_shapes": shapes, "pass_peaks": peaks["passes"] if memory.cuda else None,
                "moments_exist": step > 1, "account_tensors": sum(tensors.values()), "account_parts": tensors,
                "account_training": training, "account_optimizer": optimizer_step,
                "grad_norm": stats.grad_norm, "kl": stats.kl_sum / stats.tokens,
                "entropy": stats.entropy_sum / stats.tokens,
            }
            record["pass_fit"] = None
            if memory.cuda and len(peaks["passes"]) == len(passes):        # one policy forward a pass
                top = max(range(len(passes)), key=lambda i: peaks["passes"][i])
                record["peak_pass_rows"], record["peak_pass_width"] = shapes[top]
                record["pass_fit"] = line_fit([n * w for n, w in shapes], peaks["passes"])
            with phase(f"step {step}: gather") as r:
                record["gather_tensors"], record["gather_bytes"] = time_gather(policy)
            record["gather_seconds"] = r["seconds"]
            with phase(f"step {step}: sync") as r:
                sharding.sync_engine_weights(engine, policy)
            record["sync_seconds"] = r["seconds"]
            record["elapsed"] = time.perf_counter() - START
            doc["steps"].append(record)
            write(doc, path)
            for line in step_lines(record, doc["setup"]):
                stamp(line)
            last = time.perf_counter() - t_begin

            if step == 1 and fits(ESTIMATE_S[name]["sample"], args.budget_s):
                with phase("sample") as r:
                    r.update(sample(engine, shape, c["vocab_size"], memory))
                    r["says"] = (f"{r['prompts']} prompts of {min(r['prompt_lengths'])}-{max(r['prompt_lengths'])} "
                                 f"tokens x {r['n']}, at most {r['max_tokens']} tokens each: {r['tokens']:,} tokens "
                                 f"({r['finished']} responses ended) at {r['tokens_per_second']:,.0f} tokens/s; "
                                 f"{r['nonfinite_logprobs']} of {r['logprobs']:,} log-probs not finite; the whole "
                                 f"batch's KV cache {gib(r['kv_cache_whole_batch'])} GiB")
                if r["nonfinite_logprobs"]:
                    failures.append(f"the engine returned {r['nonfinite_logprobs']} non-finite log-probs")
            elif step == 1:
                phase.skip("sample", ESTIMATE_S[name]["sample"], args.budget_s)
            if step == 1 and fits(ESTIMATE_S[name]["checkpoint"], args.budget_s):
                with tempfile.TemporaryDirectory(prefix="gpu_probe-checkpoint-") as folder:
                    saved = shard_checksums(policy)
                    with phase("checkpoint save") as r:
                        save_model_checkpoint(policy, os.path.join(folder, "weights"))
                        synchronize()
                        r["bytes"] = sum(os.path.getsize(os.path.join(d, f))
                                         for d, _, files in os.walk(folder) for f in files)
                        r["says"] = f"{r['bytes'] / 1e9:.2f} GB"
                    with torch.no_grad():
                        for p in policy.parameters():
                            p.zero_()
                    with phase("checkpoint load") as r:
                        load_model_checkpoint(policy, os.path.join(folder, "weights"))
                        loaded = shard_checksums(policy)
                        differ = sorted(n for n in saved if loaded[n] != saved[n])
                        r["tensors"], r["differ"] = len(saved), differ
                        r["says"] = (f"{len(saved)} tensors, each equal bit for bit to the saved one" if not differ
                                     else f"{len(differ)} of {len(saved)} tensors differ from the saved ones "
                                          f"({differ[:3]})")
                    if differ:
                        failures.append(f"the checkpoint loaded other weights than it saved ({differ[:3]})")
            elif step == 1:
                phase.skip("checkpoint save and load", ESTIMATE_S[name]["checkpoint"], args.budget_s)
        if failures:
            raise RuntimeError("; ".join(failures))
    except BaseException as e:
        doc["error"] = f"{type(e).__name__}: {e}"
        doc["traceback"] = traceback.format_exc()[-4000:]
        if memory.cuda:
            doc["allocated_at_error"] = torch.cuda.memory_allocated()
        write(doc, path)
        raise
    stamp(f"{len(doc['steps'])} steps, {len(doc['phases'])} phases in {time.perf_counter() - START:.0f} s"
          + (f"; left out: {', '.join(doc['skipped'])}" if doc["skipped"] else "") + f"; JSON: {path}")
    return doc


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # the model folders are local: never ask the hub
    main()
