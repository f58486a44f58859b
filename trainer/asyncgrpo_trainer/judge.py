"""The reward model's engine: the judge checkpoint, loaded as the policy's is, in an engine of its own.

`read` runs in the driver before Ray starts (like the policy's checkpoint and env.function's
check): the judge's config and tokenizer are read once, so a missing or unusable checkpoint fails
the job at start with InvalidDataError naming rewardModel.path and the fix, before any worker.

`JudgeEngine` is a Ray actor around a `generation.GenerationWorker` (the torch engine, or vLLM's
through the same interface), on CPU. It takes the texts of a group, encodes each as the judge's
prompt (its chat template when rewardModel.chatTemplate says so) and submits them all at once,
greedy, so the engine batches them (the torch engine's batched path collects concurrent calls into
one decode; vLLM batches continuously), with the calls of every reward actor sharing it. It returns
the judge's texts; the verdicts are read in the reward actors (`reward_model`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from asyncgrpo_api.v1alpha1.trainer import RewardModelSpec
from asyncgrpo_trainer.backends import generation, sampling, vllm_engine
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from asyncgrpo_trainer.reward_model import RewardModel

MAX_BATCH_ROWS = 64
"""Verdicts one torch decode holds at most (its KV cache is sized for them at maxSequenceLength)."""
POLICY_FIELDS = {
    "spec.trainer.model.maxSequenceLength": "rewardModel.maxSequenceLength",
    "spec.trainer.data.chatTemplate": "rewardModel.chatTemplate",
}
"""The fields the checkpoint readers name for the policy, and the judge's field that set the same."""
RESTARTS = 3
"""A judge whose process died is started again (it holds no state but the checkpoint's weights)."""


@dataclass(frozen=True)
class Judge:
    """The judge's recipe and tokenizer as the driver read them, with its settings."""

    spec: RewardModelSpec
    build: ModelBuild
    tokenizer: CheckpointTokenizer


def read(spec: RewardModelSpec, seed: int) -> Judge:
    """The judge checkpoint's recipe and tokenizer; InvalidDataError naming rewardModel.path when the
    directory is missing or is no checkpoint the trainer can load."""
    if spec.backend == "vllm":
        vllm_engine.check_available("rewardModel.backend")
    if not Path(spec.path).is_dir():
        raise InvalidDataError(
            f"rewardModel.path: {spec.path} does not exist (is the models volume mounted there?); point it "
            "at the judge's Hugging Face checkpoint directory"
        )
    try:
        build, tokenizer = recipe.pretrained_build(
            spec.path,
            max_sequence_length=spec.max_sequence_length,
            dtype=spec.dtype,
            seed=seed,
            chat_template=spec.chat_template,
            system_prompt=None,
        )
    except InvalidModelError as exc:
        message = str(exc)
        for policy_field, field in POLICY_FIELDS.items():
            message = message.replace(policy_field, field)
        raise InvalidDataError(
            message if message.startswith("rewardModel.") else f"rewardModel.path: {message}"
        ) from None
    return Judge(spec, build, tokenizer)


class JudgeEngine:
    """The judge's engine as a Ray actor (module docstring)."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.engine: generation.GenerationWorker
        if judge.spec.backend == "vllm":
            options = vllm_engine.VLLMOptions(max_num_seqs=MAX_BATCH_ROWS)
            self.engine = vllm_engine.VLLMGenerationWorker(judge.build, device="cpu", options=options)
        else:
            self.engine = generation.TorchGenerationWorker(
                judge.build, device="cpu", engine="batched", max_batch_rows=MAX_BATCH_ROWS
            )
        self.params = sampling.SamplingParams(max_new_tokens=judge.spec.max_new_tokens, temperature=0.0)

    async def continuations(self, texts: list[str]) -> list[str]:
        """The judge's greedy text after each of `texts`; ValueError when one does not fit."""
        spec, tok = self.judge.spec, self.judge.tokenizer
        prompts = [tok.encode_prompt(t) for t in texts]
        for n, ids in enumerate(prompts, 1):
            if len(ids) + spec.max_new_tokens > spec.max_sequence_length:
                raise ValueError(
                    f"rewardModel.maxSequenceLength: text {n} of {len(texts)} is {len(ids)} tokens, and "
                    f"with maxNewTokens {spec.max_new_tokens} that is over {spec.max_sequence_length}; "
                    "raise maxSequenceLength or shorten rewardModel.template"
                )
        done = await asyncio.gather(*(self.engine.generate(ids, 1, self.params, seed=0) for ids in prompts))
        return [tok.decode(g.response_ids[0]) for g in done]


def start(judge: Judge) -> tuple[RewardModel, Any]:
    """The reward source and the ref that resolves once its engine is up (no CPU reserved: the
    reward workers reserve none either)."""
    actor: Any = ray.remote(num_cpus=0, max_restarts=RESTARTS)(JudgeEngine).remote(judge)
    return RewardModel(judge.spec.template, actor), actor.__ray_ready__.remote()
