"""The official preset's training step at Qwen3-4B-Base's shape on one GPU: memory, speed, the weight
gather and transformers' sampling, step by step, with random weights (no download, no vLLM).

    timeout 540 python3 bench/gpu_probe.py          # one H200: a few steps, within 9 minutes
    python bench/gpu_probe.py --tiny                # the same code at a tiny shape, on a CPU

The model is a Qwen3ForCausalLM built from a config with Qwen3-4B-Base's sizes (bench/scale.py's
QWEN3_4B: hidden 2560, 36 layers, 32 query and 8 key-value heads of 128, MLP 9728, vocabulary
151,936, tied embeddings; 4.02B parameters, 3.63B of them outside the embedding, as the model card's
4.0B and 3.6B), and, as its config.json has them, rotary base 1e6, RMSNorm eps 1e-6, 32,768
positions (these three change neither memory nor FLOPs). Its random weights are made on the device
(a `torch.device` context): the policy in fp32, the reference a bf16 copy of it. Both are sharded
with `sharding.shard` in a world of one (`sharding.init_distributed`), as train.py's
`build_models` holds them: the policy computed in bf16 over fp32 master weights (FSDP2 mixed
precision, fp32 gradient reduction) with activation checkpointing per decoder layer, the
reference kept and computed in bf16. AdamW at the official learning rate and weight decay.

Each step is one `grpo.train_step` on a fresh synthetic batch shaped like one rank's share of the
official Co-rewarding-I step (config.PRESETS["official"]: 128 questions over 8 ranks, G=8, two
views): 16 questions x 2 views x 8 responses = 256 `rollout.Sample`s of random token ids through
`grpo.make_batch`, each view's G responses sharing their prompt; prompt lengths uniform in
[--min_prompt_len, 512], response lengths uniform in [--min_response_len, 3,072] (a random model
seldom samples an end token: --min_response_len 3072 gives the case where every response runs to
the limit); passes of at most 16,384 padded tokens, one update.

After each step it prints a few lines and rewrites the JSON file (`$OUT/gpu_probe.json` when OUT
is set, else --out, else a temporary folder) with one record per step:

- memory: torch.cuda.max_memory_allocated and max_memory_reserved over the step, taken apart at
  the optimizer step (the passes, then AdamW's step), beside bench/scale.py's account for one rank
  at the step's largest pass: `memory_account` (the trainer's tensors; world of one, bf16 compute,
  bf16 reference, checkpointing, no vLLM) and the training phase of `gpu_phases` (that account plus
  the tied embedding's second gradient, FSDP's reduce-scatter staging, the recomputed layer's
  temporaries and fragmentation, as a low and a high estimate; without vLLM and without the CUDA
  runtime, which the allocator does not see). The transformers engine's bf16 copy of the model
  stays on the device through the step (its `sleep` frees nothing), so the peak includes it; the
  record gives its bytes apart.
- speed: the step's seconds (`train_step`, device synchronised) and its MFU against the H200's
  dense bf16 peak, 989e12 FLOP/s (--peak_flops), with

      FLOPs = T x (6 N  +  2 N x E  +  2 N_layers x C)

  T the positions the step's passes compute (rows x padded width, summed over passes: the
  reference's scoring passes are the same), N the parameters (the tied embedding once:
  scale.param_count), N_layers those of the decoder layers, E the extra forwards (1, the
  reference's log-probs; 2 with several mini-batches, which add the old log-probs' pass), C 1 with
  activation checkpointing (the backward recomputes each decoder layer's forward) else 0. It is
  the 6 N T convention: attention's products over the sequence are left out, and the output layer
  is counted at every position though the chunked log-probs run it at response positions only.
- the weight gather: the seconds of one full pass over `sharding.gather_full_weights(policy,
  bf16)`, the stream that feeds the rollout engine (every parameter all-gathered and cast, the
  tied embedding once), and of the whole `sharding.sync_engine_weights` into the engine.
- sampling: `rollout.HFEngine` (`--backend hf`), on the same random weights saved to a temporary
  folder with the classroom tokenizer (no Qwen tokenizer here; the sampled ids are what counts),
  kept in step with the policy by the sync above: --sample_prompts prompts of 512 random tokens,
  --sample_n responses each, at most --sample_tokens tokens, temperature 1, timed.

The first step includes the device's warm-up (cuBLAS, the allocator's first segments, AdamW's
moments). Before each further step the probe checks that another step of the last one's length
still ends within --budget_s of its start, and stops otherwise: with the default 450 s the command
stays within 9 minutes unless a single step takes most of them.

--tiny runs everything at a tiny shape (2 layers of width 64, prompts of at most 32 tokens,
responses of 64, passes of 512 tokens) in bf16, which a CPU runs too; there the memory fields are
null (no CUDA allocator) and the MFU is still taken against the H200's peak (tests/test_gpu_probe.py
recomputes it).
"""
import time

