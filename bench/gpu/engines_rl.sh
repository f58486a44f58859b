#!/usr/bin/env bash
# Issue 33 item 2 on one GPU: the CUDA-graph torch engine and vLLM 0.26.0 on the workload RL produces
# (bench/gpu/rl_engines.py: Qwen2.5-0.5B's shape with random weights, steps of 256 and 1024 samples,
# GRPO groups of 8, prompts of 16-512 and responses of 16-1024 tokens, lognormal). ENGINES picks and
# orders the engine configurations (each vLLM one is an engine start, ~1-2 minutes); what does not
# finish inside LIMIT seconds is left out. REPEATS timed runs of each workload (default 1). Results
# (JSON + log) go to $OUT. Needs vLLM importable
# (docs/guides/gpu.md, "Reproduce"); no Ray.
#   set -o pipefail; OUT=/tmp/out bash bench/gpu/engines_rl.sh 2>&1 | tee $OUT/log.txt
source "$(dirname "$0")/common.sh"
ENGINES=${ENGINES:-torch-256,vllm-trainer,vllm-seqs512-mnbt16k,torch-512,vllm-seqs1024-mnbt16k-cg1024,vllm-no-async-scheduling}
run engines-rl "${LIMIT:-560}" "$PY" bench/gpu/rl_engines.py --shape qwen2.5-0.5b --root "$ROOT" --engines "$ENGINES" \
  --groups 32,128 --repeats "${REPEATS:-1}" --out "$OUT/rl_engines_qwen2.5-0.5b.json"
date -u +"end %FT%TZ"
exit $status
