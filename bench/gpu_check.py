"""The first check on a GPU, one command within six minutes (bench/gpu_check.sh runs it): the classroom
trained on the GPU in bf16 and resumed from a checkpoint, then bench/gpu_probe.py at Qwen3-4B-Base's
shape with the time that is left.

    bash bench/gpu_check.sh                  # one GPU, within --budget_s (360 s)
    bash bench/gpu_check.sh --tiny           # the same parts on a CPU, small: a dry run

Each part is a process of its own (this file's interpreter, with -X faulthandler), announced by a
timestamped line (seconds since this process started) and summed up by one; its output is shown as it
comes, each line with the time it came, so that a part that stops shows where. The parts:

1. engine, only where vLLM is installed: the rollout engine alone, in bf16 at --gpu_memory_utilization
   0.3: which GPU its worker is on, its KV cache in tokens, which model runner vLLM took, what the
   weight check reads back; greedy responses to 16 classroom questions; a sleep (level 2) and what it
   freed; the unchanged weights loaded again (which wakes it); the same requests must give the same
   tokens and log-probs bit for bit; a load with one tensor left out must be reported. --runner v1|v2
   sets VLLM_USE_V2_MODEL_RUNNER for it (vLLM 0.32 takes Model Runner V2 on CUDA where Triton is
   installed, unless the configuration asks for a feature V2 lacks).
2. straight: train.py, coreward1 on the classroom world, on the GPU in bf16 with transformers'
   engine (--backend hf: the budget is set for it, and it runs where vLLM is not installed), 3 steps,
   a checkpoint at each (--save_every 1 --keep_last 0), greedy evaluations at steps 0 and 3 on 32
   questions (--eval_k 0).
3. resumed: the straight run's checkpoint of step 1 and its metrics.jsonl copied into a folder of
   their own, and `train.py --out THERE --resume`: steps 2 and 3 again, from the checkpoint, with a
   fresh process and engine.
4. compare (here): the resumed run's records after step 1, timings aside, and its final weights
   against the straight run's, as tests/test_resume.py compares them on a CPU: equal bit for bit,
   or within that test's tolerances (1e-6 relative on a record's floats, 1e-6 on a weight), or not,
   the differences named. On a CPU they are equal bit for bit; on a GPU, kernels that add in a
   varying order (atomics: attention's backward among them) may leave the last bits apart.
5. probe: bench/gpu_probe.py, with --budget_s set so that it ends before this command's budget.

The budget: the command's end is --budget_s (BUDGET_S) after this process started. A part still
running at its limit (on a GPU the classroom runs' is STAGE_LIMIT_S each; the probe's, and every
part's with --tiny, is the command's end) is sent SIGABRT, on which faulthandler prints every
thread's stack (where it hung), and is killed KILL_AFTER_S later.

Everything printed also goes to gpu_check.log, the verdicts to gpu_check.json, the probe's record to
gpu_probe.json and the two runs' metrics to straight_metrics.jsonl and resumed_metrics.jsonl: five
files in $OUT when it is set, else in --out, else in a temporary folder (named at the start).

--tiny: on a CPU, the classroom runs at 4 questions a step, groups of 4 and 8 evaluation questions,
and the probe at its tiny shape (its --tiny), within TINY_BUDGET_S.
"""
import time

START = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNERS = {"v1": "0", "v2": "1"}          # --runner: VLLM_USE_V2_MODEL_RUNNER
BUDGET_S, TINY_BUDGET_S = 360.0, 1200.0   # the whole command's seconds, by default
STAGE_LIMIT_S = 150.0                     # each classroom run's (and the engine part's) limit on a GPU
KILL_AFTER_S = 10.0                       # after the SIGABRT of a part past its limit
END_MARGIN_S = 5.0                        # the command's end, less this, is when the probe is stopped
STEPS, RESUME_FROM = 3, 1
CLASSROOM = ["--method", "coreward1", "--preset", "classroom", "--backend", "hf", "--dtype", "bfloat16",
             "--steps", str(STEPS), "--save_every", "1", "--keep_last", "0", "--eval_k", "0"]
CLASSROOM_SIZE = {False: ["--eval_limit", "32"],                                  # on a GPU: 16 questions a step
                  True: ["--eval_limit", "8", "--questions_per_step", "4", "--group_size", "4"]}      # --tiny
RECORD_REL, WEIGHT_ABS = 1e-6, 1e-6       # tests/test_resume.py's tolerances


