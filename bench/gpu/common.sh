# Sourced by the GPU benchmark scripts (peers.sh, real_models.sh, trainer.sh, fsdp.sh, vllm_sleep.sh):
# the repository root as working folder, where results go ($OUT) and checkpoints are made ($ROOT),
# the environment every device call needs (NVLink multicast off: KINDS.md), the machine's header,
# `run` (one timed part; a failure marks the script failed and the next part still runs) and
# `checkpoint` (a random-weight checkpoint at a named shape, made once under $ROOT).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-gpu-bench-out}
ROOT=${ROOT:-/tmp/asyncgrpo-bench-checkpoints}
mkdir -p "$OUT" "$ROOT"
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=trainer:operator:.:bench/gpu${PYTHONPATH:+:$PYTHONPATH}
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
date -u +"start %FT%TZ"
run() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  local t0=$SECONDS
  timeout "$limit" "$@" || { echo "!!! $name failed ($?)"; status=1; }
  echo "=== $name took $((SECONDS - t0)) s"
}
checkpoint() {  # shape -> path (made once)
  "$PY" -c "import sys; from pathlib import Path; from vllm_vs_torch import checkpoint; \
print(checkpoint(sys.argv[1], Path(sys.argv[2]), 'bfloat16'))" "$1" "$ROOT" | tail -1
}
