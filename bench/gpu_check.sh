#!/usr/bin/env bash
# The first check on a GPU, one command within 6 minutes: the classroom trained on the GPU in bf16 and resumed
# from a checkpoint, then bench/gpu_probe.py at Qwen3-4B-Base's shape (bench/gpu_check.py says what each part is
# and prints). $PYTHON is the interpreter (default python3); arguments go to bench/gpu_check.py (--tiny: a dry
# run on a CPU; --budget_s; --runner v1|v2 where vLLM is installed). Logs and records go to $OUT when it is set.
#     bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
echo "[$(date -u +%Y-%m-%dT%H:%M:%SZ)] bench/gpu_check.sh: $PYTHON is $(command -v "$PYTHON" || echo 'not found')"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec "$PYTHON" -u -X faulthandler bench/gpu_check.py "$@"
