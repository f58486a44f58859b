"""The staleness stamp is exact (issue 46): a group carries the oldest weight version that shaped
any of its tokens, through their KV or logits, and the staleness limits measure it.

An engine reports it per sample (`generation.Generated.oldest_versions`): the torch engine's
per-group path stamps a prompt served from its prefix cache with the version that prefilled it,
the batched path each sample with the version its batch prefilled with. The streaming samplers
evict by it, the gated one replacing what it evicts; the log-prob gate counts a row as fresh only
when its stamp is the version trained; each step record reports the staleness by it next to the
dispatch staleness.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_trainer import sampler
from asyncgrpo_trainer.backends import generation, sampling, static_decode
from asyncgrpo_trainer.buffer import GroupRecord, ReplayBuffer
from asyncgrpo_trainer.envs.base import Example
from tests.trainer.test_batched_generation import BUILD, GREEDY, PROMPTS, _scaled
from tests.trainer.test_controller_pumps import FakeGeneration, _controller, _steps

SAMPLED = sampling.SamplingParams(max_new_tokens=4, temperature=1.0)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_prompt_cached_under_version_v_and_sampled_after_a_refit_to_v_plus_1_is_stamped_v() -> None:
    worker = generation.TorchGenerationWorker(BUILD, device="cpu", engine="per-group", max_prefix_age=1)
    newer = BUILD.instantiate()
    _scaled(newer, 2)

    async def scenario() -> tuple[generation.Generated, generation.Generated, generation.Generated]:
        await worker.adopt_weights(0)
        await worker.generate(PROMPTS[0], 2, SAMPLED, seed=0)  # prefills the prompt under version 0
        await worker.load_weights(newer.state_dict(), 1)  # no cache reset (recompute false)
        cached = await worker.generate(PROMPTS[0], 2, SAMPLED, seed=1)
        fresh = await worker.generate(PROMPTS[1], 2, SAMPLED, seed=1)
        await worker.load_weights(newer.state_dict(), 2)  # the entry is now 2 > max_prefix_age old
        return cached, fresh, await worker.generate(PROMPTS[0], 2, SAMPLED, seed=2)

    cached, fresh, refilled = _run(scenario())
    assert worker.prefix_hits == 1
    # Its KV and first-token logits are version 0's, though every decode step ran on version 1.
    assert cached.oldest_versions == [0, 0] and (cached.first_version, cached.last_version) == (1, 1)
    assert fresh.oldest_versions == [1, 1]
    assert refilled.oldest_versions == [2, 2]


def test_a_group_split_over_batches_around_an_in_flight_refit_stamps_each_sample_by_its_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = generation.TorchGenerationWorker(
        BUILD, device="cpu", engine="batched", collect_seconds=0.0, sync_every=2, max_batch_rows=2
    )
    newer = BUILD.instantiate()
    _scaled(newer, 5)
    chunk_done = asyncio.Event()
    collect = static_decode.Decoding.collect

    def collect_and_signal(self: static_decode.Decoding) -> bool:
        finished = collect(self)
        chunk_done.set()
        return finished

    monkeypatch.setattr(static_decode.Decoding, "collect", collect_and_signal)

    async def scenario() -> generation.Generated:
        await worker.adopt_weights(0)
        group = asyncio.create_task(worker.generate(PROMPTS[1], 4, GREEDY, seed=0))
        await chunk_done.wait()  # the first batch (2 of the 4 rows) has decoded a chunk on version 0
        await worker.load_weights(newer.state_dict(), 1)
        return await group

    out = _run(scenario())
    # The first batch's rows continued on version 1 with KV built by version 0: stamped 0. The
    # second batch prefilled on version 1.
    assert out.oldest_versions == [0, 0, 1, 1]
    assert (out.first_version, out.last_version) == (0, 1)


def _record(*, oldest: int, first: int) -> GroupRecord:
    return GroupRecord([1, 3], [[4, 2]], [[-0.5, -0.1]], [1.0], [True], [True], oldest, first, first)


def _committed(start: int, oldest: int) -> tuple[ReplayBuffer, int]:
    buf = ReplayBuffer()
    gid = buf.reserve(Example("1+1=", "2"), start_version=start, target_step=None)
    buf.commit(gid, _record(oldest=oldest, first=start), end_version=start)
    return buf, gid


@pytest.mark.parametrize(
    "smp", [sampler.WeightFifoSampler(1), sampler.WindowedSampler(1)], ids=lambda s: s.name
)
def test_the_staleness_gate_evicts_a_group_by_its_oldest_version_not_its_dispatch_version(
    smp: sampler.Sampler,
) -> None:
    # Dispatched at version 2, but its prompt's KV came from version 1: at trainer version 3 with
    # S = 1 only versions >= 2 may be trained, so it can never be.
    buf, gid = _committed(start=2, oldest=1)
    assert buf.slots[gid].window_version == 1
    assert smp.select(buf, 3, min_groups=1, max_groups=4) is None
    assert [s.group_id for s in smp.evict(buf, 3)] == [gid]
    # The same group is trained at version 2, where its oldest weights are in the window.
    buf, gid = _committed(start=2, oldest=1)
    chosen = smp.select(buf, 2, min_groups=1, max_groups=4)
    assert chosen is not None and [s.group_id for s in chosen] == [gid]


def test_only_the_gated_streaming_sampler_has_its_evicted_groups_replaced() -> None:
    assert sampler.WeightFifoSampler(1).replaces_evicted
    assert not sampler.WindowedSampler(1).replaces_evicted  # ungated: its pump dispatches anyway
    assert not sampler.InOrderSampler(1).replaces_evicted  # it evicts only groups of steps taken


def test_a_checkpointed_record_without_a_stamp_is_stamped_with_its_first_version() -> None:
    buf, gid = _committed(start=2, oldest=1)
    state = buf.state_dict()
    del state["slots"][0]["record"]["oldest_version"]
    record = ReplayBuffer.from_state_dict(state).slots[gid].record
    assert record is not None and record.oldest_version == 2


def test_a_row_stamped_older_than_the_version_trained_is_not_fresh_for_the_logprob_gate(
    tmp_path: Path,
) -> None:
    ctl, _ = _controller(tmp_path, "streaming-oversampled", FakeGeneration())  # S = 1
    ctl.version = 3
    buf = ReplayBuffer()
    cached = buf.reserve(Example("a", "a"), start_version=3, target_step=None)
    buf.commit(cached, _record(oldest=2, first=3), end_version=3)
    own = buf.reserve(Example("b", "b"), start_version=3, target_step=None)
    buf.commit(own, _record(oldest=3, first=3), end_version=3)
    rows = ctl._rows([buf.slots[cached], buf.slots[own]])
    assert [r.fresh for r in rows] == [False, True]


class CachedPrefixGeneration(FakeGeneration):
    """Every prompt hits a prefix cache whose KV is one version older than the engine's weights
    (as a prompt cached before the last refit), back to the last reset."""

    def __init__(self) -> None:
        super().__init__()
        self.reset_at = -1

    async def reset_cache(self) -> None:
        await super().reset_cache()
        self.reset_at = self.version

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        stamp = max(self.version - 1, self.reset_at)
        out = await super().generate(prompt_ids, n, params, seed)
        return generation.Generated(
            out.response_ids,
            out.logprobs,
            out.finished,
            [stamp] * n,
            out.first_version,
            out.last_version,
            out.busy_seconds,
        )


@pytest.mark.parametrize("mode", ["streaming-gated", "streaming-oversampled"])
def test_streaming_modes_never_train_a_group_whose_oldest_weights_left_the_window(
    tmp_path: Path, mode: str
) -> None:
    gen = CachedPrefixGeneration()
    ctl, pol = _controller(tmp_path, mode, gen)
    summary = asyncio.run(ctl.run())  # the gated pump replaces what it evicts: it does not stall
    steps = _steps(summary)
    assert pol.steps == 6 and all(r["max_oldest_staleness"] <= 1 for r in steps)
    assert all(r["mean_oldest_staleness"] >= r["mean_staleness"] for r in steps)
    assert sum(r["evicted_groups"] for r in steps) > 0


def test_the_step_records_carry_the_staleness_by_the_oldest_version(tmp_path: Path) -> None:
    # Async in order bounds the dispatch version only: a cached prompt one version older shows.
    ctl, _ = _controller(tmp_path, "async-in-order", CachedPrefixGeneration())
    steps = _steps(asyncio.run(ctl.run()))
    assert max(r["max_staleness"] for r in steps) <= 1
    assert max(r["max_oldest_staleness"] for r in steps) == 2
    assert all(r["mean_oldest_staleness"] >= r["mean_staleness"] for r in steps)
