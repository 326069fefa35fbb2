"""One vLLM engine per rank, as train.py builds it, each sampling its own question.

    torchrun --nproc_per_node=N tests/engine_ranks_worker.py MODEL_DIR OUT.json

Every rank records where its engine's worker runs (vLLM's local rank and device) beside its own
LOCAL_RANK, and the responses to the rank's own question (question `rank`); rank 0 writes every
rank's record to OUT.json. test_rollout compares them with the rank's place, and with what one engine in its own
process samples for both questions (`sample`).
"""
import json
import os
import sys

import torch.distributed as dist
from transformers import AutoTokenizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from config import PRESETS  # noqa: E402
from harness import world  # noqa: E402
from rollout import make_engine, request_seed  # noqa: E402
from harness.sharding import init_distributed  # noqa: E402


def placement(worker):
    """Runs in the vLLM worker: its local rank and device."""
    return worker.local_rank, str(worker.device)


def engine_for(model_dir):
    return make_engine("vllm", model_dir, max_prompt_len=64, max_response_len=8, **{name: PRESETS["classroom"][name]
                       for name in ("dtype", "cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib")})


def sample(engine, model_dir, questions):
    """The token ids of 2 responses to each of the test split's questions numbered in `questions`, each by the
    seed a run draws it with: what any rank holding those questions samples."""
    split = world.make_split("test")
    tok = AutoTokenizer.from_pretrained(model_dir)
    groups = engine.generate([tok(world.format_prompt(split[q].original))["input_ids"] for q in questions], n=2,
                             temperature=1.0, max_tokens=8, seeds=[request_seed(0, "policy", 1, q) for q in questions])
    return [[s.token_ids for s in g] for g in groups]


if __name__ == "__main__":
    model_dir, out = sys.argv[1:]
    rank, world_size, _ = init_distributed()
    engine = engine_for(model_dir)
    local_rank, device = engine.llm.collective_rpc(placement)[0]
    mine = [q for q in range(2) if q % world_size == rank]
    record = {"rank": rank, "LOCAL_RANK": int(os.environ["LOCAL_RANK"]), "engine_local_rank": local_rank,
              "engine_device": device, "responses": sample(engine, model_dir, mine)}
    records = [None] * world_size
    dist.all_gather_object(records, record)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(records, f)
    dist.barrier()
    engine.close()             # the external launcher's engine ends the process group with it
