"""The reward model on vLLM's CPU engine (rewardModel.backend vllm): the judge's engine is the same
`GenerationWorker` contract, so the vLLM judge writes the torch judge's texts, and its verdicts are
the torch judge's rewards. One vLLM engine for the module (it takes minutes to start on CPU)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from asyncgrpo_api.v1alpha1.trainer import RewardModelSpec
from asyncgrpo_trainer import judge, reward_model
from asyncgrpo_trainer.envs.base import Example
from tests.trainer import judge_checkpoint

pytestmark = pytest.mark.vllm


def test_the_vllm_judge_writes_what_the_torch_judge_writes(taught_judge: Path) -> None:
    spec = RewardModelSpec(
        path=str(taught_judge),
        template=judge_checkpoint.TEMPLATE,
        chatTemplate=False,
        maxNewTokens=2,
        maxSequenceLength=judge_checkpoint.MAX_POSITIONS,
    )
    rng = random.Random(5)
    texts = [
        reward_model.render(spec.template, Example(f"{s[::-1]}=", s), response)
        for s in judge_checkpoint.held_out_strings(8)
        for response in (s, judge_checkpoint.wrong_answer(rng, s))
    ]
    on_torch = asyncio.run(judge.JudgeEngine(judge.read(spec, seed=0)).continuations(texts))

    async def on_vllm() -> list[str]:
        engine = judge.JudgeEngine(judge.read(spec.model_copy(update={"backend": "vllm"}), seed=0))
        try:
            return await engine.continuations(texts)  # all at once: vLLM batches them
        finally:
            await engine.engine.shutdown()

    with asyncio.Runner() as runner:
        assert runner.run(on_vllm()) == on_torch
    assert all(reward_model.verdict(text) in (0.0, 1.0) for text in on_torch), on_torch
