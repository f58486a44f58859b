"""vLLM's sleep mode behind the generation contract (generation.sleepWhileTraining), on a GPU.

vLLM's CPU build has no sleep mode (admission refuses it there), so this runs only where CUDA is:
an engine started with sleep mode gives its KV cache back to the GPU while it sleeps, and after
waking it samples exactly what it sampled before, and takes a refit as before (the weights it
moved to host memory came back whole)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.vllm_engine import VLLMGenerationWorker, VLLMOptions
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from tests.skip_policy import requires_cuda

pytestmark = [pytest.mark.vllm, requires_cuda()]

PROMPTS = [[5, 17, 9, 23, 40], [7, 7, 3], [11, 2, 19, 4]]
GREEDY = sampling.SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
SHARE = 0.2


def test_a_sleeping_engine_frees_its_kv_cache_and_wakes_with_its_weights(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = make_tiny_checkpoint(
        tmp_path_factory.mktemp("vllm-sleep") / "qwen2", family="qwen2", tie_word_embeddings=False, seed=3
    )
    build, _ = recipe.pretrained_build(
        str(path), max_sequence_length=512, dtype="bfloat16", seed=0, chat_template=None, system_prompt=None
    )
    total = torch.cuda.mem_get_info()[1]

    async def scenario() -> tuple[list[list[int]], list[list[int]], int, int, list[list[int]]]:
        worker = VLLMGenerationWorker(
            build, device="cuda", options=VLLMOptions(gpu_memory_utilization=SHARE, sleep_mode=True)
        )
        try:
            before = [(await worker.generate(p, 1, GREEDY, seed=0)).response_ids[0] for p in PROMPTS]
            awake_free = torch.cuda.mem_get_info()[0]
            await worker.sleep()
            asleep_free = torch.cuda.mem_get_info()[0]
            await worker.wake()
            after = [(await worker.generate(p, 1, GREEDY, seed=0)).response_ids[0] for p in PROMPTS]
            # refits after waking land whole: other weights give other tokens, and the original
            # weights, sent back, give the original tokens again
            original = {k: v.detach() for k, v in build.instantiate().state_dict().items()}
            g = torch.Generator().manual_seed(1)
            other = {k: v + 0.05 * torch.randn(v.shape, generator=g).to(v.dtype) for k, v in original.items()}
            await worker.load_weights(other, 1)
            moved = [(await worker.generate(p, 1, GREEDY, seed=0)).response_ids[0] for p in PROMPTS]
            await worker.load_weights(original, 2)
            back = [(await worker.generate(p, 1, GREEDY, seed=0)).response_ids[0] for p in PROMPTS]
            assert (await worker.stats())["sleeps"] == 1
            return before, after, awake_free, asleep_free, [*moved, *back]
        finally:
            await worker.shutdown()

    before, after, awake_free, asleep_free, refits = asyncio.run(scenario())
    assert after == before
    freed = asleep_free - awake_free
    assert freed > 0.7 * SHARE * total, (freed / 2**30, SHARE * total / 2**30)  # the KV cache and weights
    moved, back = refits[: len(PROMPTS)], refits[len(PROMPTS) :]
    assert moved != before and back == before
