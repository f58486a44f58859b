#!/usr/bin/env bash
# Issue 46: which importance weighting of stale samples learns fastest on both tasks that disagree
# (docs/benchmarks.md, "Issue 46: which weighting"): the calculator tool task, where weighting
# stale samples helped one seed, and the real case, where it halved the learning speed. Three
# ablate_async.sh sweeps at once on the device machine's 16 CPU cores (the GPU is not used), 5 seeds
# each; run with the files ablate_async.sh says travel beside it, and .wh/calc.tar.gz (the guide's
# calculator warm start, `tar -czf .wh/calc.tar.gz -C DIR tiny-calc`):
#
#   OUT=/tmp/out bash bench/models/ablate_is_variants.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wh/ray/wheels/*.whl
export PYTHON=python3 SEEDS=${SEEDS:-1-5}
ablate=bench/models/ablate_async.sh
icepop="icepop05:loss.truncatedImportanceSamplingType=icepop,loss.truncatedImportanceSamplingRatioMin=0.5"
seqmask="seqmask05:loss.truncatedImportanceSamplingType=seq-mask-tis,loss.truncatedImportanceSamplingRatioMin=0.5"
OUT=$OUT/calc-a MODELS=/tmp/m1 CASES=calculator PARALLEL=5 bash $ablate \
  "base:" "unweighted:loss.importanceSamplingOnStaleData=false" > "$OUT/calc-a.log" 2>&1 &
OUT=$OUT/calc-b MODELS=/tmp/m2 CASES=calculator PARALLEL=5 MODES=async-in-order bash $ablate \
  "tis05:loss.truncatedImportanceSamplingRatioMin=0.5" "$icepop" "$seqmask" > "$OUT/calc-b.log" 2>&1 &
OUT=$OUT/real MODELS=/tmp/m3 CASES=real PARALLEL=5 MODES=async-in-order bash $ablate \
  "$icepop" "$seqmask" > "$OUT/real.log" 2>&1 &
wait
tail -n 40 "$OUT"/*.log
