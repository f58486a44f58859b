#!/usr/bin/env bash
# Issue 33 items 4 and 5 on one H200, in parts that each fit one device call. Results (JSON + log) go
# to $OUT. Needs Ray importable for the job part (docs/guides/gpu.md, "Reproduce"); the checkpoints
# are made on the machine with random weights at Qwen2.5's shapes (bench/gpu/vllm_vs_torch.py).
#   mfu       the compiled training step at Qwen2.5-0.5B's shape, 16, 24 and 32 rows of 1024 tokens
#   job-1.5b  a whole GRPO job at Qwen2.5-1.5B's shape, colocated (the torch policy and the torch
#             engine on the one GPU, refit by CUDA IPC): 64 prompts x 8 samples = 512 samples of 512
#             new tokens a step (--ignore-eos: every sample is as long as NeMo-RL's longest), the unit
#             NeMo-RL's nightly GRPO test for Qwen2.5-Math-1.5B publishes (at most 25 s a step on 8 GPUs);
#             sync only: with async-in-order beside it (each mode its own driver, compile and 1.5B
#             checkpoint) the part did not fit one 10-minute call
#   set -o pipefail; OUT=/tmp/out PARTS="mfu job-1.5b" bash bench/gpu/peers.sh 2>&1 | tee $OUT/log.txt
source "$(dirname "$0")/common.sh"
PARTS=${PARTS:-mfu}
if [[ " $PARTS " == *" mfu "* ]]; then
  Q05=$(checkpoint qwen2.5-0.5b)
  for batch in 16 24 32; do
    run "mfu-qwen0.5b-batch$batch" 170 "$PY" bench/gpu/train_step.py --checkpoint "$Q05" --variants compiled_amp \
      --batch "$batch" --seq 1024 --out "$OUT/train_step_qwen2.5-0.5b_batch$batch.json"
  done
fi
if [[ " $PARTS " == *" job-1.5b "* ]]; then
  Q15=$(checkpoint qwen2.5-1.5b)
  run job-qwen1.5b 420 "$PY" -m asyncgrpo_trainer.bench --gpus 1 --colocated --model-path "$Q15" --dtype bfloat16 \
    --prompts 64 --generations 8 --max-new-tokens 512 --ignore-eos --max-prompt-length 48 --micro-batch 32 \
    --learning-rate 1e-6 --steps 5 --warmup-steps 1 --modes sync --markdown \
    --out "$OUT/job_qwen2.5-1.5b_colocated.json"
fi
date -u +"end %FT%TZ"
exit $status
