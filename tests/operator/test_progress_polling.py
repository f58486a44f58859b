"""Reading the driver's /progress from a real HTTP server started by the test."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from asyncgrpo_operator import naming, progress
from asyncgrpo_operator.observed import PodView, ProgressReading

DOC = {
    "step": 12,
    "maxSteps": 100,
    "policyVersion": 11,
    "rewardMean": 0.42,
    "accuracy": 0.375,
    "meanStaleness": 0.9,
    "tokensPerSecond": 1234.5,
    "lastCheckpointStep": 10,
    "validationReward": None,
    "validationAccuracy": 0.9,
    "state": "running",
    "error": None,
    "mode": "async",
    "counters": {"rollouts": 3.0},
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/progress", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/progress"


async def read_with(handler: Handler, timeout: float = 2.0) -> ProgressReading:
    runner, url = await serve(handler)
    try:
        async with aiohttp.ClientSession() as session:
            return await progress.read_progress(session, url, timeout=timeout)
    finally:
        await runner.cleanup()


def test_reads_the_progress_document() -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response(DOC)

    reading = asyncio.run(read_with(ok))
    assert reading == ProgressReading(
        step=12,
        max_steps=100,
        policy_version=11,
        reward_mean=0.42,
        accuracy=0.375,
        mean_staleness=0.9,
        tokens_per_second=1234.5,
        last_checkpoint_step=10,
        validation_reward=None,
        validation_accuracy=0.9,
        state="running",
        error=None,
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda: web.Response(status=503, text="starting"), "HTTP 503"),
        (lambda: web.Response(text="not json"), "JSONDecodeError"),
        (lambda: web.json_response([1, 2]), "not a JSON object"),
    ],
)
def test_a_bad_answer_is_a_progress_error_naming_the_cause(
    answer: Callable[[], web.Response], expected: str
) -> None:
    async def bad(_: web.Request) -> web.Response:
        return answer()

    with pytest.raises(progress.ProgressError, match=expected):
        asyncio.run(read_with(bad))


def test_a_driver_that_does_not_answer_in_time_is_a_progress_error() -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(DOC)

    with pytest.raises(progress.ProgressError, match="TimeoutError"):
        asyncio.run(read_with(slow, timeout=0.3))


def test_nothing_listening_is_a_progress_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def read() -> ProgressReading:
        async with aiohttp.ClientSession() as session:
            return await progress.read_progress(session, f"http://127.0.0.1:{port}/progress", timeout=1)

    with pytest.raises(progress.ProgressError, match=r"GET http://127\.0\.0\.1"):
        asyncio.run(read())


def test_wrong_types_in_the_document_become_unknown_values() -> None:
    reading = ProgressReading.from_json({"step": "7", "rewardMean": "high", "maxSteps": True, "state": None})
    assert (reading.step, reading.reward_mean, reading.max_steps, reading.state) == (7, None, 0, "starting")


def head_pod(ip: str | None) -> PodView:
    return PodView(name="h", uid="u", node_type="head", group="headgroup", owner_uid="rc", ip=ip)


def test_progress_url_is_the_head_pod_ip_unless_the_job_overrides_it() -> None:
    job: dict[str, Any] = {"metadata": {"annotations": {}}}
    assert progress.progress_url(job, head_pod("10.1.2.3")) == "http://10.1.2.3:8090/progress"
    assert progress.progress_url(job, head_pod(None)) is None
    job["metadata"]["annotations"][naming.PROGRESS_URL_ANNOTATION] = "http://127.0.0.1:9999/progress"
    assert progress.progress_url(job, None) == "http://127.0.0.1:9999/progress"


def test_the_document_matches_what_the_trainer_serves() -> None:
    trainer_progress = pytest.importorskip("asyncgrpo_trainer.progress")
    served = trainer_progress.Progress(step=3, max_steps=9, reward_mean=0.5, state="running").to_json()
    reading = ProgressReading.from_json(json.loads(json.dumps(served)))
    assert (reading.step, reading.max_steps, reading.reward_mean, reading.state) == (3, 9, 0.5, "running")


def test_progress_figures_are_rounded_for_kubectl_get() -> None:
    reading = ProgressReading.from_json(
        {
            "step": 3,
            "rewardMean": 0.4124999977648258,
            "meanStaleness": 0.66666667,
            "tokensPerSecond": 2091.95680,
        }
    )
    assert (reading.reward_mean, reading.mean_staleness, reading.tokens_per_second) == (0.4125, 0.667, 2092.0)
