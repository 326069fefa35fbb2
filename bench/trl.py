"""Our GRPO step against TRL's GRPOTrainer, side by side: seconds per step split into rollout and
train, the train phase's FLOP/s, its peak memory and the padding, in a table.

    python3 -m venv bench/.venv-trl && bench/.venv-trl/bin/pip install -r bench/requirements-trl.txt
    bench/.venv-trl/bin/pip uninstall -y torchvision torchaudio torchcodec      # as the README's install
    .venv/bin/python bench/trl.py --pairs 3           # the classroom: ours, TRL + vLLM, TRL + generate, ours, ...
    .venv/bin/python bench/trl.py --shape real --steps 3       # the real vocabulary and 1,024-token responses

TRL lives in bench/.venv-trl only (same torch, transformers and vLLM as requirements.txt, trl on
top), so that it cannot move the project's pins; this script runs with the project's venv, starts
`train.py` with it and TRL with bench/.venv-trl/bin/python (this file again, with --trl_worker).
TRL runs twice: with vLLM colocated in its process (`use_vllm=True, vllm_mode="colocate"`, what a
TRL user who wants speed turns on), and with transformers' generate. TRL 1.16 supports vLLM up to
0.31 and warns at the project's 0.32; with either, its colocated weight sync fails on a CPU, and
`reload_weights_through_vllm` is the one change that makes it run.

Two shapes (SHAPES), for both, with temperature 1.0 (no top-p, no top-k), lr 1e-4, KL coefficient
0.005 to the start model, fp32, one optimizer update a step over the whole batch (token mean over
the batch: TRL's loss_type="dapo"), reward 1 when the \\boxed answer equals the gold one (the `gt`
method; TRL gets answers.extract_answer / answers.is_equiv), no evaluation in the timed steps:
- `classroom`: the classroom base model (world.base_model_dir()), 16 train pairs x 2 views x G=8 =
  256 responses a step of at most 48 tokens. Ours: train.py's classroom preset.
- `real`: bench/scale.py's Qwen3-shaped model (vocabulary 151,936, head_dim 128, tied embeddings,
  4 layers of width 256), random-initialised, with the classroom tokenizer padded to that
  vocabulary by placeholder words, so that every sampled id decodes. 2 train questions x G=8 = 16
  responses of --response_len tokens (a random model rarely samples the end token, so the
  responses run to the limit, and their reward is 0). Ours: train.py's official preset (activation
  checkpointing, 16,384-token passes, chunked log-probs at response positions); TRL: its
  gradient checkpointing (its default) and its fused LM head (always on in TRL 1.16), with
  --trl_micro_batch rows a pass and gradient accumulation over the 16 (one generation batch per
  optimizer step either way).

- Ours: `train.py --method gt --steps N --eval_every 1000 --save_every 0` (the evaluations at step
  0 and N fall outside the step timings). Per step from metrics.jsonl: t_rollout (vLLM sampling),
  t_train (rewards, the reference forward, the policy's forward and backward, the optimizer) and
  t_sync (loading the new weights into vLLM). train.py runs under a wrapper that notes each pass's
  shape (grpo.Batch.rows) and the wall-clock bounds of grpo.train_step, the train phase's memory
  window.
- TRL: GRPOTrainer with vLLM (colocated, vLLM's defaults otherwise) or with transformers' generate,
  gradient accumulation such that one optimizer step = one generation batch, num_iterations 1. A
  step is on_step_begin to on_step_end (a TrainerCallback); its rollout is GRPOTrainer._generate
  (tokenise the prompts, with vLLM load the new weights into it, generate, decode) and its train
  phase is the rest: rewards, the reference forward, the policy's forward and
  backward, the optimizer. With num_iterations 1 and generation aligned with the optimizer step,
  TRL computes no separate old log-probs (π_old is the update's own forward, detached), as ours.

Memory: this process polls each run's resident memory (its process tree's, every 50 ms). A step's
train-phase peak is the highest it saw between the end of the rollout and the end of the step
(ours: grpo.train_step's bounds), and "its own" is that peak minus the memory at the window's
start; a run that passes --memory_limit_gib is stopped and reported as not fitting.

Padding efficiency = response tokens / positions the training forwards compute (rows x width of
each pass: ours pads each token-budget pass to its own longest row; TRL left-pads the prompts and
right-pads the completions of the whole generation batch). Train-phase FLOPs per step = 8 x (P x
N_body + R x N_head): 2 for the reference forward and 6 for the policy's forward and backward; P
the positions of one forward, N_body all parameters except the output layer (the norms included,
the embedding lookup being free of FLOPs), N_head the output layer's (tied to the embedding:
counted once), run on the R response tokens. Attention's score and value products are left out.
The machine's practical FLOP/s is the best of a few fp32 --matmul_size square matmuls, with the
threads the runs use.

The first --warmup steps of each run are left out and the table shows medians. --pairs runs ours
and TRL in turn, a pair at a time, and reports TRL's seconds over ours pair by pair: this
machine's speed drifts between runs, and a pair's two runs are minutes apart.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this file is named trl.py: keep its folder off the path, so that `import trl` is the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, ROOT)

TRL_PYTHON = os.path.join(HERE, ".venv-trl", "bin", "python")
COMMON = dict(temperature=1.0, lr=1e-4, kl_coef=0.005, seed=0)
SHAPES = {
    "classroom": dict(questions=16, views="both", group_size=8, max_response_len=48, preset="classroom"),
    "real": dict(questions=2, views="original", group_size=8, max_response_len=1024, preset="official"),
}
GiB = 2 ** 30
PAGE = os.sysconf("SC_PAGE_SIZE")

# Runs train.py as `python train.py ...` would, noting each training pass's shape (grpo.Batch.rows)
# and the wall-clock bounds of each grpo.train_step.
OURS_LAUNCHER = r"""
import json, runpy, sys, time, os
notes, train_py = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(train_py))
import grpo
rows, train_step, passes = grpo.Batch.rows, grpo.train_step, []
def noting_rows(self, idx):
    part = rows(self, idx)
    passes.append((part.input_ids.shape[0] * part.input_ids.shape[1], int(part.mask.sum().item())))
    return part
