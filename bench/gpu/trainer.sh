#!/usr/bin/env bash
# The async trainer on 2 GPUs (policy on one, generation on the other, refit over NCCL), sync vs
# each async mode, with the 24-layer Qwen2-shaped model; then the same with the Megatron-core policy.
# PARTS="modes" or "megatron" runs one of the two (each fits one device call). Results (JSON + log)
# go to $OUT. Needs Ray (and megatron-core for the second part) importable: on the H200 machine they
# travel as wheels (docs/guides/gpu.md, "Reproduce").
#   set -o pipefail; OUT=/tmp/out bash bench/gpu/trainer.sh 2>&1 | tee $OUT/trainer-log.txt
source "$(dirname "$0")/common.sh"
STEPS=${STEPS:-20}
PARTS=${PARTS:-modes megatron}
# The Qwen2 shape of issue 8 (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864) with
# the digit-reversal task's character vocabulary; 16 prompts x 16 samples a step, every response 128
# tokens (--ignore-eos: the task's own answers are 5 tokens and leave the GPUs idle).
# Link bandwidth: bench/gpu/results/2026-11-29-h200x2/refit.json (4 GiB broadcast GPU 0 -> 1).
SHAPE="--gpus 1 --hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 \
  --prompts 16 --generations 16 --max-new-tokens 128 --ignore-eos --max-prompt-length 16 --micro-batch 64 \
  --learning-rate 1e-5 --link-bytes-per-s 364565499635 --markdown"
if [[ " $PARTS " == *" modes "* ]]; then
  run trainer-modes "${TRAINER_LIMIT:-560}" "$PY" -m asyncgrpo_trainer.bench $SHAPE --dtype bfloat16 \
    --steps "$STEPS" --warmup-steps 2 --modes sync async-in-order streaming-gated streaming-oversampled \
    --out "$OUT/trainer_modes.json"
fi
# The same trainer with the Megatron-core policy (TP=1; fp32, as bench/gpu/megatron_check.py checked
# it), a few steps in sync and async: that the backend trains inside the driver on GPUs.
if [[ " $PARTS " == *" megatron "* ]]; then
  run trainer-megatron "${MEGATRON_LIMIT:-300}" "$PY" -m asyncgrpo_trainer.bench $SHAPE --dtype float32 \
    --policy-backend megatron --steps 6 --warmup-steps 1 --modes sync async-in-order \
    --out "$OUT/trainer_megatron.json"
fi
date -u +"end %FT%TZ"
exit $status
