"""Leader election's rules, with client-go's semantics, on an in-memory Lease and manual clocks.

The Lease store below keeps resourceVersions like the API server (a stale write is a 409), and
each replica has its own monotonic clock, so the tests can skew wall clocks and stall renewals at
will. The failover with two real replicas on the real API server is in tests/e2e/test_operator.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from asyncgrpo_operator import k8s
from asyncgrpo_operator.leader import LeaseElector, Timing

TIMING = Timing(lease_seconds=15, renew_deadline_seconds=10, retry_seconds=2)


class LeaseStore:
    """One Lease with optimistic concurrency; `hang` makes every call wait forever."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.hang = False

    async def _maybe_hang(self) -> None:
        if self.hang:
            await asyncio.Event().wait()

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._maybe_hang()
        return copy.deepcopy(self.lease)

    async def create_lease(self, namespace: str, lease: dict[str, Any]) -> bool:
        await self._maybe_hang()
        if self.lease is not None:
            return False
        self._store(lease)
        return True

    async def replace_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        await self._maybe_hang()
        assert self.lease is not None
        if lease["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise k8s.ApiError(409, "the object has been modified")
        self._store(lease)
        return copy.deepcopy(self.lease)

    def _store(self, lease: dict[str, Any]) -> None:
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)

    @property
    def holder(self) -> str:
        assert self.lease is not None
        return str(self.lease["spec"]["holderIdentity"])


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def replica(store: LeaseStore, identity: str, clock: Clock) -> LeaseElector:
    return LeaseElector(store, "ns", identity, timing=TIMING, clock=clock)  # type: ignore[arg-type]


def test_the_first_replica_acquires_and_a_second_stands_by() -> None:
    store = LeaseStore()
    a, b = replica(store, "a", Clock()), replica(store, "b", Clock())
    assert asyncio.run(a.step()) and a.is_leader
    assert not asyncio.run(b.step()) and not b.is_leader
    assert store.holder == "a"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 0


def test_a_standby_takes_over_only_after_the_record_stopped_changing_for_a_lease_duration() -> None:
    store = LeaseStore()
    clock_a, clock_b = Clock(), Clock(5_000_000.0)  # unrelated clocks: only intervals matter
    a, b = replica(store, "a", clock_a), replica(store, "b", clock_b)
    asyncio.run(a.step())
    asyncio.run(b.step())  # b sees the record now
    for _ in range(10):  # a renews every 2 s: the record keeps changing, b never takes over
        clock_a.now += 2
        clock_b.now += 2
        asyncio.run(a.step())
        assert not asyncio.run(b.step())
    # a dies. b takes over 15 s after it last saw the record change, not before.
    clock_b.now += 14
    assert not asyncio.run(b.step())
    clock_b.now += 1.5
    assert asyncio.run(b.step()) and store.holder == "b"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1


def test_expiry_does_not_compare_the_leaders_wall_clock_with_the_standbys() -> None:
    """A leader whose wall clock is an hour behind writes renewTimes that look long expired to a
    standby comparing clocks; observed with the standby's own clock, the lease is live."""
    store = LeaseStore()
    a, b = replica(store, "a", Clock()), replica(store, "b", Clock())
    asyncio.run(a.step())
    assert store.lease is not None
    store.lease["spec"]["renewTime"] = "2001-01-01T00:00:00.000000Z"  # skewed leader clock
    store.version += 1
    store.lease["metadata"]["resourceVersion"] = str(store.version)
    assert not asyncio.run(b.step()) and store.holder == "a"


def test_a_leader_that_cannot_renew_stops_acting_at_the_renew_deadline_even_while_a_call_hangs() -> None:
    store = LeaseStore()
    clock = Clock()
    a = replica(store, "a", clock)
    asyncio.run(a.step())
    assert a.is_leader
    store.hang = True  # the API stops answering; the renewal call never returns
    clock.now += 9.9
    assert a.is_leader
    clock.now += 0.2  # 10.1 s since the last renewal: before any standby could take over (15 s)
    assert not a.is_leader


def test_a_leader_whose_renewals_fail_gives_up_and_a_stalled_round_is_bounded() -> None:
    store = LeaseStore()
    clock = Clock()
    elector = LeaseElector(
        store,  # type: ignore[arg-type]
        "ns",
        "a",
        timing=Timing(lease_seconds=0.3, renew_deadline_seconds=0.2, retry_seconds=0.05),
        clock=clock,
    )
    asyncio.run(elector.step())
    store.hang = True
    clock.now += 1.0

    async def stalled_round() -> bool:
        return await asyncio.wait_for(elector.step(), timeout=2)

    assert asyncio.run(stalled_round()) is False  # the round gave up after the renew deadline
    assert not elector.is_leader and not elector._leading


def test_release_on_shutdown_hands_over_at_the_next_retry() -> None:
    store = LeaseStore()
    clock_b = Clock()
    a, b = replica(store, "a", Clock()), replica(store, "b", clock_b)
    asyncio.run(a.step())
    asyncio.run(b.step())
    asyncio.run(a.release())
    assert store.lease is not None
    assert (store.holder, store.lease["spec"]["leaseDurationSeconds"]) == ("", 1)
    assert not a.is_leader
    clock_b.now += TIMING.retry_seconds
    assert asyncio.run(b.step()) and store.holder == "b"


def test_release_by_a_replica_that_no_longer_holds_the_lease_changes_nothing() -> None:
    store = LeaseStore()
    a, b = replica(store, "a", Clock()), replica(store, "b", Clock())
    asyncio.run(a.step())
    asyncio.run(b.release())
    assert store.holder == "a"


def test_the_timing_must_leave_room_between_renew_and_takeover() -> None:
    with pytest.raises(ValueError, match="retry < renewDeadline < leaseDuration"):
        Timing(lease_seconds=10, renew_deadline_seconds=10, retry_seconds=2)
