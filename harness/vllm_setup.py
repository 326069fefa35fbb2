"""vLLM in this process (rollout.VLLMEngine): its environment (set at import, before vLLM's), arguments, start, quiet"""
import logging
import os

from harness.sharding import init_distributed

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM's INFO lines at every weight load break the progress bar. Read at vLLM's import, so set first.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# vLLM's messages that ask nothing of this project's users, hidden (`quiet_vllm`), each with why.
QUIET_VLLM = {
    "Triton is installed, but doesn't include CPU backend": "the CPU engine runs without Triton",
    "Triton is not installed. triton-cpu is expected": "the same",
    "Model Runner V2 requires Triton": "the same: the V1 runner is vLLM's CPU runner",
    "The global random seed is set to": "no request draws from the global random state: each has its own seed",
    "does not officially support disabling chunked prefill": "off on a CPU, on purpose (engine_arguments)",
    "Enforce eager set": "eager execution on a CPU, on purpose (engine_arguments)",
    "Inductor compilation was disabled": "the same",
    "Reset SSM cache type": "these models have no SSM layers",
    "is not found in LD_PRELOAD": "advice on preloaded allocators for speed, not a fault",
    "doesn't allow to use `torch.set_num_threads`": "vLLM's CPU worker binds its threads once, as it starts",
    "Unknown vLLM environment variable detected: VLLM_DIST_IDENT": "set by vLLM's CPU worker, inherited by a child",
    "RotaryEmbedding: Failed to load weights": "at every load: the rotary table comes from the config, never loaded",
}


def quiet_vllm():
    """Hide QUIET_VLLM's warnings by making each a DEBUG record as it is created (a log record factory: vLLM replaces
    its handlers and their filters when an engine starts); VLLM_LOGGING_LEVEL=DEBUG shows them."""
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


# vLLM's batch limits on a GPU: one rank's largest request (a two-view step's 2 x 16 x 8 sequences at 8 ranks), and
# prefill chunks that leave the KV cache its memory (bench/memory.md, the memory account). A CPU keeps vLLM's defaults.
GPU_MAX_NUM_SEQS = 256
GPU_MAX_NUM_BATCHED_TOKENS = 8192


def engine_arguments(model_dir, max_prompt_len, max_response_len, dtype, on_gpu, gpu_memory_utilization,
                     cpu_kv_cache_gib):
    """The arguments of vLLM's `LLM`, the one place where the CPU and the GPU engine differ: a GPU engine sleeps
    while the trainer trains; a CPU engine has a fixed KV cache (VLLM_CPU_KVCACHE_SPACE overrides it), no sleep mode
    and no chunked prefill: vLLM rewinds a split prompt's random generator, which a CPU's cannot."""
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


def start_llm(model_dir, max_prompt_len, max_response_len, dtype, gpu_memory_utilization, cpu_kv_cache_gib):
    """This rank's vLLM engine on its device, in the trainer's process group (one rank unless torchrun started more)."""
    quiet_vllm()
    from vllm import LLM
    rank, _, device = init_distributed()
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(device.index if device.type == "cuda" else os.environ.get("LOCAL_RANK", 0))
    return LLM(**engine_arguments(model_dir, max_prompt_len, max_response_len, dtype, device.type == "cuda",
                                  gpu_memory_utilization, cpu_kv_cache_gib))
