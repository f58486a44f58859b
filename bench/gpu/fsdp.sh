#!/usr/bin/env bash
# FSDP2 sharding, activation checkpointing and the CPU-offloaded optimizer of the torch policy on GPUs
# (issue 30 item 1), in parts that each fit one 10-minute device call. Results (JSON + log) go to $OUT.
#   one-gpu          one GPU: the policy step at Qwen2.5-3B's shape (random weights, bf16), plain and
#                    with activation checkpointing (bench/gpu/fsdp_step.py)
#   one-gpu-offload  one GPU: the same step with FSDP over the one rank and its parameters, gradients
#                    and AdamW state in host memory, without and with activation checkpointing
#   ranks            GPUS GPUs: unsharded data parallel vs FSDP vs FSDP + activation checkpointing, first
#                    in float32 on a small model (weights after 5 steps against the unsharded ones), then
#                    at $RANKS_SHAPE in bf16 (per-rank peak memory, step time)
#   trainer          GPUS GPUs: the whole async job with an FSDP policy (python -m asyncgrpo_trainer.bench),
#                    colocated torch engines refitted by CUDA IPC, sync and async-in-order
#   trainer-pools    GPUS GPUs: the same job with separate pools (GPUS/2 FSDP ranks, GPUS/2 engines)
#                    refitted by the NCCL broadcast, which every FSDP rank joins to gather the weights
# GPUS defaults to the visible GPUs. Needs Ray for the trainer parts (docs/guides/gpu.md, "Reproduce").
#   set -o pipefail; OUT=/tmp/out PARTS=one-gpu bash bench/gpu/fsdp.sh 2>&1 | tee $OUT/fsdp-log.txt
source "$(dirname "$0")/common.sh"
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
RANKS_SHAPE=${RANKS_SHAPE:-qwen2.5-3b}
PARTS=${PARTS:-one-gpu}
free -g || true
needs_ranks() {
  if [ "$GPUS" -lt 2 ]; then echo "!!! $1 needs 2 or more GPUs, $GPUS visible"; status=1; return 1; fi
}
if [[ " $PARTS " == *" one-gpu "* ]]; then
  run fsdp-one-gpu 560 "$PY" bench/gpu/fsdp_step.py --shape qwen2.5-3b --batch 8 --seq 1024 \
    --variants plain,activation_checkpointing --out "$OUT/fsdp_one_gpu.json"
fi
if [[ " $PARTS " == *" one-gpu-offload "* ]]; then
  run fsdp-one-gpu-offload 560 "$PY" bench/gpu/fsdp_step.py --shape qwen2.5-3b --batch 8 --seq 1024 \
    --variants cpu_offload,cpu_offload_activation_checkpointing --out "$OUT/fsdp_one_gpu_offload.json"
fi
if [[ " $PARTS " == *" ranks "* ]] && needs_ranks ranks; then
  run fsdp-parity 150 "$PY" bench/gpu/fsdp_step.py --gpus "$GPUS" --skip-one-gpu --parity --batch 4 --seq 512 \
    --rank-timeout 120 --out "$OUT/fsdp_parity_${GPUS}gpus.json"
  run fsdp-ranks 420 "$PY" bench/gpu/fsdp_step.py --gpus "$GPUS" --skip-one-gpu --shape "$RANKS_SHAPE" \
    --batch 8 --seq 1024 --rank-timeout 130 --out "$OUT/fsdp_ranks_${GPUS}gpus.json"
fi
# The trainer's GPU shape (bench/gpu/trainer.sh): hidden 896, 24 layers, the task's character vocabulary,
# 16 prompts x 16 samples a step, every response 128 tokens (--ignore-eos).
SHAPE="--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --dtype bfloat16 \
  --prompts 16 --generations 16 --max-new-tokens 128 --ignore-eos --max-prompt-length 16 --micro-batch 32 \
  --learning-rate 1e-5 --steps 8 --warmup-steps 2 --modes sync async-in-order --markdown"
if [[ " $PARTS " == *" trainer "* ]] && needs_ranks trainer; then
  run fsdp-trainer-colocated 560 "$PY" -m asyncgrpo_trainer.bench $SHAPE --gpus "$GPUS" --colocated \
    --sharding fsdp --activation-checkpointing --out "$OUT/fsdp_trainer_colocated_${GPUS}gpus.json"
fi
if [[ " $PARTS " == *" trainer-pools "* ]] && needs_ranks trainer-pools; then
  run fsdp-trainer-pools 560 "$PY" -m asyncgrpo_trainer.bench $SHAPE --gpus $((GPUS / 2)) \
    --sharding fsdp --out "$OUT/fsdp_trainer_pools_${GPUS}gpus.json"
fi
date -u +"end %FT%TZ"
exit $status
