"""The controller's pumps in-process against fake workers (no Ray processes, no model): refit
order, cache resets, version bumps, aborts, the drain gate, retries, failures and the watchdog.

The fakes implement the same async calls as the worker groups; generation time is simulated with
asyncio sleeps, so each scenario runs in well under a second and is deterministic in what it
asserts (counts and invariants, not timings). The policy fake writes its own checkpoint file, as
the real workers do.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import checkpoint, controller, data, envs, logprob_gate, occupancy, sampler, weights
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.buffer import ReplayBuffer
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tokenizer import CharTokenizer
from asyncgrpo_trainer.rewards import RewardFailedError
from asyncgrpo_trainer.rollout import RolloutFailedError, RolloutManager

P, N = 4, 2


class FakeGeneration:
    """Engines that hold a weight version and 'decode' for a few multiples of `delay` seconds."""

    def __init__(self, delay: float = 0.01, fail_first: int = 0, hang: bool = False) -> None:
        self.version = -1
        self.delay, self.fail_first, self.hang = delay, fail_first, hang
        self.resets = 0
        self.loads: list[int] = []
        self.calls = 0
        self.asleep = False
        self.sleeps = 0
        self.occupancy = occupancy.Occupancy([0])

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        with self.occupancy.serving(0):
            return await self._generate(n, seed)

    async def _generate(self, n: int, seed: int) -> generation.Generated:
        assert not self.asleep, "asked to generate while asleep"
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("engine error")
        if self.hang:
            await asyncio.Event().wait()
        first = self.version
        for _ in range(4):  # groups take 1x to 3x the delay, so they finish at different times
            await asyncio.sleep(self.delay * (1 + seed % 3) / 4)
        return generation.Generated(
            [[3 + seed % 3, 2] for _ in range(n)],
            [[-1.0, -0.5]] * n,
            [True] * n,
            [first] * n,
            first,
            self.version,
            self.delay,
        )

    async def load_weights(self, ref: Any, version: int) -> list[float]:
        assert not self.asleep, "refit while asleep"
        self.loads.append(version)
        self.version = version
        return [0.0]  # generation paused for it, per engine

    async def reset_cache(self) -> None:
        self.resets += 1

    async def sleep(self) -> None:
        await asyncio.sleep(0)
        self.asleep = True
        self.sleeps += 1

    async def wake(self) -> None:
        await asyncio.sleep(0)
        self.asleep = False

    async def stats(self) -> list[dict[str, float]]:
        return [{"busy_seconds": 0.0}]


class FakePolicy:
    def __init__(self, generation: FakeGeneration | None = None) -> None:
        self.chunks: list[list[Any]] = []
        self.steps = 0
        self.generation = generation
        self.trained_while_engine_asleep: list[bool] = []

    async def reference_logprobs(self, rows: list[Any]) -> list[list[float]]:
        return [[0.0] * len(r) for _, r in rows]

    async def train_chunk(self, rows: list[Any]) -> None:
        self.chunks.append(rows)
        if self.generation is not None:
            self.trained_while_engine_asleep.append(self.generation.asleep)

    async def finish_step(self) -> dict[str, float]:
        self.steps += 1
        return {"loss": 0.0, "grad_norm": 1.0}

    def weights_ref(self) -> dict[str, Any]:
        return {}

    async def save(self, directory: str) -> None:
        checkpoint.write(Path(directory) / "policy.pt", {"steps": self.steps})

    async def busy_seconds(self) -> float:
        return 0.0


class FakeRewards:
    """Every second sample is correct and rewarded 0.9: reward mean 0.45, accuracy 0.5."""

    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        return [Score(0.9 * (i % 2), i % 2 == 1) for i in range(len(responses))]


def _controller(
    tmp_path: Path,
    mode: str,
    gen: FakeGeneration,
    *,
    steps: int = 6,
    drain: bool = False,
    recompute: bool = False,
    stall: float = 60.0,
    attempts: int = 2,
    timeout: float | None = None,
    prompts: int = P,
    rewards: Any = None,
    policy: FakePolicy | None = None,
    gate: logprob_gate.GateSettings | None = None,
    validation: list[Example] | None = None,
    val_period: int = 0,
    validation_tokens: int = 2,
    dynamic_sampling: int | None = None,
    sleep: bool = False,
) -> tuple[controller.SingleController, FakePolicy]:
    knobs = {
        "sync": (0, False, True, prompts, prompts),
        "async-in-order": (1, False, True, 2 * prompts, prompts),
        "streaming-gated": (1, False, False, 2 * prompts, prompts // 2),
        "streaming-oversampled": (1, True, False, 4 * prompts, prompts // 2),
    }[mode]
    s_, over, in_order, cap, min_groups = knobs
    env = envs.build("reverse")
    tok = CharTokenizer(env.alphabet)
    pol = policy or FakePolicy()
    rewards = rewards or FakeRewards()
    rollout = RolloutManager(
        gen,
        rewards,
        tok,
        sampling.SamplingParams(2),
        num_generations=N,  # type: ignore[arg-type]
        timeout_seconds=timeout,
        max_attempts=attempts,
        seed=0,
    )
    settings = controller.Settings(
        mode=mode,
        prompts_per_step=prompts,
        generations_per_prompt=N,
        max_steps=steps,
        min_groups_for_streaming_train=min_groups,
        max_buffered_rollouts=cap,
        max_inflight_prompts=cap,
        drain_before_refit=drain,
        reset_cache_after_refit=s_ == 0 or recompute,
        stall_timeout_seconds=stall,
        leave_one_out=True,
        normalize_rewards=True,
        needs_reference_logprobs=False,
        val_period=val_period,
        val_at_end=False,
        checkpoint_path=str(tmp_path),
        checkpoint_every=1000,
        checkpoint_keep=1,
        seed=0,
        logprob_gate=gate or logprob_gate.GateSettings(threshold=None),
        dynamic_sampling_max_extra_groups=dynamic_sampling,
        sleep_generation_while_training=sleep,
        watchdog_interval_seconds=0.02,
    )
    args = controller.ControllerArgs(
        settings=settings,
        policy=pol,
        generation=gen,
        rewards=rewards,
        rollout=rollout,  # type: ignore[arg-type]
        weights=weights.ObjectStoreSynchronizer(pol, gen, 10.0),  # type: ignore[arg-type]
        loader=data.PromptLoader(env.builtin_examples(split="train", count=64, seed=0), prompts, 0),
        validation=validation or [],
        buffer=ReplayBuffer(),
        sampler=sampler.for_spec(max_staleness_versions=s_, over_sampling=over, force_in_order=in_order),
        tokenizer=tok,
        validation_params=sampling.SamplingParams(validation_tokens, temperature=0.0),
        model=recipe.tiny_build(
            tok,
            hidden_size=16,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=None,
            max_sequence_length=16,
            position_embedding="learned",
            dtype="float32",
            seed=0,
        ),
    )
    return controller.SingleController(args), pol


def _steps(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in summary["records"] if "reward_mean" in r]


def test_sync_mode_trains_only_fresh_data_and_resets_the_cache_after_every_refit(tmp_path: Path) -> None:
    gen = FakeGeneration()
    ctl, pol = _controller(tmp_path, "sync", gen)
    summary = asyncio.run(ctl.run())
    assert [r["max_staleness"] for r in _steps(summary)] == [0] * 6
    assert gen.loads == [0, 1, 2, 3, 4, 5, 6]  # initial sync, then one version bump per step
    assert gen.resets == 7
    assert pol.steps == 6 and sum(len(c) for c in pol.chunks) == 6 * P * N


def test_an_engine_that_sleeps_while_training_is_asleep_for_every_chunk_and_awake_for_every_refit(
    tmp_path: Path,
) -> None:
    gen = FakeGeneration()
    examples = envs.build("reverse").builtin_examples(split="validation", count=3, seed=1)
    ctl, pol = _controller(
        tmp_path, "sync", gen, policy=FakePolicy(gen), sleep=True, validation=examples, val_period=2
    )
    summary = asyncio.run(ctl.run())
    # FakeGeneration refuses to generate or load weights asleep: every group, validation and refit
    # ran on an awake engine, and the loss is the same data as without sleeping
    assert gen.loads == [0, 1, 2, 3, 4, 5, 6] and pol.steps == 6
    assert sum(len(c) for c in pol.chunks) == 6 * P * N
    # a step trains asleep unless a validation still generates (steps 3 and 5 may start beside one)
    assert pol.trained_while_engine_asleep.count(True) >= 4
    steps = _steps(summary)
    slept = [r for r in steps if "generation_sleep" in r]
    assert gen.sleeps == len(slept) == summary["counters"]["generation_sleeps"] >= 4
    assert all("generation_wake" in r for r in slept)


def test_each_step_reports_the_fraction_of_exactly_correct_samples_next_to_the_reward(
    tmp_path: Path,
) -> None:
    ctl, _ = _controller(tmp_path, "streaming-gated", FakeGeneration())
    steps = _steps(asyncio.run(ctl.run()))
    assert [r["accuracy"] for r in steps] == [0.5] * 6  # counted from Score.correct ...
    assert [r["reward_mean"] for r in steps] == pytest.approx([0.45] * 6)  # ... not from the reward


class PromptParityRewards:
    """Groups of even-numbered prompts score 1.0 for every sample (nothing to learn from them);
    the others score 0.0 and 0.6 in turn."""

    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        if int(example.prompt[0]) % 2 == 0:
            return [Score(1.0, True) for _ in responses]
        return [Score(0.6 * (i % 2), False) for i in range(len(responses))]


def test_each_step_says_how_many_of_its_groups_had_nothing_to_train_on(tmp_path: Path) -> None:
    ctl, _ = _controller(tmp_path, "async-in-order", FakeGeneration(), rewards=PromptParityRewards())
    summary = asyncio.run(ctl.run())
    steps = _steps(summary)
    for r in steps:
        # a group whose samples all scored the same has zero advantage; the others spread by 0.6
        assert r["reward_spread"] == pytest.approx(0.6 * (1 - r["zero_advantage_groups"])), r
    assert 0 < sum(r["zero_advantage_groups"] for r in steps) < len(steps)  # both kinds were trained


def test_the_checkpoint_holds_the_controllers_state_and_the_policy_writes_its_own_file(
    tmp_path: Path,
) -> None:
    ctl, _ = _controller(tmp_path, "sync", FakeGeneration())
    asyncio.run(ctl.run())  # the last step is checkpointed
    final = checkpoint.step_dir(tmp_path, 6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", final.name]  # logs: the step records
    assert sorted(p.name for p in final.iterdir()) == ["meta.json", "policy.pt", "state.pt"]
    assert torch.load(final / "policy.pt") == {"steps": 6}
    records = [json.loads(line) for line in (tmp_path / "logs" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "step"] == [1, 2, 3, 4, 5, 6]
    assert records[-1] == {"event": "checkpoint", "attempt": None, "step": 6}
    state = checkpoint.load(tmp_path, 6)
    assert "policy" not in state and state["step"] == 6 and state["batch_index"] == 6


@pytest.mark.parametrize("recompute", [False, True])
def test_async_modes_reset_the_cache_only_when_asked(tmp_path: Path, recompute: bool) -> None:
    gen = FakeGeneration()
    ctl, _ = _controller(tmp_path, "async-in-order", gen, recompute=recompute)
    summary = asyncio.run(ctl.run())
    assert gen.resets == (7 if recompute else 1)  # the initial sync always starts from a clean cache
    assert max(r["max_staleness"] for r in _steps(summary)) <= 1


def test_streaming_gated_streams_chunks_into_one_optimizer_step(tmp_path: Path) -> None:
    gen = FakeGeneration()
    ctl, pol = _controller(tmp_path, "streaming-gated", gen)
    summary = asyncio.run(ctl.run())
    assert pol.steps == 6  # one finish_step per RL step ...
    assert len(pol.chunks) >= 6 and all(len(c) % N == 0 for c in pol.chunks)  # ... of whole groups
    assert all(r["max_staleness"] <= 1 for r in _steps(summary))


def test_over_sampling_never_trains_beyond_the_window_and_aborts_aged_out_groups(tmp_path: Path) -> None:
    gen = FakeGeneration(delay=0.05)
    ctl, _ = _controller(tmp_path, "streaming-oversampled", gen, steps=8)
    summary = asyncio.run(ctl.run())
    assert max(r["max_staleness"] for r in _steps(summary)) <= 1
    c = summary["counters"]
    assert c["groups_dispatched"] > 8 * P  # ungated: more groups than steps need ...
    assert c.get("groups_evicted", 0) + c.get("groups_aborted_stale", 0) > 0  # ... and the excess is dropped


def test_samples_never_trained_are_the_evicted_ones_and_those_still_waiting(tmp_path: Path) -> None:
    """An over-sampled run generates more than it trains: at every step's end the difference is,
    sample for sample, the groups evicted so far plus those waiting in the buffer (its fill)."""
    ctl, _ = _controller(tmp_path, "streaming-oversampled", FakeGeneration(delay=0.05), steps=8)
    steps = _steps(asyncio.run(ctl.run()))
    evicted = 0.0
    for r in steps:
        evicted += r["evicted_groups"]
        waiting = round(r["buffer_fill"] * ctl.s.max_buffered_rollouts)
        assert r["samples_untrained"] == r["samples_generated"] - r["samples_trained"], r
        assert r["samples_untrained"] == N * (evicted + waiting), r
    assert evicted > 0 or any(r["samples_untrained"] for r in steps)


def test_the_drain_gate_waits_for_in_flight_groups_so_none_straddles_a_refit(tmp_path: Path) -> None:
    gen = FakeGeneration(delay=0.05)
    ctl, _ = _controller(tmp_path, "streaming-oversampled", gen, drain=True)
    summary = asyncio.run(ctl.run())
    assert summary["counters"].get("groups_straddling_refit", 0) == 0
    gen2 = FakeGeneration(delay=0.05)
    ctl2, _ = _controller(tmp_path / "b", "streaming-oversampled", gen2, drain=False)
    assert asyncio.run(ctl2.run())["counters"].get("groups_straddling_refit", 0) > 0


def test_in_order_mode_with_the_drain_trains_each_step_on_the_previous_weights_however_slow_generation_is(
    tmp_path: Path,
) -> None:
    """Reproducible async (issue 46): without the drain, whether the rollout pump dispatches the
    next batch before the refit or after it is a matter of timing, and a batch dispatched after it
    comes from newer weights (here every other step trains on fresh data); with it
    (async-in-order's default), step k trains on weights k - 1 exactly, every group."""

    def ages(drain: bool, where: Path) -> list[tuple[float, int, float]]:
        ctl, _ = _controller(where, "async-in-order", FakeGeneration(delay=0.05), drain=drain)
        summary = asyncio.run(ctl.run())
        assert summary["counters"].get("groups_straddling_refit", 0) == 0
        return [
            (r["mean_staleness"], r["max_staleness"], r["mean_oldest_staleness"]) for r in _steps(summary)
        ]

    exact = [(0.0, 0, 0.0)] + [(1.0, 1, 1.0)] * 5
    assert ages(True, tmp_path) == exact
    assert ages(False, tmp_path / "b") != exact  # the schedule the drain fixes


def test_a_failed_attempt_is_retried_and_never_trained_on(tmp_path: Path) -> None:
    gen = FakeGeneration(fail_first=2)
    ctl, pol = _controller(tmp_path, "sync", gen, steps=2, attempts=3)
    summary = asyncio.run(ctl.run())
    assert ctl.a.rollout.stats.errors == 2 and ctl.a.rollout.stats.retries == 2
    assert sum(len(c) for c in pol.chunks) == 2 * P * N  # every trained row came from a success
    assert summary["counters"]["groups_committed"] == 2 * P


def test_a_group_failing_every_attempt_stops_the_run_with_the_error(tmp_path: Path) -> None:
    gen = FakeGeneration(fail_first=10**6)
    ctl, pol = _controller(tmp_path, "async-in-order", gen, attempts=2)
    with pytest.raises(RolloutFailedError, match="failed 2 attempt"):
        asyncio.run(ctl.run())
    assert pol.chunks == [] and ctl.state == "failed" and "RolloutFailedError" in (ctl.error or "")
    assert not ctl.inflight  # every in-flight task was cancelled and awaited


def test_a_rollout_past_its_deadline_is_a_failure_not_a_zero_reward_group(tmp_path: Path) -> None:
    gen = FakeGeneration(hang=True)
    ctl, pol = _controller(tmp_path, "sync", gen, attempts=1, timeout=0.05)
    with pytest.raises(RolloutFailedError, match="TimeoutError"):
        asyncio.run(ctl.run())
    assert pol.chunks == []


def test_the_watchdog_fails_a_run_that_makes_no_progress(tmp_path: Path) -> None:
    gen = FakeGeneration(hang=True)  # no deadline: the groups hang forever
    ctl, _ = _controller(tmp_path, "sync", gen, stall=0.2)
    with pytest.raises(controller.StallError, match="no rollout committed"):
        asyncio.run(ctl.run())


class FailingRewards(FakeRewards):
    """Scoring the prompts in `bad` fails as the reward pool fails after its retry."""

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad
        self.failures = 0

    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        if example.prompt in self.bad:
            self.failures += 1
            raise RewardFailedError("scoring failed 2 times; last: RuntimeError: the reward service is down")
        return await super().score(example, responses, finished)


def _first_prompts(count: int) -> list[str]:
    return [
        e.prompt
        for e in data.PromptLoader(
            envs.build("reverse").builtin_examples(split="train", count=64, seed=0), count, 0
        ).next_batch()
    ]


@pytest.mark.parametrize("mode", ["sync", "async-in-order", "streaming-gated", "streaming-oversampled"])
def test_a_group_whose_scoring_fails_is_dropped_replaced_and_never_trained_on(
    tmp_path: Path, mode: str
) -> None:
    prompts, steps = 10, 3
    bad = _first_prompts(prompts)[3]
    failing = FailingRewards({bad})
    ctl, pol = _controller(tmp_path, mode, FakeGeneration(), steps=steps, prompts=prompts, rewards=failing)
    summary = asyncio.run(ctl.run())
    bad_ids = ctl.a.tokenizer.encode_prompt(bad)
    trained = [row for chunk in pol.chunks for row in chunk]
    assert all(row.prompt_ids != bad_ids for row in trained)  # never trained on, as 0 or otherwise
    assert len(trained) == steps * prompts * N  # every step still trained on P groups: a replacement
    # once in the gated modes; over-sampling runs through the prompts again and meets it twice or so
    assert failing.failures >= 1 and summary["counters"]["reward_failures"] == failing.failures
    assert ctl.poll(0)["progress"]["reward_failures"] == failing.failures
    if mode != "streaming-oversampled":
        assert [r["reward_failures"] for r in _steps(summary)] == [1, 0, 0]


class MostlyFailingRewards(FakeRewards):
    """A scorer that fails three calls in four, whatever the prompt (a broken reward service)."""

    def __init__(self) -> None:
        self.calls = 0

    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        self.calls += 1
        if self.calls % 4:
            raise RewardFailedError("scoring failed 2 times; last: RuntimeError: the reward service is down")
        return await super().score(example, responses, finished)


@pytest.mark.parametrize("prompts", [4, 8])
@pytest.mark.parametrize("mode", ["sync", "async-in-order"])
def test_one_dropped_group_does_not_fail_a_small_job(tmp_path: Path, mode: str, prompts: int) -> None:
    bad = {_first_prompts(prompts)[1]}
    ctl, pol = _controller(
        tmp_path, mode, FakeGeneration(), steps=3, prompts=prompts, rewards=FailingRewards(bad)
    )
    summary = asyncio.run(asyncio.wait_for(ctl.run(), 120))
    assert ctl.state == "succeeded" and summary["counters"]["reward_failures"] == 1
    assert sum(len(c) for c in pol.chunks) == 3 * prompts * N  # the replacement took its place
    assert [r["reward_failures"] for r in _steps(summary)] == [1, 0, 0]


@pytest.mark.parametrize("prompts", [4, 8])
def test_a_scorer_failing_most_calls_stops_the_run_with_that_reason(tmp_path: Path, prompts: int) -> None:
    failing = MostlyFailingRewards()
    ctl, _ = _controller(tmp_path, "async-in-order", FakeGeneration(), prompts=prompts, rewards=failing)
    with pytest.raises(controller.RewardFailuresError) as err:
        asyncio.run(asyncio.wait_for(ctl.run(), 120))
    # Calls 1-3 and 5-6 fail: the fifth drop is one more than the minimum budget of 4.
    assert re.fullmatch(
        f"5 of the last 6 prompt groups scored were dropped for failed scoring, more than the failure "
        f"budget of 4 in any {4 * prompts} \\(10% of 4 x numPromptsPerStep {prompts}, at least 4\\); the "
        "last, for step [12]: scoring failed 2 times; last: RuntimeError: the reward service is down",
        str(err.value),
    )
    assert ctl.state == "failed"


def test_a_dropped_group_counts_against_the_step_it_was_dispatched_for(tmp_path: Path) -> None:
    """async-in-order dispatches step 2's batch while step 1 is assembled; its drop is step 2's."""
    bad = {_first_prompts(2 * P)[P + 1]}  # the second prompt of the second dispatch batch
    ctl, _ = _controller(tmp_path, "async-in-order", FakeGeneration(), steps=3, rewards=FailingRewards(bad))
    summary = asyncio.run(asyncio.wait_for(ctl.run(), 120))
    assert [r["reward_failures"] for r in _steps(summary)] == [0, 1, 0]


def test_a_pump_cancelled_while_the_pulse_it_waits_on_fires_is_cancelled() -> None:
    async def fire_and_cancel() -> None:
        pulse = controller.Pulse()
        waiter = asyncio.create_task(pulse.wait(10))
        await asyncio.sleep(0)
        pulse.fire()  # a dropped group's replacement ...
        waiter.cancel()  # ... and the failure it causes stop the run in the same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(fire_and_cancel())
