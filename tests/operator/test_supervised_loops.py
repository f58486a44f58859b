"""The operator's long-lived loops are supervised (issue 47, item 14): an informer, the /progress
poller or the work queue that ends is started again, so the operator is never alive but blind; the
liveness probe fails only when a supervisor itself is gone.

The runtime is started for real (runtime.start, every informer and loop), against an API server
played in memory: lists answer at once, watches stay open until cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kopf
import pytest

from asyncgrpo_operator import k8s, runtime, supervisor
from asyncgrpo_operator.handlers import lifecycle


class QuietApi:
    """Every streaming list is empty; every watch then waits until it is cancelled. Records the
    lists."""

    def __init__(self) -> None:
        self.lists: list[str] = []

    async def watch(self, path: str, *_: Any, initial_events: bool = False, **__: Any) -> AsyncIterator[Any]:
        if initial_events:
            self.lists.append(path)
            yield {
                "type": "BOOKMARK",
                "object": {
                    "metadata": {"resourceVersion": "1", "annotations": {k8s.INITIAL_EVENTS_END: "true"}}
                },
            }
        await asyncio.Event().wait()

    async def list_jobs(self, namespace: str | None = None) -> tuple[list[Any], str]:
        return [], "1"

    async def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fast_restarts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(supervisor, "MIN_BACKOFF_SECONDS", 0.0)
    monkeypatch.delenv(runtime.WATCH_NAMESPACES_ENV, raising=False)
    monkeypatch.delenv(runtime.LEADER_ELECTION_ENV, raising=False)
    yield


async def until(check: Any, what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def the_task(name: str) -> asyncio.Task[Any] | None:
    return next((t for t in asyncio.all_tasks() if t.get_name() == name), None)


async def started(api: QuietApi, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    async def connect(metrics: Any = None) -> QuietApi:
        return api

    monkeypatch.setattr(k8s.Api, "connect", connect)
    memo: dict[str, Any] = {}
    await runtime.start(memo)
    await until(lambda: len(api.lists) == 4, "the four informers' first lists")
    return memo


def test_a_killed_informer_task_is_started_again_and_lists_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        api = QuietApi()
        memo = await started(api, monkeypatch)
        rt = runtime.of(memo)
        killed = the_task("asyncgrpo-watch-workloads-all")
        assert killed is not None
        killed.cancel()
        await until(lambda: len(api.lists) == 5, "the Workloads' informer listing again")
        assert api.lists[-1] == "/apis/kueue.x-k8s.io/v1beta2/workloads"
        restarts = rt.metrics.registry.get_sample_value(
            "asyncgrpo_task_restarts_total", {"task": "asyncgrpo-watch-workloads-all"}
        )
        assert restarts == 1
        assert (await lifecycle.controller_alive(memo=memo))["passes"] == 0  # alive, and says so
        await runtime.stop(memo)

    asyncio.run(scenario())


def test_the_poller_and_the_work_queue_are_started_again_too(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        memo = await started(QuietApi(), monkeypatch)
        rt = runtime.of(memo)

        def restarts(task: str) -> float | None:
            return rt.metrics.registry.get_sample_value("asyncgrpo_task_restarts_total", {"task": task})

        for name in ("asyncgrpo-progress-poller", "asyncgrpo-controller"):
            killed = the_task(name)
            assert killed is not None
            killed.cancel()
            await until(lambda name=name: restarts(name) == 1, f"{name} started again")
            await until(
                lambda name=name, killed=killed: the_task(name) not in (None, killed), f"a new {name}"
            )
        await lifecycle.controller_alive(memo=memo)
        await runtime.stop(memo)

    asyncio.run(scenario())


def test_the_liveness_probe_fails_when_a_loop_is_no_longer_supervised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        memo = await started(QuietApi(), monkeypatch)
        rt = runtime.of(memo)
        rt.poller.cancel()  # the supervisor itself, which nothing restarts
        await until(rt.poller.done, "the supervisor gone")
        with pytest.raises(kopf.PermanentError, match="supervise-asyncgrpo-progress-poller"):
            await lifecycle.controller_alive(memo=memo)
        await runtime.stop(memo)

    asyncio.run(scenario())


def test_a_loop_that_keeps_failing_is_restarted_later_and_later(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "MIN_BACKOFF_SECONDS", 0.01)
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(0)

    async def broken() -> None:
        raise RuntimeError("fails at once")

    async def scenario() -> None:
        monkeypatch.setattr(asyncio, "sleep", recorded)
        task = asyncio.create_task(supervisor.supervise("broken", broken))
        while len(sleeps) < 4:
            await real_sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert sleeps[:4] == [0.01, 0.02, 0.04, 0.08]
