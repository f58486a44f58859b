"""Validation scores one weight version: the held-out answers of the validation at step k are
exactly what weights k answer, although validation runs beside training and the engine applies a
refit between two decode steps of a running request.

The controller runs in-process with the real torch generation engine (per-group decode, prefix
cache, weights swapped under its lock between tokens); the policy is a stand-in that publishes a
different random network at every version, since what is checked is which weights answered, not
what training would have made of them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import controller, envs, occupancy
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.recipe import ModelBuild
from tests.trainer.test_controller_pumps import FakeGeneration, FakePolicy, FakeRewards, _controller

VALIDATION_TOKENS = 10


class InProcessEngine:
    """The real torch engine, called as the controller calls a generation group (which measures
    its engines' idle time: `occupancy`)."""

    worker: generation.TorchGenerationWorker

    def __init__(self) -> None:
        self.occupancy = occupancy.Occupancy([0])

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        with self.occupancy.serving(0):
            return await self.worker.generate(prompt_ids, n, params, seed)

    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> list[float]:
        return [await self.worker.load_weights(state, version)]

    async def reset_cache(self) -> None:
        await self.worker.reset_cache()

    async def stats(self) -> list[dict[str, float]]:
        return [await self.worker.stats()]


class VersionedPolicy(FakePolicy):
    """Publishes a different random network at every version (weights_ref at version = steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.published: dict[int, dict[str, torch.Tensor]] = {}
        self.build: ModelBuild | None = None

    def weights_ref(self) -> dict[str, torch.Tensor]:
        assert self.build is not None
        g = torch.Generator().manual_seed(1000 + self.steps)
        base = self.build.instantiate().state_dict()
        state = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in base.items()}
        self.published[self.steps] = state
        return state


class RecordingRewards(FakeRewards):
    """Keeps every held-out answer it scores (validation asks one answer per prompt, training N)."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, str]] = []

    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        if len(responses) == 1:
            self.answers.append((example.prompt, responses[0]))
        return await super().score(example, responses, finished)


async def _answers_of(
    build: ModelBuild, state: dict[str, torch.Tensor], prompts: list[Example], ctl: Any
) -> list[str]:
    engine = generation.TorchGenerationWorker(build, device="cpu", engine="per-group")
    await engine.load_weights(state, 0)
    greedy = sampling.SamplingParams(VALIDATION_TOKENS, temperature=0.0)
    tok = ctl.a.tokenizer
    outs = [
        await engine.generate(tok.encode_prompt(e.model_prompt), 1, greedy, i) for i, e in enumerate(prompts)
    ]
    return [tok.decode(o.response_ids[0]) for o in outs]


def test_each_validation_answers_with_the_weights_of_its_step_while_refits_arrive(tmp_path: Path) -> None:
    held_out = envs.build("reverse").builtin_examples(split="validation", count=12, seed=0)
    engine, pol, rewards = InProcessEngine(), VersionedPolicy(), RecordingRewards()
    ctl, _ = _controller(
        tmp_path,
        "async-in-order",
        engine,  # type: ignore[arg-type]
        steps=4,
        policy=pol,
        rewards=rewards,
        validation=held_out,
        val_period=1,
        validation_tokens=VALIDATION_TOKENS,
    )
    # The prefix cache keeps prompt KV for S = 1 version, as an async job's engine does.
    engine.worker = generation.TorchGenerationWorker(
        ctl.a.model, device="cpu", engine="per-group", max_prefix_age=1
    )
    pol.build = ctl.a.model
    summary = asyncio.run(ctl.run())
    validations = [r for r in summary["records"] if r.get("event") == "validation"]
    assert [r["step"] for r in validations] == [0, 1, 2, 3, 4]
    assert [r["weight_version"] for r in validations] == [0, 1, 2, 3, 4]
    # The refit after a validation's step did come while it was generating, and waited for it.
    assert summary["phases"].get("validation_pin_wait", 0.0) > 0
    assert len(rewards.answers) == 5 * len(held_out)
    for i, record in enumerate(validations):
        given = dict(rewards.answers[i * len(held_out) : (i + 1) * len(held_out)])
        expected = asyncio.run(_answers_of(ctl.a.model, pol.published[record["step"]], held_out, ctl))
        assert [given[e.prompt] for e in held_out] == expected, f"validation of step {record['step']}"


class LaggingEngine(FakeGeneration):
    """An engine that says it holds weights one version behind the one it was given."""

    async def load_weights(self, ref: Any, version: int) -> list[float]:
        paused = await super().load_weights(ref, version)
        self.version = version - 1
        return paused


def test_an_answer_from_other_weights_than_the_validations_fails_the_run(tmp_path: Path) -> None:
    held_out = envs.build("reverse").builtin_examples(split="validation", count=3, seed=0)
    ctl, _ = _controller(tmp_path, "sync", LaggingEngine(), steps=2, validation=held_out, val_period=1)
    with pytest.raises(RuntimeError, match=r"validation of step 0 was pinned to weights 0, but 3 held-out"):
        asyncio.run(ctl.run())


class HangingValidation(FakeGeneration):
    """Answers the first validation; every later held-out answer never comes."""

    def __init__(self, answered: int) -> None:
        super().__init__()
        self.answered = answered

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        if params.temperature == 0.0:
            self.answered -= 1
            if self.answered < 0:
                await asyncio.Event().wait()
        return await super().generate(prompt_ids, n, params, seed)


def test_a_validation_that_never_finishes_holding_the_refit_is_a_stall_that_says_so(tmp_path: Path) -> None:
    held_out = envs.build("reverse").builtin_examples(split="validation", count=2, seed=0)
    engine = HangingValidation(answered=len(held_out))
    ctl, _ = _controller(tmp_path, "sync", engine, steps=4, validation=held_out, val_period=1, stall=0.5)
    with pytest.raises(controller.StallError, match="the refit waits for a validation still generating"):
        asyncio.run(ctl.run())
    assert ctl.version == 2  # step 1 trained, its validation hung, step 2 trained and could not refit
