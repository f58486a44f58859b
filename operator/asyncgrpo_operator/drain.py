"""Delivering an elastic fleet's drain request to the driver: POST /drain {"worker": "<pod>"}.

The plan names the generation worker to drain (status.generationFleet.drainRequest) and, on every
pass until the driver's /progress lists it in drainedWorkers, plans `DeliverDrain`; the reconciler
hands it here with the driver's /drain URL and the job's Ray token, and stops asking once the pass
no longer plans it (drained, the request cleared, the driver gone). The POST runs outside the
passes, like the /progress reads: the head pod runs the job author's code and may hang, so each
POST is bounded in time and in the answer read, and no pass waits on it.

The driver records a pod once however often it is asked, so the request is sent again while the
pass still asks, at intervals that double from RETRY_SECONDS up to progress.MAX_BACKOFF_SECONDS:
a driver that restarted since the first POST hears it again, and no head is asked more than once a
minute in the long run. A 4xx answer (the driver refuses this request: its pool is not elastic, the
name is malformed, it does not take the token) is kept for the pass to report as a Warning event,
once per distinct answer; other failures (not listening yet, 5xx, a timeout) are only retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from asyncgrpo_api import ray_auth
from asyncgrpo_operator.progress import MAX_BACKOFF_SECONDS, READ_TIMEOUT_SECONDS

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of a job."""

RETRY_SECONDS = 2.0
"""The wait after the first POST of a request; each later wait doubles."""
MAX_ANSWER_BYTES = 4096
"""The most of the driver's answer read (quoted in a refusal's event)."""


@dataclass(frozen=True)
class Request:
    """What to ask of which driver."""

    url: str
    token: str
    worker: str


@dataclass
class _Target:
    request: Request
    due: float
    posts: int = 0
    sending: bool = False
    refusal: str | None = None
    """The latest 4xx answer, as the event quotes it."""
    reported: str | None = None
    """The refusal the pass last reported."""


class Drainer:
    """Sends each job's pending drain request (`deliver`) until told to stop (`forget`).
    `changed` is told which job has a refusal to report (the work queue: a pass posts it)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        changed: Callable[[Key], None] = lambda _: None,
        retry_seconds: float = RETRY_SECONDS,
        timeout: float = READ_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.changed = changed
        self.retry_seconds = retry_seconds
        self.timeout = timeout
        self.clock = clock
        self._targets: dict[Key, _Target] = {}
        self._wake = asyncio.Event()

    def deliver(self, key: Key, request: Request) -> str | None:
        """Send `request` for the job from now on (a new one at once; the same one stays on its
        schedule). Returns a refusal of it not reported yet, which the caller reports."""
        target = self._targets.get(key)
        if target is None or target.request != request:
            target = self._targets[key] = _Target(request, due=self.clock())
            self._wake.set()
        if target.refusal is None or target.refusal == target.reported:
            return None
        target.reported = target.refusal
        return target.refusal

    def forget(self, key: Key) -> None:
        """Stop sending the job's request."""
        self._targets.pop(key, None)

    async def run(self) -> None:
        """Start due POSTs, until cancelled."""
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                now = self.clock()
                for key, target in list(self._targets.items()):
                    if not target.sending and target.due <= now:
                        target.sending = True
                        group.create_task(self._send(key, target), name="asyncgrpo-drain")
                later = [t.due - now for t in self._targets.values() if not t.sending and t.due > now]
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min([1.0, *later])):
                        await self._wake.wait()

    async def _send(self, key: Key, target: _Target) -> None:
        started = self.clock()
        try:
            refusal = await post_drain(self.session, target.request, self.timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("drain request not delivered", extra={"job": "/".join(key), "error": repr(exc)})
            refusal = None
        except Exception:  # a POST must never end the loop
            log.exception("drain request failed", extra={"job": "/".join(key)})
            refusal = None
        finally:
            target.sending = False
            target.posts += 1
            target.due = started + min(self.retry_seconds * 2 ** (target.posts - 1), MAX_BACKOFF_SECONDS)
            self._wake.set()
        if refusal is not None and refusal != target.refusal and self._targets.get(key) is target:
            target.refusal = refusal
            self.changed(key)


async def post_drain(session: aiohttp.ClientSession, request: Request, timeout: float) -> str | None:
    """POST the request; None when the driver took it or failed for a reason worth a retry (5xx),
    else its refusal ("HTTP 400: <answer>"). Raises aiohttp.ClientError or TimeoutError when no
    answer came. Redirects are not followed (see progress.py)."""
    async with session.post(
        request.url,
        json={"worker": request.worker},
        headers={"Authorization": ray_auth.authorization(request.token)},
        timeout=aiohttp.ClientTimeout(total=timeout),
        allow_redirects=False,
    ) as response:
        if not 400 <= response.status < 500:
            return None
        answer = await response.content.read(MAX_ANSWER_BYTES)
        text = answer.decode("utf-8", "replace").strip()
        return f"HTTP {response.status}: {text}" if text else f"HTTP {response.status}"
