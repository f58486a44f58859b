#!/usr/bin/env bash
# Every GPU benchmark of issue 8 in one go (one device call): refit (2 GPUs, NCCL), decode, train step.
# JSON results and the log go to $OUT (default ./gpu-bench-out). `bench/gpu/run_all.sh --tiny` is the
# CPU smoke run. On the H200 machine:
#   set -o pipefail; bash bench/gpu/run_all.sh 2>&1 | tee $OUT/log.txt
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TINY=${1:-}
# NVLink multicast stays off on the shared hosts (device KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=trainer${PYTHONPATH:+:$PYTHONPATH}
status=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nvidia-smi topo -m || true
fi
date -u +"start %FT%TZ"
run() {  # name, timeout seconds, script
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  local t0=$SECONDS
  timeout "$limit" "$PY" "$@" --out "$OUT/$name.json" $TINY || { echo "!!! $name failed ($?)"; status=1; }
  echo "=== $name took $((SECONDS - t0)) s"
}
run refit 100 bench/gpu/refit.py
run decode 220 bench/gpu/decode.py --extra-batches 64
run train_step 200 bench/gpu/train_step.py
# Same recipes at twice the micro-batch (the optimizer's fixed cost spread over more tokens).
[ -z "$TINY" ] && run train_step_b32 120 bench/gpu/train_step.py --batch 32 --variants compiled
date -u +"end %FT%TZ"
exit $status