class Console:
    """Prints and keeps in the log file, each line after the seconds since the start."""
    def __init__(self, path):
        self.file = open(path, "a")
        self.lock = threading.Lock()

    def __call__(self, text):
        line = f"[{time.perf_counter() - START:7.1f} s] {text}"
        with self.lock:
            print(line, flush=True)
            self.file.write(line + "\n")
            self.file.flush()


def run_part(say, name, cmd, limit_s, env=None):
    """Run `cmd` (a process of its own, in a session of its own), its output shown line by line as it comes;
    past `limit_s` seconds SIGABRT (faulthandler's stacks), then SIGKILL to its process group KILL_AFTER_S later.
    Returns (exit status, or None when it was stopped; seconds; its output's lines)."""
    say(f"== {name}: {' '.join(cmd)} (at most {limit_s:.0f} s)")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})})
    lines = []

    def read():
        for raw in proc.stdout:
            for part in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if part.strip():
                    lines.append(part)
                    say(f"  {name} | {part}")
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=max(1.0, limit_s))
    except subprocess.TimeoutExpired:
        say(f"{name}: still running after {limit_s:.0f} s: SIGABRT (its stacks follow), then SIGKILL")
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        status = None
    reader.join(timeout=KILL_AFTER_S)
    seconds = time.perf_counter() - t0
    say(f"== {name}: " + ("stopped at its limit" if status is None else f"exit status {status}") +
        f" after {seconds:.1f} s")
    return status, seconds, lines


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def compare_runs(resumed, straight, after_step):
    """The resumed run against the straight one, from `after_step` on: its records (timings aside) and its
    final weights; {"verdict": "bitwise" | "within tolerance" | "differs", ...}."""
    import torch
    from safetensors.torch import load_file
    a = [r for r in records(resumed) if r["step"] > after_step]
    b = [r for r in records(straight) if r["step"] > after_step]
    differences, largest_rel, bitwise = [], 0.0, True
    if [(r["step"], "reward" in r) for r in a] != [(r["step"], "reward" in r) for r in b]:
        differences.append(f"the records' steps: {[r['step'] for r in a]} resumed, {[r['step'] for r in b]} straight")
    for x, y in zip(a, b):
        x, y = ({k: v for k, v in r.items() if not k.startswith("t_")} for r in (x, y))
        for key in sorted(set(x) | set(y)):
            if key not in x or key not in y:
                differences.append(f"step {y['step']}: {key} in one record only")
            elif x[key] != y[key]:
                bitwise = False
                if isinstance(x[key], float) and isinstance(y[key], float):
                    rel = abs(x[key] - y[key]) / max(abs(y[key]), 1e-12)
                    largest_rel = max(largest_rel, rel)
                    if rel <= RECORD_REL:
                        continue
                differences.append(f"step {y['step']}: {key} {x[key]!r} resumed, {y[key]!r} straight")
    wa, wb = (load_file(os.path.join(out, "final", "model.safetensors")) for out in (resumed, straight))
    if sorted(wa) != sorted(wb):
        differences.append("the final models hold other tensors")
    common = sorted(set(wa) & set(wb))
    weights_max = max((wa[k].double() - wb[k].double()).abs().max().item() for k in common) if common else None
    weights_bitwise = all(torch.equal(wa[k], wb[k]) for k in common)
    if weights_max is not None and weights_max > WEIGHT_ABS:
        differences.append(f"the final weights differ by up to {weights_max:.3g}")
    verdict = "differs" if differences else "bitwise" if bitwise and weights_bitwise else "within tolerance"
    return {"verdict": verdict, "records": len(a), "records_bitwise": bitwise, "largest_relative": largest_rel,
            "weights_bitwise": weights_bitwise, "weights_max_abs": weights_max, "tensors": len(common),
            "differences": differences}


def resume_folder(straight, folder, step):
    """A run folder holding the straight run's checkpoint of `step` and its metrics.jsonl, as that run left them
    then (a resume drops the records after its checkpoint's step)."""
    os.makedirs(os.path.join(folder, "checkpoints"))
    shutil.copytree(os.path.join(straight, "checkpoints", f"step_{step}"),
                    os.path.join(folder, "checkpoints", f"step_{step}"))
    shutil.copy(os.path.join(straight, "metrics.jsonl"), os.path.join(folder, "metrics.jsonl"))


