#!/usr/bin/env bash
# Issue 30 item 5 on one GPU: what the torch policy step fits and costs at Qwen2.5's shapes (random
# weights made in the process, bf16), in parts (PARTS, run in the order given; default lora offload
# packing largest, about 9 minutes). Results (JSON + log) go to $OUT. No Ray, no vLLM.
#   lora     LoRA (rank 16, alpha 32, every projection) at 0.5B, 1.5B and 3B, 8 rows x 1024 tokens a step
#            (bench/gpu/fsdp_step.py; full fine-tuning at 1.5B and 3B: the 2026-12-03 H200 table of
#            docs/benchmarks.md; LORA_VARIANTS=lora,plain adds it in the same run)
#   largest  LoRA at Qwen2.5-7B's shape (untied, 7.6B) with activation checkpointing
#   largest14  the same at Qwen2.5-14B's shape (14.8B; not in the default PARTS)
#   offload  FSDP over the one rank with parameters, gradients and AdamW in host memory, 1.5B: one
#            untimed and OFFLOAD_STEPS (1) timed steps with all host threads, then one more step of the
#            same worker on the trainer's one thread
#   packing  packed (maxTokensPerMicroBatch BUDGETS, default 8192) against padded (8 rows) micro-batches,
#            1.5B, 64 responses of lognormal length clipped to [16, 1024] (bench/gpu/packing_step.py)
# --threads $(nproc): the worker's host threads (the trainer's are 1); they speed up the random init
# on the CPU and the offloaded AdamW, and nothing of a step on the GPU.
#   set -o pipefail; OUT=/tmp/out PARTS="lora largest" bash bench/gpu/policy_fit.sh 2>&1 | tee $OUT/log.txt
source "$(dirname "$0")/common.sh"
PARTS=${PARTS:-lora offload packing largest}
THREADS=$(nproc)
STEP="bench/gpu/fsdp_step.py --batch 8 --seq 1024 --threads $THREADS"
for part in $PARTS; do  # in the order given
  case $part in
  lora)
    V=${LORA_VARIANTS:-lora}
    run lora-0.5b 150 "$PY" $STEP --shape qwen2.5-0.5b --variants "$V" --out "$OUT/lora_0.5b.json"
    run lora-1.5b 150 "$PY" $STEP --shape qwen2.5-1.5b --variants "$V" --out "$OUT/lora_1.5b.json"
    run lora-3b 180 "$PY" $STEP --shape qwen2.5-3b --variants "$V" --out "$OUT/lora_3b.json" ;;
  largest)
    run largest-7b-lora 200 "$PY" $STEP --shape qwen2.5-7b --variants lora_activation_checkpointing --steps 3 \
      --out "$OUT/largest_7b_lora.json" ;;
  largest14)
    run largest-14b-lora 240 "$PY" $STEP --shape qwen2.5-14b --variants lora_activation_checkpointing --steps 3 \
      --out "$OUT/largest_14b_lora.json" ;;
  offload)
    run offload-1.5b 200 "$PY" $STEP --shape qwen2.5-1.5b --variants cpu_offload --warmup 1 \
      --steps "${OFFLOAD_STEPS:-1}" --then-threads 1 --out "$OUT/offload_1.5b.json" ;;
  packing)
    run packing-1.5b 260 "$PY" bench/gpu/packing_step.py --shape qwen2.5-1.5b --groups 8 \
      --budgets "${BUDGETS:-8192}" --out "$OUT/packing_1.5b.json" ;;
  *) echo "!!! unknown part $part"; status=1 ;;
  esac
done
date -u +"end %FT%TZ"
exit $status
