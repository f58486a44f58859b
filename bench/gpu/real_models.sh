#!/usr/bin/env bash
# The real-model and vLLM figures of issues 14 and 15 on one H200, in parts that each fit one device
# call (PARTS="engines", "train", "jobs-torch" or "jobs-vllm"). Results (JSON + log) go to $OUT.
# Needs vLLM 0.26.0 and Ray importable (on the H200 machine they travel as wheels: docs/guides/gpu.md,
# "Reproduce"); the checkpoints are made on the machine with random weights (make_tiny_checkpoint):
# the 387M reference shape and Qwen2.5-0.5B's shape (vocabulary 151,936, tied embeddings), bfloat16.
#   set -o pipefail; OUT=/tmp/out PARTS=engines bash bench/gpu/real_models.sh 2>&1 | tee $OUT/log.txt
source "$(dirname "$0")/common.sh"
Q05="$ROOT/qwen2.5-0.5b-bfloat16"
PARTS=${PARTS:-engines}
if [[ " $PARTS " == *" engines "* ]]; then
  run cuda-ipc 120 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/trainer/test_cuda_ipc.py
  # The CUDA-graph engine on Qwen2.5-0.5B's shape (makes the checkpoint), then loading it.
  run engine-qwen0.5b 150 "$PY" bench/gpu/vllm_vs_torch.py --shape qwen2.5-0.5b --skip-vllm --root "$ROOT" \
    --out "$OUT/torch_engine_qwen2.5-0.5b.json"
  run load-qwen0.5b 90 "$PY" bench/models/load.py --dir "$Q05" --repeat 3 --out "$OUT/load_qwen2.5-0.5b.json"
  # vLLM next to the CUDA-graph engine at the 387M reference point, and the bf16 log-prob gate.
  run vllm-vs-torch-387m 330 "$PY" bench/gpu/vllm_vs_torch.py --shape 387m --root "$ROOT" \
    --out "$OUT/vllm_vs_torch_387m.json"
fi
if [[ " $PARTS " == *" train "* ]]; then
  run train-qwen0.5b 200 "$PY" bench/gpu/train_step.py --checkpoint "$Q05" --variants compiled_amp,eager_bf16 \
    --out "$OUT/train_step_qwen2.5-0.5b.json"
fi
# Whole jobs on one GPU, generation colocated with the torch policy (the one-GPU layout): 256 samples
# of 128 tokens a step (--ignore-eos: a throughput workload) on the Qwen2.5-0.5B-shaped checkpoint.
JOB="--gpus 1 --colocated --model-path $Q05 --dtype bfloat16 --prompts 16 --generations 16 \
  --max-new-tokens 128 --ignore-eos --max-prompt-length 48 --micro-batch 64 --learning-rate 1e-6 --markdown"
if [[ " $PARTS " == *" jobs-torch "* ]]; then
  run jobs-torch-ipc 330 "$PY" -m asyncgrpo_trainer.bench $JOB --steps 10 --warmup-steps 2 \
    --modes sync async-in-order streaming-gated --out "$OUT/jobs_torch_colocated_ipc.json"
fi
if [[ " $PARTS " == *" jobs-vllm "* ]]; then
  # No warm-up run: each driver run starts its own vLLM engine (minutes); the first step is reported apart.
  run jobs-vllm 560 "$PY" -m asyncgrpo_trainer.bench $JOB --generation-backend vllm --steps 10 --warmup-steps 0 \
    --modes sync async-in-order --out "$OUT/jobs_vllm_colocated_ipc.json"
fi
date -u +"end %FT%TZ"
exit $status
