#!/usr/bin/env bash
# The seed path's checks on one GPU, within 8 minutes, each part in a process of its own: the rollout engine
# alone (where it runs, its KV cache, vLLM's model runner, what the weight check reads back, greedy responses
# bit for bit the same after a sleep at level 2, a wake-up and a reload of the same weights, a load with a
# tensor left out reported), then a few bf16 steps of coreward1 and coreward2 at the official preset's memory
# settings, at a small scale: peak memory, step times, the bf16 sampler gap and the weight sync's verdict
# (bench/gpu_check.py says what each is). Needs torch and transformers; uses vLLM where it is installed,
# transformers' generate otherwise. Arguments go to bench/gpu_check.py (--steps N, --runner v1|v2).
#     bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
timeout 480 python bench/gpu_check.py "$@"
