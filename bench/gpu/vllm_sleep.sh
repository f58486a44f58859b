#!/usr/bin/env bash
# generation.sleepWhileTraining on one H200 (issue 30 item 4), in parts (PARTS, default all three; on a
# fresh machine one part per 10-minute device call, in the same warm window). Results (JSON + log)
# go to $OUT. Needs vLLM 0.26.0 and Ray importable (docs/guides/gpu.md, "Reproduce"):
#   test      tests/trainer/test_vllm_sleep.py: a sleeping engine frees its KV cache and wakes with its
#      weights (the module is skipped without CUDA)
#   awake, sleeping  the whole job, vLLM colocated with the torch policy at Qwen2.5-0.5B's shape (random weights,
#      bf16), sync mode, without and then with sleepWhileTraining: samples/s and the GPU's peak memory
#   set -o pipefail; OUT=/tmp/out bash bench/gpu/vllm_sleep.sh 2>&1 | tee $OUT/log.txt
source "$(dirname "$0")/common.sh"
PARTS=${PARTS:-test awake sleeping}
[[ " $PARTS " == *" test "* ]] && run test-vllm-sleep 200 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/trainer/test_vllm_sleep.py -rA
Q05=$(checkpoint qwen2.5-0.5b)
JOB="--gpus 1 --colocated --model-path $Q05 --dtype bfloat16 --prompts 16 --generations 16 --max-new-tokens 128 \
  --ignore-eos --max-prompt-length 48 --micro-batch 64 --learning-rate 1e-6 --generation-backend vllm --steps 6 \
  --warmup-steps 0 --modes sync --markdown"
[[ " $PARTS " == *" awake "* ]] && run job-vllm-awake 300 "$PY" -m asyncgrpo_trainer.bench $JOB --out "$OUT/job_vllm_colocated_awake.json"
[[ " $PARTS " == *" sleeping "* ]] && run job-vllm-sleeping 300 "$PY" -m asyncgrpo_trainer.bench $JOB --sleep-while-training \
  --out "$OUT/job_vllm_colocated_sleeping.json"
date -u +"end %FT%TZ"
exit $status
