"""The staleness policy of each mode, on hand-built buffers: what is admitted, selected, evicted
and aborted at given trainer versions (no Ray, no torch compute)."""

from __future__ import annotations

import pytest

from asyncgrpo_trainer import sampler
from asyncgrpo_trainer.buffer import GroupRecord, ReplayBuffer
from asyncgrpo_trainer.envs.base import Example

P = 2


def _record(version: int) -> GroupRecord:
    return GroupRecord([1, 3], [[4, 2]], [[-0.5, -0.1]], [1.0], [True], [True], version, version, version)


def _buffer(*slots: tuple[int, int | None, bool]) -> ReplayBuffer:
    """Slots of (start_version, target_step, ready), in dispatch order."""
    buf = ReplayBuffer()
    for start, target, ready in slots:
        gid = buf.reserve(Example("1+1=", "2"), start_version=start, target_step=target)
        if ready:
            buf.commit(gid, _record(start), end_version=start)
    return buf


def _ids(slots: object) -> list[int]:
    assert isinstance(slots, list)
    return [s.group_id for s in slots]


def test_mode_names_map_to_samplers() -> None:
    assert isinstance(
        sampler.for_spec(max_staleness_versions=0, over_sampling=False, force_in_order=True),
        sampler.InOrderSampler,
    )
    assert isinstance(
        sampler.for_spec(max_staleness_versions=0, over_sampling=False, force_in_order=False),
        sampler.InOrderSampler,
    )  # forceInOrder is ignored in sync mode
    assert isinstance(
        sampler.for_spec(max_staleness_versions=2, over_sampling=False, force_in_order=True),
        sampler.InOrderSampler,
    )
    assert isinstance(
        sampler.for_spec(max_staleness_versions=2, over_sampling=False, force_in_order=False),
        sampler.WeightFifoSampler,
    )
    assert isinstance(
        sampler.for_spec(max_staleness_versions=2, over_sampling=True, force_in_order=False),
        sampler.WindowedSampler,
    )


@pytest.mark.parametrize(("s", "over", "in_order"), [(0, True, False), (1, True, True)])
def test_invalid_combinations_are_rejected(s: int, over: bool, in_order: bool) -> None:
    with pytest.raises(ValueError, match="overSampling"):
        sampler.for_spec(max_staleness_versions=s, over_sampling=over, force_in_order=in_order)


def test_sync_mode_admits_one_batch_per_version_and_trains_only_its_own_batch() -> None:
    smp = sampler.for_spec(max_staleness_versions=0, over_sampling=False, force_in_order=True)
    assert [smp.may_dispatch(b, 0) for b in range(3)] == [True, False, False]
    assert [smp.may_dispatch(b, 2) for b in range(4)] == [True, True, True, False]
    assert smp.target_step(5) == 5
    buf = _buffer((0, 0, True), (0, 0, False))
    assert smp.select(buf, 0, min_groups=P, max_groups=P) is None  # waits for the whole batch
    buf.commit(1, _record(0), end_version=0)
    assert _ids(smp.select(buf, 0, min_groups=P, max_groups=P)) == [0, 1]
    assert len(buf) == 0


def test_async_in_order_trains_step_v_only_on_the_batch_stamped_v() -> None:
    smp = sampler.InOrderSampler(1)
    assert [smp.may_dispatch(b, 0) for b in range(3)] == [True, True, False]
    buf = _buffer((0, 0, True), (0, 0, False), (0, 1, True), (0, 1, True))
    # step 0 waits for its own second group even though step 1's batch is complete
    assert smp.select(buf, 0, min_groups=P, max_groups=P) is None
    assert _ids(smp.select(buf, 1, min_groups=P, max_groups=P)) == [2, 3]
    # a ready group stamped for a step already taken is evicted; in-flight ones are never aborted
    assert _ids(smp.evict(buf, 1)) == [0]
    assert not smp.should_abort_inflight(buf.slots[1], 5)


def test_streaming_gated_takes_the_oldest_weight_version_first_and_waits_for_it() -> None:
    smp = sampler.WeightFifoSampler(1)
    assert smp.target_step(3) is None
    assert [smp.may_dispatch(b, 1) for b in range(4)] == [True, True, True, False]
    buf = _buffer((1, None, False), (1, None, True), (2, None, True), (2, None, True))
    # version 1 is the oldest in the window: only its ready group qualifies (a chunk of 1)
    assert smp.select(buf, 2, min_groups=2, max_groups=4) is None
    assert _ids(smp.select(buf, 2, min_groups=1, max_groups=4)) == [1]
    # version 1 still has a group in flight, so version 2's data waits behind it
    assert smp.select(buf, 2, min_groups=1, max_groups=4) is None
    buf.remove([0])
    assert _ids(smp.select(buf, 2, min_groups=1, max_groups=4)) == [2, 3]


def test_streaming_gated_takes_a_complete_short_version_below_the_chunk_minimum() -> None:
    # a refit split a dispatch batch: version 1 has only 3 groups, all ready; waiting for a chunk
    # of 4 would stall forever, so the 3 are a chunk and version 2 follows
    smp = sampler.WeightFifoSampler(1)
    buf = _buffer((1, None, True), (1, None, True), (1, None, True), (2, None, True), (2, None, False))
    assert _ids(smp.select(buf, 2, min_groups=4, max_groups=8)) == [0, 1, 2]
    assert smp.select(buf, 2, min_groups=4, max_groups=5) is None  # version 2 is still generating


def test_streaming_gated_evicts_ready_groups_older_than_the_window() -> None:
    smp = sampler.WeightFifoSampler(1)
    buf = _buffer((0, None, True), (1, None, True), (0, None, False))
    assert _ids(smp.evict(buf, 2)) == [0]  # start 0 < 2 - 1; the in-flight one is not ready yet
    assert not smp.should_abort_inflight(buf.slots[2], 2)
    assert _ids(smp.select(buf, 2, min_groups=1, max_groups=2)) == [1]


def test_over_sampled_is_ungated_selects_any_in_window_and_aborts_aged_out_inflight() -> None:
    smp = sampler.WindowedSampler(1)
    assert all(smp.may_dispatch(b, 0) for b in range(100))
    buf = _buffer((0, None, True), (1, None, False), (1, None, True), (2, None, True), (0, None, False))
    assert _ids(smp.evict(buf, 2)) == [0]
    assert smp.should_abort_inflight(buf.slots[4], 2)
    assert not smp.should_abort_inflight(buf.slots[1], 2)
    # dispatch order, never waiting for the in-flight group 1, capped at max_groups
    assert _ids(smp.select(buf, 2, min_groups=1, max_groups=1)) == [2]
    assert _ids(smp.select(buf, 2, min_groups=1, max_groups=4)) == [3]
    assert smp.select(buf, 2, min_groups=1, max_groups=4) is None


def test_required_capacity_is_p_times_window_plus_one() -> None:
    assert sampler.InOrderSampler(0).required_capacity(8) == 8
    assert sampler.WeightFifoSampler(3).required_capacity(8) == 32


def test_buffer_state_round_trips_ready_and_in_flight_groups() -> None:
    buf = _buffer((0, 0, True), (1, 1, False))
    again = ReplayBuffer.from_state_dict(buf.state_dict())
    assert again.state_dict() == buf.state_dict()
    assert [s.ready for s in again.ordered()] == [True, False]
    assert again.reserve(Example("a", "b"), start_version=2, target_step=None) == 2


def test_buffer_refuses_a_double_commit() -> None:
    buf = _buffer((0, None, True))
    with pytest.raises(RuntimeError, match="twice"):
        buf.commit(0, _record(0), end_version=0)
