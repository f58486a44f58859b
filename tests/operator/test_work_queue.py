"""The work queue: deduplication, requeue after a delay, one pass per job at a time, backoff, resync."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter

from asyncgrpo_operator.controller import Controller, Key
from tests.operator.cancelling import stops_when_cancelled_as_it_wakes

A: Key = ("ns", "a")
B: Key = ("ns", "b")


async def run_for(controller: Controller, seconds: float) -> None:
    task = asyncio.create_task(controller.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def no_keys() -> list[Key]:
    return []


def test_many_events_for_one_job_make_one_pass() -> None:
    calls: Counter[Key] = Counter()

    async def reconcile(key: Key) -> float | None:
        calls[key] += 1
        return None

    async def scenario() -> None:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600)
        for _ in range(10):
            controller.enqueue(A)
        controller.enqueue(B)
        await run_for(controller, 0.2)

    asyncio.run(scenario())
    assert calls == {A: 1, B: 1}


def test_a_pass_is_requeued_after_the_delay_it_returns() -> None:
    times: list[float] = []

    async def reconcile(key: Key) -> float | None:
        times.append(asyncio.get_running_loop().time())
        return 0.2 if len(times) < 3 else None

    async def scenario() -> None:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600)
        controller.enqueue(A)
        await run_for(controller, 1.0)

    asyncio.run(scenario())
    assert len(times) == 3
    assert all(0.15 <= later - earlier < 0.5 for earlier, later in itertools.pairwise(times))


def test_one_job_is_never_reconciled_twice_at_once_and_events_during_a_pass_are_not_lost() -> None:
    running = 0
    overlap = False
    calls = 0

    async def reconcile(key: Key) -> float | None:
        nonlocal running, overlap, calls
        calls += 1
        running += 1
        overlap = overlap or running > 1
        await asyncio.sleep(0.1)
        running -= 1
        return None

    async def scenario() -> None:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600, workers=4)
        controller.enqueue(A)
        await asyncio.sleep(0)
        task = asyncio.create_task(controller.run())
        await asyncio.sleep(0.05)
        controller.enqueue(A)  # arrives mid-pass: one more pass afterwards
        await asyncio.sleep(0.4)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert not overlap
    assert calls == 2


def test_a_failing_pass_is_retried_with_growing_delays() -> None:
    times: list[float] = []

    async def reconcile(key: Key) -> float | None:
        times.append(asyncio.get_running_loop().time())
        raise RuntimeError("API down")

    async def scenario() -> Controller:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600)
        controller.enqueue(A)
        await run_for(controller, 3.5)
        return controller

    controller = asyncio.run(scenario())
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(times) == 3  # at 0, 1 and 3 seconds
    assert 0.9 <= gaps[0] < 1.5 and 1.9 <= gaps[1] < 2.5
    assert controller.stats.failures == 3


def test_the_resync_reconciles_every_job_periodically() -> None:
    calls: Counter[Key] = Counter()

    async def reconcile(key: Key) -> float | None:
        calls[key] += 1
        return None

    async def both() -> list[Key]:
        return [A, B]

    async def scenario() -> None:
        controller = Controller(reconcile=reconcile, list_keys=both, resync_seconds=0.3)
        await run_for(controller, 0.75)

    asyncio.run(scenario())
    assert calls[A] == 3 and calls[B] == 3


def test_a_conflict_is_replanned_right_away_without_counting_a_failure() -> None:
    class StaleError(Exception):
        pass

    times: list[float] = []

    async def reconcile(key: Key) -> float | None:
        times.append(asyncio.get_running_loop().time())
        if len(times) == 1:
            raise StaleError
        return None

    async def scenario() -> Controller:
        controller = Controller(
            reconcile=reconcile, list_keys=no_keys, resync_seconds=3600, conflict_errors=(StaleError,)
        )
        controller.enqueue(A)
        await run_for(controller, 0.6)
        return controller

    controller = asyncio.run(scenario())
    assert len(times) == 2 and times[1] - times[0] < 0.5
    assert controller.stats.failures == 0


def test_a_new_jobs_first_pass_goes_before_passes_of_known_jobs() -> None:
    # 50 jobs applied at once: each should get its RayCluster before the pod-event passes of the
    # jobs already provisioning are served (issue 10: the p99 to a RayCluster).
    order: list[Key] = []
    known = [("ns", f"old-{i}") for i in range(5)]
    new = [("ns", f"new-{i}") for i in range(3)]

    async def reconcile(key: Key) -> float | None:
        order.append(key)
        await asyncio.sleep(0.01)
        return None

    async def scenario() -> None:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600, workers=1)
        for key in known:
            controller.enqueue(key)
        await run_for(controller, 0.2)  # the known jobs have had their first pass
        order.clear()
        for key in known:
            controller.enqueue(key)  # e.g. their pods became Ready
        for key in new:
            controller.enqueue(key)  # enqueued later, served first
        await run_for(controller, 0.3)

    asyncio.run(scenario())
    assert order[: len(new)] == new
    assert sorted(order[len(new) :]) == sorted(known)


def test_the_first_pass_memory_is_pruned_to_listed_jobs_at_resync() -> None:
    async def reconcile(key: Key) -> float | None:
        return None

    async def only_a() -> list[Key]:
        return [A]

    async def scenario() -> Controller:
        controller = Controller(reconcile=reconcile, list_keys=only_a, resync_seconds=0.05)
        controller.enqueue(B)
        await run_for(controller, 0.3)
        return controller

    controller = asyncio.run(scenario())
    assert controller._passed == {A}


def test_a_replica_that_loses_its_lease_runs_none_of_its_backlog_and_keeps_it_for_later() -> None:
    """200 passes queued for 4 workers; the lease is lost while the first 4 run. No further pass
    starts while this replica does not lead, and none is lost: all run once it leads again."""
    leading = True
    ran: list[Key] = []

    async def reconcile(key: Key) -> float | None:
        ran.append(key)
        await asyncio.sleep(0.01)
        return None

    async def scenario() -> tuple[int, int]:
        nonlocal leading
        controller = Controller(
            reconcile=reconcile, list_keys=no_keys, workers=4, resync_seconds=3600, is_active=lambda: leading
        )
        for i in range(200):
            controller.enqueue(("ns", f"job-{i}"))
        task = asyncio.create_task(controller.run())
        while not ran:
            await asyncio.sleep(0)
        leading = False
        await asyncio.sleep(0.5)
        ran_while_deposed, kept = len(ran), controller.depth()
        leading = True
        await asyncio.sleep(2.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ran_while_deposed, kept

    ran_while_deposed, kept = asyncio.run(scenario())
    assert ran_while_deposed <= 4, f"{ran_while_deposed} passes ran after the lease was lost"
    assert kept == 200 - ran_while_deposed
    assert sorted(Counter(ran).values()) == [1] * 200


def test_a_pass_that_fails_because_the_lease_was_lost_is_requeued_not_backed_off() -> None:
    leading = True
    times: list[float] = []

    async def reconcile(key: Key) -> float | None:
        nonlocal leading
        times.append(asyncio.get_running_loop().time())
        if len(times) == 1:
            leading = False  # lost during the pass, which stops before its next write
            raise RuntimeError("no longer the leader")
        return None

    async def scenario() -> Controller:
        nonlocal leading
        controller = Controller(
            reconcile=reconcile, list_keys=no_keys, resync_seconds=3600, is_active=lambda: leading
        )
        controller.enqueue(A)
        task = asyncio.create_task(controller.run())
        await asyncio.sleep(0.3)
        leading = True
        await asyncio.sleep(1.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return controller

    controller = asyncio.run(scenario())
    assert len(times) == 2 and controller.stats.failures == 0
    assert times[1] - times[0] < 1.5


def test_a_cancel_that_arrives_as_the_dispatcher_wakes_stops_the_controller() -> None:
    """Python 3.11's asyncio.wait_for returned the wait's result when a cancel arrived in the same
    loop turn as the wake, and the dispatcher's loop then outlived the TaskGroup's shutdown: the
    operator could not stop (seen as a test hung for 16 minutes)."""

    async def reconcile(key: Key) -> float | None:
        return None

    async def scenario() -> bool:
        controller = Controller(reconcile=reconcile, list_keys=no_keys, resync_seconds=3600)
        task = asyncio.create_task(controller.run())
        return await stops_when_cancelled_as_it_wakes(task, lambda: controller.enqueue(A))

    assert asyncio.run(scenario()), "the controller kept running after it was cancelled"