def _runner_of(worker):
    """Runs in the vLLM worker: the model runner's class, and whether the worker took Model Runner V2."""
    cls = type(worker.model_runner)
    return f"{cls.__module__}.{cls.__qualname__}", getattr(worker, "use_v2_model_runner", None)


def engine_checks(backend):
    """The engine part (the module's docstring). Returns what failed, in words ([] when nothing did)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    sys.path.insert(0, ROOT)
    from harness import world
    from rollout import make_engine
    gib = lambda n: f"{n / 2**30:.2f} GiB"
    on_gpu = torch.cuda.is_available()
    dtype = "bfloat16" if on_gpu else "float32"
    model_dir = world.base_model_dir()
    engine = make_engine(backend, model_dir, 64, 48, dtype=dtype, cpu_kv_cache_gib=0.25, gpu_memory_utilization=0.3,
                         hf_kv_budget_gib=0.0)
    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).state_dict()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok(world.format_prompt(p.original))["input_ids"] for p in world.make_split("test")[:16]]
    failed, sleeps = [], getattr(engine, "sleeps", False)        # vLLM's sleep mode: on a GPU
    print(f"the {backend} engine ({dtype}, {'sleeps' if sleeps else 'no sleep'})")
    if backend == "vllm":
        where = engine.llm.collective_rpc(lambda worker: (worker.local_rank, str(worker.device)))[0]
        cache = engine.llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks or 0
        print(f"worker: local rank {where[0]} on {where[1]} (LOCAL_RANK {os.environ.get('LOCAL_RANK')}); KV cache "
              f"{blocks} blocks of {cache.block_size} = {blocks * cache.block_size:,} tokens")
        runner, v2 = engine.llm.collective_rpc(_runner_of)[0]
        print(f"model runner: {runner} (Model Runner V2: {v2}; VLLM_USE_V2_MODEL_RUNNER "
              f"{os.environ.get('VLLM_USE_V2_MODEL_RUNNER', 'unset')})")
        print(engine.check.readback.report())
    greedy = lambda: [(s.token_ids, s.logprobs) for group in engine.generate(prompts, n=1, temperature=0.0,
                                                                             max_tokens=48) for s in group]
    before = greedy()
    free = torch.cuda.mem_get_info()[0] if on_gpu else None
    engine.sleep()
    if sleeps:
        print(f"asleep (level 2): {gib(torch.cuda.mem_get_info()[0] - free)} freed")
    whole = engine.load_weights(state.items())
    print(f"the unchanged weights loaded again{', which woke the engine' if sleeps else ''}: {whole or 'verified'}")
    after = greedy()
    same = after == before
    tokens = sum(len(ids) for ids, _ in before)
    print(f"greedy before {'the sleep and after the' if sleeps else 'and after the'} reload: {len(before)} responses, "
          f"{tokens} tokens: " + ("tokens and log-probs identical" if same else
                                  f"{sum(a != b for a, b in zip(before, after))} responses differ"))
    dropped = "model.layers.0.mlp.up_proj.weight"
    partial = engine.load_weights((n, t) for n, t in state.items() if n != dropped)
    print(f"a load without {dropped}: {partial}")
    engine.close()
    failed += [f"the whole load: {whole}"] * bool(whole)
    failed += ["greedy responses changed over sleep, wake-up and reload"] * (not same)
    failed += [f"the load without {dropped} was not reported"] * (not (partial and dropped in partial))
    return failed


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a dry run on a CPU: small classroom runs, the tiny probe")
    ap.add_argument("--budget_s", type=float, help=f"the whole command's seconds (default {BUDGET_S:.0f}; --tiny: "
                                                   f"{TINY_BUDGET_S:.0f}, a CPU's speed varies)")
    ap.add_argument("--runner", choices=sorted(RUNNERS),
                    help="vLLM's model runner for the engine part (VLLM_USE_V2_MODEL_RUNNER); default: vLLM's choice")
    ap.add_argument("--out", help="the folder of the logs and records, when OUT is not set")
    ap.add_argument("--child", choices=("engine",), help="(a part) run the engine part here")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.child == "engine":
        failed = engine_checks("vllm")
        if failed:
            raise SystemExit("the engine check failed: " + "; ".join(failed))
        return 0
    if args.budget_s is None:
        args.budget_s = TINY_BUDGET_S if args.tiny else BUDGET_S
    stage_limit = args.budget_s if args.tiny else STAGE_LIMIT_S        # --tiny: the budget alone
    out = os.environ.get("OUT") or args.out or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(out, exist_ok=True)
    say = Console(os.path.join(out, "gpu_check.log"))
    end = args.budget_s - END_MARGIN_S
    left = lambda: end - (time.perf_counter() - START)
    python = [sys.executable, "-u", "-X", "faulthandler"]
    vllm = importlib.util.find_spec("vllm") is not None
    say(f"gpu_check: {sys.executable} (Python {sys.version.split()[0]}); vLLM {'installed' if vllm else 'absent'}; "
        f"budget {args.budget_s:.0f} s; logs and records in {out}")
    say("importing torch (is there a GPU?)")
    import torch
    cuda = torch.cuda.is_available()
    say(f"torch {torch.__version__} (CUDA {torch.version.cuda}); a GPU: {cuda}")
    if not cuda and not args.tiny:
        say("bench/gpu_check.py needs a GPU (torch.cuda.is_available() is False); --tiny runs a dry run on a CPU")
        return 2
    summary = {"tiny": args.tiny, "budget_s": args.budget_s, "python": sys.version.split()[0], "torch": torch.__version__,
               "cuda": cuda, "vllm": vllm, "parts": {}}
    failed = []

    def part(name, cmd, limit_s, env=None):
        status, seconds, lines = run_part(say, name, cmd, min(limit_s, left()), env)
        summary["parts"][name] = {"status": status, "seconds": seconds}
        if status != 0:
            failed.append(f"{name} ({'stopped at its limit' if status is None else f'exit status {status}'})")
        with open(os.path.join(out, "gpu_check.json"), "w") as f:
            json.dump(summary, f, indent=1)
        return status == 0, lines

    if vllm:
        env = {"VLLM_USE_V2_MODEL_RUNNER": RUNNERS[args.runner]} if args.runner else {}
        part("engine", python + [os.path.abspath(__file__), "--child", "engine"], stage_limit, env)
    with tempfile.TemporaryDirectory(prefix="gpu_check-runs-") as runs:
        straight, resumed = os.path.join(runs, "straight"), os.path.join(runs, "resumed")
        flags = CLASSROOM + CLASSROOM_SIZE[args.tiny]
        ok, _ = part("straight", python + [os.path.join(ROOT, "train.py"), "--out", straight] + flags, stage_limit)
        if ok:
            shutil.copy(os.path.join(straight, "metrics.jsonl"), os.path.join(out, "straight_metrics.jsonl"))
            resume_folder(straight, resumed, RESUME_FROM)
            ok, lines = part("resumed", python + [os.path.join(ROOT, "train.py"), "--out", resumed, "--resume"],
                             stage_limit)
            if ok:
                shutil.copy(os.path.join(resumed, "metrics.jsonl"), os.path.join(out, "resumed_metrics.jsonl"))
                said = f"resumed from {resumed}/checkpoints/step_{RESUME_FROM} (step {RESUME_FROM} of {STEPS})"
                say("== compare: the resumed run's steps after step 1 and final weights against the straight run's")
                result = compare_runs(resumed, straight, RESUME_FROM)
                result["resumed_from_the_checkpoint"] = any(said in line for line in lines)
                summary["resume"] = result
                in_records = "bit for bit" if result["records_bitwise"] else \
                    f"largest relative difference {result['largest_relative']:.3g}"
                in_weights = "bit for bit" if result["weights_bitwise"] else \
                    f"largest difference {result['weights_max_abs']:.3g}"
                say(f"compare: {result['verdict']}: {result['records']} records ({in_records}), {result['tensors']} "
                    f"final tensors ({in_weights}); the resumed run said it resumed from step {RESUME_FROM}: "
                    f"{result['resumed_from_the_checkpoint']}")
                for line in result["differences"]:
                    say(f"  differs: {line}")
                if result["verdict"] == "differs" or not result["resumed_from_the_checkpoint"]:
                    failed.append("compare")
    # the probe's budget counts from its own start, and leaves it time to start and to finish its last phase
    probe = python + [os.path.join(ROOT, "bench", "gpu_probe.py"), "--budget_s", f"{left() - 10.0:.0f}"]
    probe += ["--tiny"] * args.tiny + ([] if os.environ.get("OUT") else ["--out", os.path.join(out, "gpu_probe.json")])
    part("probe", probe, left())
    summary["failed"] = failed
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    say(("failed: " + ", ".join(failed)) if failed else "every part passed")
    say(f"{time.perf_counter() - START:.0f} s in all; logs and records in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