def noting_step(*args, **kwargs):
    passes.clear()
    start = time.time()
    out = train_step(*args, **kwargs)
    with open(notes, "a") as f:
        f.write(json.dumps({"window": [start, time.time()], "computed": sum(p for p, _ in passes),
                            "response_tokens": sum(r for _, r in passes) // 2, "passes": len(passes)}) + "\n")
    return out
grpo.Batch.rows, grpo.train_step = noting_rows, noting_step
runpy.run_path(train_py, run_name="__main__")
"""


def threads():
    """The threads train.py takes with one rank."""
    return int(os.environ.get("OMP_NUM_THREADS", max(1, os.cpu_count())))


def offline_env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def matmul_flops(n, repeats=5, rounds=3):
    """Best FLOP/s of `repeats` back-to-back fp32 n x n matmuls, over `rounds`."""
    import torch
    torch.set_num_threads(threads())
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b                                                          # warm up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 * repeats / best


def param_counts(model_dir):
    """(N_body, N_head): all parameters but the output layer, and the output layer's."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = sum(p.numel() for p in model.parameters())              # tied weights once
    head = model.get_output_embeddings().weight.numel()
    return total - head, head


def save_real_shape_model(path):
    """bench/scale.py's Qwen3-shaped model, random-initialised, with the classroom tokenizer's vocabulary
    padded by placeholder words (' w1136', ...) to the model's, so that any sampled id decodes to text."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from harness import world
    from bench.scale import SMALL, VOCAB
    classroom = world.build_tokenizer()
    inner = Tokenizer.from_str(classroom.backend_tokenizer.to_str())
    vocab = dict(inner.get_vocab())
    while len(vocab) < VOCAB:
        vocab.setdefault(f"Ġw{len(vocab)}", len(vocab))
    padded = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    padded.pre_tokenizer, padded.decoder = inner.pre_tokenizer, inner.decoder
    tok = PreTrainedTokenizerFast(tokenizer_object=padded, eos_token=classroom.eos_token,
                                  pad_token=classroom.pad_token, unk_token="<unk>")
    torch.manual_seed(0)
    eos = tok.eos_token_id
    Qwen3ForCausalLM(Qwen3Config(**SMALL, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos)).save_pretrained(path)
    tok.save_pretrained(path)


def train_flops(rec, n_body, n_head):
    """A reference forward (2x) and the policy's forward and backward (6x)."""
    return 8 * (rec["computed"] * n_body + rec["response_tokens"] * n_head)


class MemoryWatch:
    """Polls a process tree's resident memory every `interval` s: (wall time, bytes) samples; stops the
    tree when it passes `limit` bytes (then .exceeded holds the figure)."""

    def __init__(self, proc, limit, interval=0.05):
        self.proc, self.limit, self.interval = proc, limit, interval
        self.samples, self.exceeded = [], None
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    @staticmethod
    def tree_rss(pid):
        total, todo = 0, [pid]
        while todo:
            p = todo.pop()
            try:
                with open(f"/proc/{p}/statm") as f:
                    total += int(f.read().split()[1]) * PAGE
                for task in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{task}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue                                  # a process or thread that has just ended
        return total

    def _poll(self):
        while self.proc.poll() is None:
            rss = self.tree_rss(self.proc.pid)
            self.samples.append((time.time(), rss))
            if rss > self.limit and self.exceeded is None:
                self.exceeded = rss
                self.proc.kill()
            time.sleep(self.interval)

    def window(self, start, end):
        """(peak, peak minus the memory at `start`) of the samples in [start, end]."""
        inside = [rss for t, rss in self.samples if start <= t <= end]
        before = [rss for t, rss in self.samples if t <= start] or inside
        if not inside:
            raise RuntimeError("no memory sample inside a step's train phase: lower MemoryWatch's interval")
        return max(inside), max(inside) - before[-1]


def run_watched(cmd, limit_gib, what):
    """Runs cmd under a MemoryWatch: (stdout + stderr, the watch); exits with the output on failure,
    except for a stop at the memory limit (watch.exceeded set)."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=offline_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        watch = MemoryWatch(proc, limit_gib * GiB)
        proc.wait()
        watch.thread.join()
        log.seek(0)
        output = log.read()
    if proc.returncode and watch.exceeded is None:
        sys.exit(f"{what} failed ({proc.returncode}):\n{output[-4000:]}")
    return output, watch


def run_ours(shape, model_dir, steps, tmp, limit_gib):
    """Per step: rollout, train, sync and total seconds, the passes' positions, and the train phase's memory."""
    s = SHAPES[shape]
    out, notes = os.path.join(tmp, "ours"), os.path.join(tmp, "ours-notes.jsonl")
    for path in (notes, os.path.join(out, "metrics.jsonl")):
        if os.path.exists(path):
            os.remove(path)
    cmd = [sys.executable, "-c", OURS_LAUNCHER, notes, os.path.join(ROOT, "train.py"),
           "--method", "gt", "--preset", s["preset"], "--data", "classroom", "--eval_data", "classroom",
           "--steps", str(steps), "--eval_every", "1000", "--eval_limit", "2" if shape == "real" else "16",
           "--eval_k", "1", "--save_every", "0", "--out", out, "--overwrite", "--seed", str(COMMON["seed"]),
           "--questions_per_step", str(s["questions"]), "--views", s["views"], "--group_size", str(s["group_size"]),
           "--max_response_len", str(s["max_response_len"]), "--temperature", str(COMMON["temperature"]),
           "--lr", str(COMMON["lr"]), "--weight_decay", "0", "--kl_coef", str(COMMON["kl_coef"]),
           "--mini_batches", "1", "--dtype", "float32"]
    if shape == "real":
        cmd += ["--model", model_dir, "--max_prompt_len", "64"]
    output, watch = run_watched(cmd, limit_gib, "train.py")
    if watch.exceeded:
        return {"exceeded": watch.exceeded, "error": output[-1500:]}
    records = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"reward"' in x]
    passes = [json.loads(x) for x in open(notes)]
    if len(records) != steps or len(passes) != steps:
        sys.exit(f"train.py: {len(records)} step records and {len(passes)} train steps noted for {steps} steps")
    steps_out = []
    for r, p in zip(records, passes):
        peak, own = watch.window(*p["window"])
        steps_out.append({"rollout": r["t_rollout"], "train": r["t_train"], "sync": r["t_sync"],
                          "total": r["t_rollout"] + r["t_train"] + r["t_sync"], "reward": r["reward"],
                          "computed": p["computed"] // 2,
                          "response_tokens": p["response_tokens"], "peak": peak, "own": own})
    return {"steps": steps_out, "run_peak": max(rss for _, rss in watch.samples)}


def run_trl(shape, model_dir, steps, tmp, limit_gib, micro_batch, checkpointing, use_vllm=False):
    if not os.path.exists(TRL_PYTHON):
        sys.exit(f"no {TRL_PYTHON}: python3 -m venv bench/.venv-trl && "
                 f"bench/.venv-trl/bin/pip install -r bench/requirements-trl.txt")
    out = os.path.join(tmp, "trl")
    cmd = [TRL_PYTHON, os.path.abspath(__file__), "--trl_worker", out, "--shape", shape, "--model_dir", model_dir,
           "--steps", str(steps), "--trl_micro_batch", str(micro_batch),
           "--response_len", str(SHAPES[shape]["max_response_len"])] + ["--trl_checkpointing"] * checkpointing \
        + ["--trl_vllm"] * use_vllm
    output, watch = run_watched(cmd, limit_gib, "the TRL run")
    if watch.exceeded:
        return {"exceeded": watch.exceeded, "error": output[-1500:]}
    records = [json.loads(x) for x in open(os.path.join(out, "steps.jsonl"))]
    if len(records) != steps:
        sys.exit(f"TRL: {len(records)} step records for {steps} steps")
    for r in records:
        r["peak"], r["own"] = watch.window(*r.pop("window"))
    return {"steps": records, "run_peak": max(rss for _, rss in watch.samples)}


def reload_weights_through_vllm():
    """The one change TRL 1.16 needs to run colocated vLLM on a CPU. Its weight sync calls the vLLM model's
    load_weights one parameter at a time, which vLLM's CPU model refuses once loaded ("'Parameter' object has no
    attribute 'weight_loader'", with vLLM 0.31, the newest TRL 1.16 supports, and 0.32, the project's pin). The
    same (name, tensor) stream goes through vLLM's own reload_weights instead, as rollout.py loads ours."""
    from trl.generation import vllm_generation

    def sync_weights(self):
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._iter_named_params()})
        self.llm.reset_prefix_cache()
    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def trl_worker(out, shape, model_dir, steps, micro_batch, checkpointing, use_vllm=False):
    """One GRPOTrainer run in bench/.venv-trl; a line per step in out/steps.jsonl."""
    import torch
    torch.set_num_threads(threads())
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from harness import answers
    from harness import data
    from harness import world

    s = SHAPES[shape]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode = data.prompt_encoder(tokenizer, classroom=True)
    pairs = data.classroom_pairs("train")
    random.Random(COMMON["seed"]).shuffle(pairs)
    P = s["questions"]
    if steps * P > len(pairs):
        sys.exit(f"{steps} steps need {steps * P} pairs; the classroom has {len(pairs)}")
    views = ("original", "rephrased") if s["views"] == "both" else ("original",)
    rows = []   # a step's prompts in order, originals then rephrasings (the dataset is not shuffled)
    for step in range(steps):
        mine = pairs[step * P:(step + 1) * P]
        rows += [{"prompt": world.format_prompt(q), "answer": p.answer, "question": q}
                 for view in views for p in mine for q in [getattr(p, view)]]
    for r in rows:   # TRL tokenises the text prompt as is: the ids must be ours
        if tokenizer(text=[r["prompt"]])["input_ids"][0] != encode(r["question"]):
            sys.exit(f"TRL's prompt ids differ from data.prompt_encoder's for {r['prompt']!r}")

    now = {}

    def gt_reward(completions, answer, **_):
        out = [float(answers.is_equiv(answers.extract_answer(c), a)) for c, a in zip(completions, answer)]
        now["reward"] = sum(out) / len(out)
        return out

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            result = super()._generate(prompts)
            now["generate"] = now.get("generate", 0.0) + time.perf_counter() - t0
            now["generated_at"] = time.time()
            prompt_ids, completion_ids = result[0], result[1]
            now["rows"] = len(completion_ids)
            # left-padded prompts and right-padded completions, the whole generation batch at one width
            now["computed"] = len(completion_ids) * (max(map(len, prompt_ids)) + max(map(len, completion_ids)))
            now["response_tokens"] = sum(map(len, completion_ids))
            return result

    if use_vllm:
        reload_weights_through_vllm()
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, "steps.jsonl"), "w")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            now.clear()
            now["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            total = time.perf_counter() - now.pop("t0")
            gen = now.pop("generate")
            log.write(json.dumps({"step": state.global_step, "total": total, "rollout": gen, "train": total - gen,
                                  "sync": 0.0, "window": [now.pop("generated_at"), time.time()], **now}) + "\n")
            log.flush()

    batch = len(views) * P * s["group_size"]
    if batch % micro_batch:
        sys.exit(f"--trl_micro_batch {micro_batch} does not divide the batch of {batch}")
    config = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=batch // micro_batch, num_generations=s["group_size"], num_iterations=1,
        max_completion_length=s["max_response_len"], temperature=COMMON["temperature"], top_p=1.0, top_k=0,
        learning_rate=COMMON["lr"], beta=COMMON["kl_coef"], loss_type="dapo", epsilon=0.2, max_grad_norm=1.0,
        weight_decay=0.0, optim="adamw_torch", lr_scheduler_type="cosine", warmup_steps=0.1,
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=checkpointing,
        model_init_kwargs={"dtype": "float32"},
        use_vllm=use_vllm, vllm_mode="colocate", shuffle_dataset=False, logging_steps=1, report_to="none",
        save_strategy="no", eval_strategy="no", seed=COMMON["seed"], dataloader_num_workers=0, disable_tqdm=True)
    trainer = TimedGRPOTrainer(model=model_dir, reward_funcs=gt_reward, args=config, processing_class=tokenizer,
                               train_dataset=Dataset.from_list(rows), callbacks=[StepTimer()])
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every or trainer.ref_model is None:
        sys.exit("TRL would recompute old log-probs or has no reference model: not the setting measured here")
    print(f"trl {trl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    trainer.train()
    log.close()


def median(records, key):
    return statistics.median(r[key] for r in records)


def spread(values):
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}x over {len(values)} pairs)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(SHAPES), default="classroom")
    ap.add_argument("--steps", type=int, default=10, help="training steps of each run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out (default 2)")
    ap.add_argument("--pairs", type=int, default=1,
                    help="runs of each, alternating ours, TRL + vLLM and TRL + generate (default 1)")
    ap.add_argument("--response_len", type=int, help="--shape real: response tokens (default 1024)")
    ap.add_argument("--trl_micro_batch", type=int, help="TRL's rows a pass (default: the whole batch)")
    ap.add_argument("--trl_checkpointing", action="store_true",
                    help="TRL's gradient checkpointing (its own default; on for --shape real)")
    ap.add_argument("--memory_limit_gib", type=float, default=20.0, help="stop a run above this (default 20)")
    ap.add_argument("--matmul_size", type=int, default=2048)
    ap.add_argument("--trl_vllm", action="store_true", help=argparse.SUPPRESS)   # internal: TRL with vLLM
    ap.add_argument("--trl_worker", metavar="OUT", help=argparse.SUPPRESS)   # internal: the TRL run
    ap.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.response_len:
        SHAPES["real"]["max_response_len"] = args.response_len
    s = SHAPES[args.shape]
    batch = (2 if s["views"] == "both" else 1) * s["questions"] * s["group_size"]
    micro_batch = args.trl_micro_batch or batch
    checkpointing = args.trl_checkpointing or args.shape == "real"
    if args.trl_worker:
        return trl_worker(args.trl_worker, args.shape, args.model_dir, args.steps, micro_batch, checkpointing,
                          args.trl_vllm)
    if args.steps <= args.warmup:
        ap.error(f"--steps must exceed --warmup ({args.warmup})")
    import torch
    from harness import world
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = world.base_model_dir()
        if args.shape == "real":
            model_dir = os.path.join(tmp, "model")
            save_real_shape_model(model_dir)
        n_body, n_head = param_counts(model_dir)
        peak = matmul_flops(args.matmul_size)
        runs = {"ours": [], "TRL + vLLM": [], "TRL + generate": []}
        for pair in range(args.pairs):
            for name in runs:
                t0 = time.perf_counter()
                run = run_ours(args.shape, model_dir, args.steps, tmp, args.memory_limit_gib) if name == "ours" \
                    else run_trl(args.shape, model_dir, args.steps, tmp, args.memory_limit_gib, micro_batch,
                                 checkpointing, use_vllm=name == "TRL + vLLM")
                run["seconds"] = time.perf_counter() - t0
                runs[name].append(run)
                if "exceeded" in run:
                    print(f"{name}: stopped at {run['exceeded'] / GiB:.2f} GiB, over --memory_limit_gib "
                          f"{args.memory_limit_gib}; its last output:\n{run['error']}", flush=True)
                else:
                    per = ", ".join(f"{r['rollout']:.2f} + {r['train']:.2f} + {r['sync']:.2f}" for r in run["steps"])
                    print(f"pair {pair + 1}, {name} ({run['seconds']:.0f} s with start-up), per step "
                          f"(rollout + train + sync s): {per}", flush=True)
    if any("exceeded" in run for side in runs.values() for run in side):
        return
    for side in runs.values():
        for run in side:
            for r in run["steps"]:
                r["gflops"] = train_flops(r, n_body, n_head) / r["train"] / 1e9
                r["efficiency"] = r["response_tokens"] / r["computed"]
                r["response_len"] = r["response_tokens"] / batch
    kept = {name: [r for run in side for r in run["steps"][args.warmup:]] for name, side in runs.items()}
    names = list(runs)
    where = "the classroom base model" if args.shape == "classroom" else "bench/scale.py's Qwen3-shaped model"
    print(f"\ntorch {torch.__version__}, {threads()} threads; {where}: {n_body + n_head:,} parameters "
          f"(output layer {n_head:,}, tied to the embedding); "
          f"fp32 {args.matmul_size}^3 matmul: {peak / 1e9:.1f} GFLOP/s")
    print(f"{batch} responses of at most {s['max_response_len']} tokens a step; {args.pairs} run(s) of each, "
          f"{args.steps} steps; medians over steps {args.warmup + 1}-{args.steps} of every run"
          + (f"; TRL: {micro_batch} rows a pass" if micro_batch != batch else "")
          + ("; TRL gradient checkpointing" if checkpointing else ""))
    if args.pairs > 1:
        for trl_name in names[1:]:
            for key, label in (("total", "seconds"), ("train", "train s"), ("rollout", "rollout s")):
                ratios = [median(t["steps"][args.warmup:], key) / median(o["steps"][args.warmup:], key)
                          for o, t in zip(runs["ours"], runs[trl_name])]
                print(f"{trl_name} / ours, {label}, pair by pair: " + ", ".join(f"{x:.2f}x" for x in ratios)
                      + f": median {spread(ratios)}")
    print("| per step | " + " | ".join(names) + " | " + " | ".join(f"{n} / ours" for n in names[1:]) + " |")
    print("|---" * (2 * len(names)) + "|")

    def row(label, values, fmt="{:.3f}", ratio=True):
        ratios = [f"{v / values[0]:.2f}x" if ratio and values[0] and v else "-" for v in values[1:]]
        print(f"| {label} | " + " | ".join(fmt.format(v) for v in values) + " | " + " | ".join(ratios) + " |")
    for label, key in (("seconds", "total"), ("rollout s (TRL + vLLM's holds its weight sync)", "rollout"),
                       ("train s", "train"), ("weight sync s", "sync")):
        row(label, [median(kept[n], key) for n in names])
    row("train GFLOP/s", [median(kept[n], "gflops") for n in names], "{:.2f}")
    print("| train, % of matmul | " + " | ".join(f"{100 * median(kept[n], 'gflops') * 1e9 / peak:.1f}%"
                                                for n in names) + " |" + " |" * (len(names) - 1))
    for label, key in (("train-phase peak GiB (the process)", "peak"), ("train-phase memory GiB (its own)", "own")):
        row(label, [max(r[key] for r in kept[n]) / GiB for n in names], "{:.2f}")
    row("whole run's peak GiB", [max(run["run_peak"] for run in runs[n]) / GiB for n in names], "{:.2f}")
    for label, key, fmt in (("padding efficiency", "efficiency", "{:.2f}"),
                            ("response tokens", "response_len", "{:.1f}"), ("reward", "reward", "{:.3f}")):
        row(label, [median(kept[n], key) for n in names], fmt, ratio=False)


if __name__ == "__main__":
    main()
