"""Delivering an elastic fleet's drain request: the operator's sender (drain.py) against the
trainer's own /progress server (asyncgrpo_trainer.progress) on 127.0.0.1 with the job's token, and
against a server that counts the POSTs (how often a pending request is sent again)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from asyncgrpo_operator import drain, progress
from asyncgrpo_trainer import progress as driver
from tests.operator.test_progress_polling import serve

TOKEN = "the-jobs-ray-token"
WORKER = "demo-0-generation-worker-1"
JOB = ("team", "demo")


@contextlib.asynccontextmanager
async def running_sender(retry_seconds: float = 0.1) -> AsyncIterator[tuple[drain.Drainer, list[drain.Key]]]:
    """A running sender; the list collects the jobs it says have a refusal to report."""
    changed: list[drain.Key] = []
    async with aiohttp.ClientSession() as session:
        sender = drain.Drainer(session, changed=changed.append, retry_seconds=retry_seconds)
        task = asyncio.create_task(sender.run())
        try:
            yield sender, changed
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def drain_url(port: int) -> str:
    """The operator's drain URL for a driver whose /progress is on `port` (the default layout)."""
    return progress.drain_url_template(f"http://127.0.0.1:{port}/progress")


def test_the_driver_records_a_drain_request_sent_with_the_jobs_token() -> None:
    server = driver.ProgressServer(0, host="127.0.0.1", token=TOKEN)

    async def scenario() -> None:
        async with running_sender() as (sender, changed):
            assert sender.deliver(JOB, drain.Request(drain_url(server.port), TOKEN, WORKER)) is None
            await eventually(lambda: server.drain_requests(0) == [WORKER], "the driver to record the drain")
            await asyncio.sleep(0.5)  # asked again meanwhile: still recorded once, nothing to report
            assert server.drain_requests(0) == [WORKER] and changed == []

    try:
        asyncio.run(scenario())
    finally:
        server.close()


def test_a_refused_drain_is_reported_once_with_the_drivers_answer() -> None:
    server = driver.ProgressServer(0, host="127.0.0.1", token=TOKEN)
    too_long = "w" * (driver.MAX_POD_NAME + 1)

    async def scenario() -> None:
        async with running_sender() as (sender, changed):
            request = drain.Request(drain_url(server.port), TOKEN, too_long)
            assert sender.deliver(JOB, request) is None
            await eventually(lambda: changed == [JOB], "the refusal to be signalled")
            refusal = sender.deliver(JOB, request)
            assert refusal is not None and refusal.startswith("HTTP 400: ") and "at most 253" in refusal
            await asyncio.sleep(0.5)  # refused again on every retry: reported once, not per retry
            assert sender.deliver(JOB, request) is None and changed == [JOB]
            # The wrong token is refused too, and that is a new answer to report.
            wrong = drain.Request(drain_url(server.port), "not-the-jobs-token", WORKER)
            sender.deliver(JOB, wrong)
            await eventually(lambda: len(changed) == 2, "the second refusal to be signalled")
            assert sender.deliver(JOB, wrong) == "HTTP 403"
            assert server.drain_requests(0) == []

    try:
        asyncio.run(scenario())
    finally:
        server.close()


def test_a_pending_drain_is_sent_again_less_and_less_often_until_the_pass_stops_asking() -> None:
    posts: list[float] = []

    async def scenario() -> None:
        async def accept(request: web.Request) -> web.Response:
            posts.append(time.monotonic())
            return web.json_response({"drainedWorkers": []}, status=202)

        runner, url = await serve(accept, "POST", "/drain")
        try:
            async with running_sender(retry_seconds=0.1) as (sender, _):
                sender.deliver(JOB, drain.Request(url, TOKEN, WORKER))
                await eventually(lambda: len(posts) >= 4, "four POSTs")
                sender.forget(JOB)
                stopped = len(posts)
                await asyncio.sleep(1.0)
                assert len(posts) <= stopped + 1  # at most one already in flight
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    # Each wait doubles (0.1, 0.2, 0.4 s): lower bounds, which a loaded machine only lengthens.
    gaps = [b - a for a, b in itertools.pairwise(posts)][:3]
    assert gaps[1] >= 0.15 and gaps[2] >= 0.3, f"the retries do not back off: {gaps}"


def test_the_drain_url_sits_beside_the_progress_url_in_the_operators_template() -> None:
    assert progress.drain_url_template("http://{pod_ip}:{port}/progress") == "http://{pod_ip}:{port}/drain"
    proxied = "http://proxy:9999/progress/{namespace}/{job}"
    assert progress.drain_url_template(proxied) == "http://proxy:9999/drain/{namespace}/{job}"
