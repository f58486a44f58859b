#!/usr/bin/env bash
# Issue 46's ablation: sync against async-in-order on the real case of sample_efficiency.py (the
# warm-started tiny Qwen2, 30 steps, 5 seeds), once per condition, each condition one set of
# `--set` overrides of the trainer section. Runs on the device machine's 16 CPU cores (the GPU is
# not used): it needs Ray and boto3 importable, which travel as files (docs/benchmarks.md,
# "Issue 46's ablation: the script, not yet run"):
#
#   bash shared/gpu/wheelhouse-ray.sh .wh/ray      # here, once; boto3 as an unpacked site, see docs
#   OUT=/tmp/out bash bench/models/ablate_async.sh "base:" "kv-reset:generation.recomputeKVCacheAfterWeightUpdates=true"
#
# Each condition prints its runs' JSON lines (held-out curve, the per-step off-policy figures of
# learning_seeds.OFF_POLICY_FIGURES) and its table to $OUT/<name>.txt; the checkpoint is made once
# under $MODELS (kept in $OUT as a tarball, so a second call can carry it instead of remaking it).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
MODELS=${MODELS:-/tmp/models}
SEEDS=${SEEDS:-1-5}
PARALLEL=${PARALLEL:-10}
CASES=${CASES:-real}
MODES=${MODES:-sync async-in-order}  # a condition that cannot change sync (a loss knob on stale data) may skip it
PY=${PYTHON:-python3}  # here: PYTHON=.venv/bin/python, whose Ray and boto3 are installed
mkdir -p "$OUT" "$MODELS"
if [ -d .wh/ray/wheels ] && ! "$PY" -c "import ray" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wh/ray/wheels/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD/.wh/boto-site:$PWD/trainer:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
export RAY_USAGE_STATS_ENABLED=0
date -u +"start %FT%TZ, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
if [ -f .wh/models.tar.gz ] && [ ! -d "$MODELS/tiny-qwen2" ]; then
  tar -xzf .wh/models.tar.gz -C "$MODELS"
fi
if [ ! -d "$MODELS/tiny-qwen2" ]; then
  "$PY" -m asyncgrpo_cli.main make-tiny-checkpoint "$MODELS/tiny-qwen2" --hidden-size 128 --heads 4 \
    --intermediate-size 512 --warm-start | tail -1
  tar -czf "$OUT/models.tar.gz" -C "$MODELS" tiny-qwen2
fi
if [[ " $CASES " == *" low-start "* ]] && [ ! -d "$MODELS/tiny-qwen2-low-start" ]; then
  "$PY" -m asyncgrpo_cli.main make-tiny-checkpoint "$MODELS/tiny-qwen2-low-start" --hidden-size 128 \
    --heads 4 --intermediate-size 512 --warm-start --warm-start-steps 80 | tail -1
fi
if [[ " $CASES " == *" calculator "* ]]; then
  if [ -f .wh/calc.tar.gz ] && [ ! -d "$MODELS/tiny-calc" ]; then tar -xzf .wh/calc.tar.gz -C "$MODELS"; fi
  if [ ! -d "$MODELS/tiny-calc" ]; then
    "$PY" -m asyncgrpo_cli.main make-tiny-checkpoint "$MODELS/tiny-calc" --family qwen2 --hidden-size 128 \
      --heads 4 --intermediate-size 512 --warm-start calculator | tail -1
  fi
fi
for condition in "$@"; do
  name=${condition%%:*}
  sets=()
  IFS=',' read -ra assignments <<< "${condition#*:}"
  for a in "${assignments[@]}"; do [ -n "$a" ] && sets+=(--set "$a"); done
  echo "== $name: ${sets[*]:-(defaults)}"
  "$PY" bench/models/sample_efficiency.py --models "$MODELS" --seeds "$SEEDS" --parallel "$PARALLEL" \
    --timeout 400 --cases $CASES --modes $MODES "${sets[@]}" > "$OUT/$name.txt" 2>&1
  grep -E "^\| (sync|async)|FAILED|done after" "$OUT/$name.txt"
done
date -u +"end %FT%TZ, load $(cut -d' ' -f1-3 /proc/loadavg)"