START = time.perf_counter()           # the budget counts the imports too

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import config  # noqa: E402
import grpo  # noqa: E402
import scale  # noqa: E402   bench/scale.py: the memory account
import sharding  # noqa: E402
from rollout import HFEngine, Sample, request_seed  # noqa: E402

H200_BF16_DENSE = 989e12              # FLOP/s: the H200's dense bf16 tensor-core peak (1,979e12 is with sparsity)
OFFICIAL = config.PRESETS["official"]
OFFICIAL_RANKS = 8                    # the official run's GPUs (bench/README.md's account: 8 x 80 GB)
VIEWS = 2                             # Co-rewarding-I: each question and its rephrasing

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
                     steps=3, sample_prompts=4, sample_n=2, sample_tokens=32),
    "tiny": dict(model=TINY, max_prompt_len=32, min_prompt_len=8, max_response_len=64, min_response_len=8,
                 max_tokens_per_micro_batch=512, questions=2, group_size=4, steps=2, sample_prompts=2, sample_n=2,
                 sample_tokens=4),
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


def next_step_fits(elapsed, last_step_seconds, budget_s):
    """Whether one more step as long as the last one ends within the budget."""
    return elapsed + last_step_seconds <= budget_s


def step_config():
    """grpo.StepConfig from the official preset (as train.step_config makes it from a run's settings)."""
    return grpo.StepConfig(temperature=OFFICIAL["temperature"], clip_eps=OFFICIAL["clip_eps"],
                           kl_coef=OFFICIAL["kl_coef"], mini_batches=OFFICIAL["mini_batches"],
                           micro_batch_size=OFFICIAL["micro_batch_size"],
                           max_tokens_per_micro_batch=OFFICIAL["max_tokens_per_micro_batch"],
                           max_grad_norm=OFFICIAL["max_grad_norm"], defer_grad_sync=OFFICIAL["defer_grad_sync"])


def account(model_config, micro_tokens):
    """bench/scale.py's account for one rank at a pass of `micro_tokens` padded tokens: the tensors
    (`memory_account`, by part) and the training phase of `gpu_phases` without vLLM and the CUDA runtime
    ((low, high), bytes)."""
    tensors = scale.memory_account(model_config, world_size=1, micro_tokens=micro_tokens, compute_bytes=2,
                                   ref_bytes=2, checkpointing=True, defer_grad_sync=False, vllm_share=0,
                                   weight_sync=False)
    phases, _ = scale.gpu_phases(model_config, world_size=1, teacher=False, micro_tokens=micro_tokens)
    training = [sum(v[i] for k, v in phases["training"].items() if not k.startswith(("vLLM", "CUDA")))
                for i in (0, 1)]
    return tensors, training


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepPeaks:
    """The CUDA allocator's peaks (allocated, reserved) of a train_step's passes and of its optimizer
    step(s), taken apart by hooks on the optimizer; None on a CPU."""
    def __init__(self, optimizer):
        self.cuda = torch.cuda.is_available()
        optimizer.register_step_pre_hook(lambda *a: self._mark("passes"))
        optimizer.register_step_post_hook(lambda *a: self._mark("optimizer"))

    def start(self):
        self.peaks = {"passes": (0, 0), "optimizer": (0, 0)}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def _mark(self, phase):
        if self.cuda:
            synchronize()
            now = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
            self.peaks[phase] = tuple(max(a, b) for a, b in zip(self.peaks[phase], now))
            torch.cuda.reset_peak_memory_stats()

    def finish(self):
        """{field: bytes} of the step; after the last optimizer step nothing but its return is left."""
        if not self.cuda:
            return {k: None for k in ("peak_allocated", "peak_reserved", "peak_allocated_passes",
                                      "peak_allocated_optimizer", "peak_reserved_passes", "peak_reserved_optimizer")}
        self._mark("passes")
        (pa, pr), (oa, orr) = self.peaks["passes"], self.peaks["optimizer"]
        return {"peak_allocated": max(pa, oa), "peak_reserved": max(pr, orr), "peak_allocated_passes": pa,
                "peak_allocated_optimizer": oa, "peak_reserved_passes": pr, "peak_reserved_optimizer": orr}


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


