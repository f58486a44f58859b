"""Compute backends behind small interfaces: policy (training) and generation (sampling).

torch implementations ship here and run on CPU or CUDA; vLLM (generation) and Megatron-core
(policy) plug in behind the same interfaces (`policy.PolicyWorker`, `generation.GenerationWorker`).
"""
