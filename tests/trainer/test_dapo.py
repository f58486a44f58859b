"""DAPO's overlong reward shaping and dynamic sampling (spec.trainer.grpo), by hand computation.

The controller scenarios run the real pumps against the fake engines of test_controller_pumps, with
a scorer that gives every sample of an even-numbered prompt 1.0 (all equal: zero advantage) and the
others 0.0 and 0.6 (informative). The loader's prompt stream starts 3930 3989 4975 3546 2977 4358
3519 | 0821 5397 5713 0508 7342 6189 6326 7381 | 6225 5416 4503 5942 6481 6641 8461 2715 1587 8040
2243 9200, so its parities are O O E O E E O | E O O E O E E O | E O E O E E E E O E E O.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import driver, envs, progress
from asyncgrpo_trainer.algorithms import advantages
from asyncgrpo_trainer.algorithms.dynamic_sampling import DynamicSampling, informative
from asyncgrpo_trainer.algorithms.overlong import OverlongPenalty
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.tokenizer import CharTokenizer
from asyncgrpo_trainer.rollout import RolloutManager
from tests.trainer import jobs
from tests.trainer.test_controller_pumps import FakeGeneration, FakePolicy, N, _controller, _steps

MODES = ["sync", "async-in-order", "streaming-gated", "streaming-oversampled"]

# --- overlong reward shaping ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "penalty"),
    [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (15, -0.75), (16, -1.0), (17, -1.0), (40, -1.0)],
)
def test_the_overlong_penalty_falls_linearly_over_the_band_to_minus_one_at_max_new_tokens(
    length: int, penalty: float
) -> None:
    # L_max = 16, L_cache = 4: free up to 12 tokens, then ((16 - 4) - |y|) / 4, and -1 beyond 16.
    assert OverlongPenalty(max_tokens=16, band=4)(length) == penalty


def test_a_band_as_long_as_the_budget_penalises_every_token_and_a_one_token_band_only_the_last() -> None:
    whole = OverlongPenalty(max_tokens=4, band=4)
    assert [whole(n) for n in range(6)] == [0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    last = OverlongPenalty(max_tokens=4, band=1)
    assert [last(n) for n in range(6)] == [0.0, 0.0, 0.0, 0.0, -1.0, -1.0]


@pytest.mark.parametrize("band", [0, 17])
def test_a_band_outside_the_budget_is_refused(band: int) -> None:
    with pytest.raises(ValueError, match="penalty band"):
        OverlongPenalty(max_tokens=16, band=band)


class LengthsGeneration(FakeGeneration):
    """Sample i of every group has lengths[i] tokens (the last cut at maxNewTokens)."""

    def __init__(self, lengths: list[int], max_new_tokens: int) -> None:
        super().__init__()
        self.lengths, self.max_new_tokens = lengths, max_new_tokens

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        return generation.Generated(
            [[3] * k for k in self.lengths],
            [[-1.0] * k for k in self.lengths],
            [k < self.max_new_tokens for k in self.lengths],
            [self.version] * len(self.lengths),
            self.version,
            self.version,
            0.0,
        )


class ConstantRewards:
    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        return [Score(0.5, False) for _ in responses]


def test_the_penalty_is_added_to_the_reward_before_advantages_so_lengths_alone_can_rank_a_group() -> None:
    lengths = [12, 13, 14, 16]  # the last one cut at maxNewTokens 16
    tok = CharTokenizer(envs.build("reverse").alphabet)
    rollout = RolloutManager(
        LengthsGeneration(lengths, 16),  # type: ignore[arg-type]
        ConstantRewards(),  # type: ignore[arg-type]
        tok,
        sampling.SamplingParams(16),
        num_generations=len(lengths),
        timeout_seconds=None,
        max_attempts=1,
        seed=0,
        overlong=OverlongPenalty(max_tokens=16, band=4),
    )
    record = asyncio.run(rollout.run_group(Example("1234=", "4321"), 0, lambda attempt: None))
    assert record.rewards == [0.5, 0.25, 0.0, -0.5]  # 0.5 plus 0, -0.25, -0.5, -1
    assert informative(record.rewards)  # the same score for every answer, yet not a zero-advantage group
    adv = advantages.group_relative(torch.tensor([record.rewards]), leave_one_out=False, normalize=False)
    assert adv.tolist() == [[0.4375, 0.1875, -0.0625, -0.5625]]  # minus the mean, 0.0625


# --- dynamic sampling: the per-step budget --------------------------------------------------------


def test_uninformative_groups_are_dropped_until_the_steps_cap_then_kept_and_the_cap_reported() -> None:
    sampler = DynamicSampling(max_extra_groups=2)
    equal, spread = [1.0, 1.0], [0.0, 0.6]
    assert [sampler.keep(0, r) for r in (equal, spread, equal, equal, equal)] == [
        False,
        True,
        False,
        True,  # the third uninformative group of step 0: its two replacements are spent
        True,
    ]
    assert sampler.keep(1, equal) is False  # each step has its own cap
    report = sampler.report(0)
    assert (report.dropped, report.cap_hit) == (2, True)
    assert (sampler.report(0).dropped, sampler.report(0).cap_hit) == (0, False)  # read once
    assert (sampler.report(1).dropped, sampler.report(1).cap_hit) == (1, False)


def test_without_a_cap_set_dynamic_sampling_is_off_and_keeps_every_group() -> None:
    sampler = DynamicSampling(max_extra_groups=None)
    assert sampler.keep(0, [1.0, 1.0]) and sampler.report(0).dropped == 0


# --- dynamic sampling in the controller -----------------------------------------------------------


class PromptParityRewards:
    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        if int(example.prompt[0]) % 2 == 0:
            return [Score(1.0, True) for _ in responses]
        return [Score(0.6 * (i % 2), False) for i in range(len(responses))]


def _trained_groups(policy: FakePolicy) -> list[list[float]]:
    """The advantages of every trained group (a chunk is whole groups of N rows, in order)."""
    rows = [row for chunk in policy.chunks for row in chunk]
    return [[r.advantage for r in rows[i : i + N]] for i in range(0, len(rows), N)]


def test_a_sync_step_replaces_its_all_equal_groups_and_trains_on_p_informative_ones(tmp_path: Path) -> None:
    ctl, pol = _controller(
        tmp_path, "sync", FakeGeneration(), steps=3, rewards=PromptParityRewards(), dynamic_sampling=100
    )
    summary = asyncio.run(asyncio.wait_for(ctl.run(), 120))
    steps = _steps(summary)
    # Each step reads the stream until its fourth odd prompt: 7, 8 and 12 prompts, of which 3, 4
    # and 8 are even (dropped, each replaced by the next prompt).
    assert [r["groups_dropped_uninformative"] for r in steps] == [3, 4, 8]
    assert [r["groups_generated"] for r in steps] == [7, 8, 12]
    assert [r["dynamic_sampling_cap_hit"] for r in steps] == [False] * 3
    assert [r["zero_advantage_groups"] for r in steps] == [0.0] * 3
    groups = _trained_groups(pol)
    assert len(groups) == 3 * 4 and all(any(a != 0 for a in g) for g in groups)
    assert summary["counters"]["groups_dropped_uninformative"] == 15
    counters = ctl.poll(0)["progress"]["counters"]
    metrics = progress.prometheus_text(progress.Progress(counters=counters)).splitlines()
    assert "asyncgrpo_groups_dropped_uninformative_total 15" in metrics
    assert "asyncgrpo_dynamic_sampling_cap_hits_total 0" in metrics


def test_a_step_that_spends_its_cap_keeps_the_rest_as_they_are_and_says_so(tmp_path: Path) -> None:
    ctl, pol = _controller(
        tmp_path, "sync", FakeGeneration(), steps=3, rewards=PromptParityRewards(), dynamic_sampling=4
    )
    steps = _steps(asyncio.run(asyncio.wait_for(ctl.run(), 120)))
    # Step 2 drops exactly 4 (the cap, not hit); step 3's batch E O E O drops 2, its replacements
    # 6481 and 6641 (E E) 2 more, and then keeps the next two, 8461 and 2715 (E E), unreplaced.
    assert [r["groups_dropped_uninformative"] for r in steps] == [3, 4, 4]
    assert [r["groups_generated"] for r in steps] == [7, 8, 8]
    assert [r["dynamic_sampling_cap_hit"] for r in steps] == [False, False, True]
    assert [r["zero_advantage_groups"] for r in steps] == [0.0, 0.0, 0.5]
    assert len(_trained_groups(pol)) == 3 * 4  # every step still trains on P groups
    assert ctl.counters["dynamic_sampling_cap_hits"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_only_informative_groups_when_the_cap_allows(tmp_path: Path, mode: str) -> None:
    ctl, pol = _controller(
        tmp_path, mode, FakeGeneration(), steps=3, rewards=PromptParityRewards(), dynamic_sampling=100
    )
    summary = asyncio.run(asyncio.wait_for(ctl.run(), 120))
    steps = _steps(summary)
    groups = _trained_groups(pol)
    assert len(groups) == 3 * 4 and all(any(a != 0 for a in g) for g in groups)
    assert all(r["zero_advantage_groups"] == 0 and not r["dynamic_sampling_cap_hit"] for r in steps)
    assert all(r["groups_generated"] == 4 + r["groups_dropped_uninformative"] for r in steps)
    dropped = sum(r["groups_dropped_uninformative"] for r in steps)
    assert dropped > 0
    # Over-sampling also drops groups it generates past the last step's needs.
    assert summary["counters"]["groups_dropped_uninformative"] >= dropped
    if mode != "streaming-oversampled":
        assert summary["counters"]["groups_dropped_uninformative"] == dropped


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_respects_a_cap_of_one_replacement_per_step(tmp_path: Path, mode: str) -> None:
    ctl, pol = _controller(
        tmp_path, mode, FakeGeneration(), steps=3, rewards=PromptParityRewards(), dynamic_sampling=1
    )
    steps = _steps(asyncio.run(asyncio.wait_for(ctl.run(), 120)))
    assert all(r["groups_dropped_uninformative"] <= 1 for r in steps)
    assert any(r["dynamic_sampling_cap_hit"] for r in steps)  # the stream has more evens than that
    assert len(_trained_groups(pol)) == 3 * 4
    if mode in ("sync", "async-in-order"):
        # Groups are stamped for their step, so a kept group is trained in the step whose cap it hit.
        # The streaming modes count a group against the step being assembled when it was scored,
        # and may train it in the next one.
        assert all(r["dynamic_sampling_cap_hit"] == (r["zero_advantage_groups"] > 0) for r in steps)


def test_without_dynamic_sampling_all_equal_groups_are_trained_and_nothing_is_dropped(tmp_path: Path) -> None:
    ctl, _ = _controller(tmp_path, "sync", FakeGeneration(), steps=3, rewards=PromptParityRewards())
    steps = _steps(asyncio.run(asyncio.wait_for(ctl.run(), 120)))
    # The first three batches of four: O O E O, E E O E, O O E O.
    assert [r["zero_advantage_groups"] for r in steps] == [0.25, 0.75, 0.25]
    assert [r["groups_dropped_uninformative"] for r in steps] == [0, 0, 0]
    assert [r["groups_generated"] for r in steps] == [4, 4, 4]


# --- a real run -----------------------------------------------------------------------------------


@pytest.mark.trainer
@pytest.mark.budget(250, "a whole CPU run with dynamic sampling: drops and the cap in real step records")
def test_a_cpu_run_with_dapo_on_finishes_and_its_step_records_show_drops_and_the_cap(
    ray_address: str, tmp_path: Path
) -> None:
    """The tiny model from random weights, async-in-order, with a penalty band of 2 of its 5 tokens:
    about half of its answers are cut (reward 0, penalty -1), so some groups are all equal and are
    replaced (one a step, seed 1, 2026-12-03); the records say so, step by step, in steps.jsonl."""
    p, cap = 4, 2
    manifest = jobs.manifest(
        "async-in-order",
        steps=3,
        checkpoint_dir=str(tmp_path),
        grpo={
            "numPromptsPerStep": p,
            "numGenerationsPerPrompt": 4,
            "dynamicSampling": True,
            "dynamicSamplingMaxExtraGroups": cap,
            "overlongPenaltyTokens": 2,
        },
        asyncRL={"maxBufferedRollouts": 2 * p},
        policy={"trainMicroBatchSize": p * 4},
        data={"numValidationPrompts": 0},
    )
    summary = driver.execute(manifest)
    assert summary["steps"] == 3 and summary["samples"] == 3 * p * 4  # P groups a step, whatever dropped
    lines = (tmp_path / "logs" / "steps.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r["event"] == "step"]
    assert len(steps) == 3
    for r in steps:
        assert 0 <= r["groups_dropped_uninformative"] <= cap, r
        assert r["groups_generated"] == p + r["groups_dropped_uninformative"] + r["reward_failures"], r
        assert r["dynamic_sampling_cap_hit"] == (r["zero_advantage_groups"] > 0), r
    dropped = sum(r["groups_dropped_uninformative"] for r in steps)
    assert dropped > 0 and summary["counters"]["groups_dropped_uninformative"] == dropped
    assert summary["counters"]["dynamic_sampling_cap_hits"] == sum(
        r["dynamic_sampling_cap_hit"] for r in steps
    )