def build(shape, device, seed):
    """The policy (fp32) and the reference (its bf16 copy), random, made on `device`, unsharded."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(**shape["model"])
    torch.manual_seed(seed)
    with torch.device(device):
        policy = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        ref = AutoModelForCausalLM.from_config(cfg, dtype=COMPUTE_DTYPE)
    ref.load_state_dict(policy.state_dict())
    return policy, ref


def make_engine(ref, shape, folder):
    """rollout.HFEngine on the reference's weights (the policy's, in bf16), saved to `folder` with the
    classroom tokenizer."""
    import world
    tokenizer = world.build_tokenizer()
    if len(tokenizer) > shape["model"]["vocab_size"]:
        raise ValueError("the classroom tokenizer is larger than the model's vocabulary")
    ref.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return HFEngine(folder, shape["max_prompt_len"], shape["sample_tokens"], dtype=str(COMPUTE_DTYPE).split(".")[1])


def time_gather(policy):
    """Seconds of one full pass over sharding.gather_full_weights in the compute dtype; tensors and bytes."""
    synchronize()
    t0 = time.perf_counter()
    last, count, nbytes = None, 0, 0
    for _, tensor in sharding.gather_full_weights(policy, COMPUTE_DTYPE):
        count += 1
        if tensor is not last:                      # a tied parameter comes once, under each of its names in turn
            nbytes += tensor.numel() * tensor.element_size()
        last = tensor
    del last
    synchronize()
    return time.perf_counter() - t0, count, nbytes


def sample(engine, shape, step, vocab):
    g = torch.Generator().manual_seed(10_000 + step)
    prompts = [torch.randint(1, vocab, (shape["max_prompt_len"],), generator=g).tolist()
               for _ in range(shape["sample_prompts"])]
    seeds = [request_seed(0, "policy", step, i) for i in range(len(prompts))]
    synchronize()
    t0 = time.perf_counter()
    groups = engine.generate(prompts, shape["sample_n"], 1.0, shape["sample_tokens"], seeds=seeds)
    synchronize()
    seconds = time.perf_counter() - t0
    lengths = [len(s.token_ids) for group in groups for s in group]
    return {"seconds": seconds, "prompts": len(prompts), "n": shape["sample_n"], "prompt_len": shape["max_prompt_len"],
            "max_tokens": shape["sample_tokens"], "responses": len(lengths), "tokens": sum(lengths),
            "lengths": lengths, "finished": sum(s.finished for group in groups for s in group),
            "tokens_per_second": sum(lengths) / seconds,
            "first_ids": [s.token_ids[:8] for group in groups for s in group]}


def write(doc, path):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def gib(n):
    return "-" if n is None else f"{n / 2**30:.4g}"


def step_lines(r):
    yield (f"step {r['step']}: train {r['seconds']:.2f} s, MFU {100 * r['mfu']:.3g}% ({r['flops']:.3e} FLOP "
           f"on {r['tokens']:,} positions in {r['passes']} passes, largest {r['micro_tokens']:,}; padding "
           f"efficiency {r['padding_efficiency']:.2f}; {r['sequences']} sequences, {r['response_tokens']:,} "
           f"response tokens)")
    acct = (f"account at this pass: tensors {gib(r['account_tensors'])} GiB (scale.memory_account), training "
            f"phase {gib(r['account_training'][0])}-{gib(r['account_training'][1])} GiB (scale.gpu_phases, no "
            f"vLLM, no CUDA runtime)")
    if r["peak_allocated"] is None:
        yield f"  memory: not measured (no CUDA allocator here); {acct}"
    else:
        yield (f"  memory: peak allocated {gib(r['peak_allocated'])} GiB (passes {gib(r['peak_allocated_passes'])}, "
               f"optimizer step {gib(r['peak_allocated_optimizer'])}; the HF engine's model {gib(r['engine_bytes'])} "
               f"of it), reserved {gib(r['peak_reserved'])} GiB; {acct}")
    yield (f"  weights: gather {r['gather_seconds']:.3f} s ({r['gather_tensors']} tensors, "
           f"{r['gather_bytes'] / 1e9:.4g} GB in {str(COMPUTE_DTYPE).split('.')[1]}), sync into the HF engine "
           f"{r['sync_seconds']:.3f} s")
    s = r["sample"]
    yield (f"  hf sampling: {s['prompts']} prompts x {s['n']} of {s['prompt_len']} tokens, {s['tokens']} tokens "
           f"(at most {s['max_tokens']} each) in {s['seconds']:.2f} s, {s['tokens_per_second']:.1f} tokens/s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny shape that a CPU runs in seconds")
    ap.add_argument("--steps", type=int, help="training steps (default: 3; --tiny 2)")
    ap.add_argument("--min_prompt_len", type=int)
    ap.add_argument("--min_response_len", type=int, help="3072: every response at the limit")
    ap.add_argument("--sample_prompts", type=int)
    ap.add_argument("--sample_n", type=int)
    ap.add_argument("--sample_tokens", type=int)
    ap.add_argument("--budget_s", type=float, default=450.0,
                    help="start no step that would end later than this many seconds after the start")
    ap.add_argument("--peak_flops", type=float, default=H200_BF16_DENSE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="the JSON file, when OUT is not set")
    args = ap.parse_args(argv)
    shape = dict(SHAPES["tiny" if args.tiny else "qwen3-4b"])
    for key in ("steps", "min_prompt_len", "min_response_len", "sample_prompts", "sample_n", "sample_tokens"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    path = output_path(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    import transformers
    transformers.utils.logging.disable_progress_bar()          # saving and loading the engine's folder
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
        "shape": "tiny" if args.tiny else "qwen3-4b", "model_config": c, "device": gpu.name if gpu else "cpu",
        "device_total_bytes": gpu.total_memory if gpu else None, "world_size": world_size,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "params": params, "layer_params": layer_params, "extra_forwards": extra_forwards,
        "checkpointing": checkpointing, "peak_flops": args.peak_flops, "formula": FORMULA,
        "compute_dtype": "bfloat16", "master_dtype": "float32", "reference_dtype": "bfloat16",
        "step_config": vars(cfg), "batch": {k: v for k, v in shape.items() if k != "model"} | {"views": VIEWS},
        "budget_s": args.budget_s}, "steps": []}
    print(f"gpu_probe: {'tiny shape' if args.tiny else 'Qwen3-4B-Base shape'}: {params:,} parameters "
          f"({c['num_hidden_layers']} layers, hidden {c['hidden_size']}, vocabulary {c['vocab_size']:,}, tied), "
          f"random, on {device} ({doc['setup']['device']}"
          + (f", {gpu.total_memory / 2**30:.1f} GiB" if gpu else "")
          + f"); torch {torch.__version__}, transformers {transformers.__version__}; JSON: {path}", flush=True)
    try:
        t0 = time.perf_counter()
        policy, ref = build(shape, device, args.seed)
        counted = sum(p.numel() for p in policy.parameters())
        if counted != params:
            raise ValueError(f"the model has {counted:,} parameters, bench/scale.py's param_count {params:,}")
        synchronize()
        doc["setup"]["build_seconds"] = time.perf_counter() - t0
        allocated = lambda: torch.cuda.memory_allocated() if device.type == "cuda" else None
        before = allocated()
        with tempfile.TemporaryDirectory(prefix="gpu_probe-engine-") as folder:
            t0 = time.perf_counter()
            engine = make_engine(ref, shape, folder)
            synchronize()
            doc["setup"]["engine_seconds"] = time.perf_counter() - t0     # saving the folder and loading it
        engine_bytes = None if before is None else allocated() - before
        doc["setup"]["engine_bytes"] = engine_bytes
        sharding.shard(policy, param_dtype=COMPUTE_DTYPE, activation_checkpointing=checkpointing)
        sharding.shard(ref).requires_grad_(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=OFFICIAL["lr"], weight_decay=OFFICIAL["weight_decay"])
        peaks = StepPeaks(optimizer)
        doc["setup"]["resident_bytes"] = allocated()
        print(f"built the policy (fp32, bf16 compute, activation checkpointing) and the reference (bf16) in "
              f"{doc['setup']['build_seconds']:.1f} s; the HF engine (bf16) saved and loaded in "
              f"{doc['setup']['engine_seconds']:.1f} s" + ("" if engine_bytes is None else
                                                             f", holding {gib(engine_bytes)} GiB") +
              f"; per step {shape['questions']} questions x {VIEWS} views x G={shape['group_size']} = "
              f"{VIEWS * shape['questions'] * shape['group_size']} sequences, prompts "
              f"{shape['min_prompt_len']}-{shape['max_prompt_len']} tokens, responses "
              f"{shape['min_response_len']}-{shape['max_response_len']}, passes of at most "
              f"{cfg.max_tokens_per_micro_batch:,} padded tokens; world of {world_size}", flush=True)
        write(doc, path)

        last = None
        for step in range(1, shape["steps"] + 1):
            elapsed = time.perf_counter() - START
            if last is not None and not next_step_fits(elapsed, last, args.budget_s):
                doc["setup"]["stopped"] = (f"after step {step - 1}: another step of {last:.0f} s would end past "
                                           f"--budget_s {args.budget_s:.0f} (at {elapsed:.0f} s now)")
                print(f"stopped {doc['setup']['stopped']}", flush=True)
                break
            t_begin = time.perf_counter()
            batch = synthetic_batch(shape, args.seed + step, device)
            passes = grpo.micro_batches_for_all_ranks(batch.lengths(), cfg)
            widths = [batch.rows(p).input_ids.shape[1] for p in passes]
            tokens = sum(w * len(p) for w, p in zip(widths, passes))
            micro_tokens = max(w * len(p) for w, p in zip(widths, passes))
            peaks.start()
            synchronize()
            t0 = time.perf_counter()
            stats = grpo.train_step(policy, ref, optimizer, batch, cfg, world_size, order=torch.arange(len(batch)))
            synchronize()
            seconds = time.perf_counter() - t0
            memory = peaks.finish()
            flops = train_flops(tokens, params, layer_params, extra_forwards, checkpointing)
            gather_seconds, gather_tensors, gather_bytes = time_gather(policy)
            t0 = time.perf_counter()
            sharding.sync_engine_weights(engine, policy)
            synchronize()
            sync_seconds = time.perf_counter() - t0
            sampled = sample(engine, shape, step, c["vocab_size"])
            tensors, training = account(c, micro_tokens)
            record = {
                "step": step, "seconds": seconds, "tokens": tokens, "response_tokens": int(stats["tokens"]),
                "sequences": len(batch), "passes": len(passes), "micro_tokens": micro_tokens,
                "padding_efficiency": stats["tokens"] / tokens, "flops": flops,
                "mfu": flops / (seconds * args.peak_flops), "peak_flops": args.peak_flops,
                **memory, "engine_bytes": engine_bytes,
                "account_tensors": sum(tensors.values()), "account_parts": tensors, "account_training": training,
                "gather_seconds": gather_seconds, "gather_tensors": gather_tensors, "gather_bytes": gather_bytes,
                "sync_seconds": sync_seconds, "sample": sampled,
                "grad_norm": stats["grad_norm"], "kl": stats["kl_sum"] / stats["tokens"],
                "entropy": stats["entropy_sum"] / stats["tokens"],
                "elapsed": time.perf_counter() - START,
            }
            doc["steps"].append(record)
            write(doc, path)
            for line in step_lines(record):
                print(line, flush=True)
            last = time.perf_counter() - t_begin
    except BaseException as e:
        doc["setup"]["error"] = f"{type(e).__name__}: {e}"
        doc["setup"]["traceback"] = traceback.format_exc()[-4000:]
        if torch.cuda.is_available():
            doc["setup"]["allocated_at_error"] = torch.cuda.memory_allocated()
            doc["setup"]["max_allocated_at_error"] = torch.cuda.max_memory_allocated()
        write(doc, path)
        raise
    print(f"{len(doc['steps'])} steps in {time.perf_counter() - START:.0f} s; JSON: {path}", flush=True)
    return doc


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # the model folders are local: never ask the hub
    main()
