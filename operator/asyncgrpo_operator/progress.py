"""Reading the driver's /progress endpoint.

The driver serves GET /progress on the head pod (DRIVER_PROGRESS_PORT); the operator reads it and
is the only writer of status.progress. Where it reads is the operator's setting, never the job's:
a URL a job author could choose would make the operator send requests wherever they like from
inside the cluster (request forgery), and copy the answers' error text into the status. The
default is the head pod's own IP; an operator that cannot reach pod IPs (a local run, the tests,
a proxy) is given a template with `--progress-url-template` / ASYNCGRPO_PROGRESS_URL_TEMPLATE.
The driver's /drain (drain.py) is found by the same template, its `progress` segment read as
`drain`. Redirects are not followed, for the same reason. Every read carries the job's Ray token (the
driver refuses a read without it, asyncgrpo_api.ray_auth), so the figures, like the job's Ray
ports, are only for the operator and whoever may read the job's Secret.

The head pod runs the job author's code, so its answers are untrusted, and they are read outside
the reconcile passes (`Poller`, as KubeRay moved its dashboard calls out of its reconciler): a
pass only reads the latest result. A fixed number of reads run at once, each bounded in time
(READ_TIMEOUT_SECONDS) and size (MAX_BODY_BYTES), parsed in a thread (a deeply nested document
costs CPU and recursion, not the event loop that also renews the lease and answers admission), and
a head that fails is read less and less often. So heads that hang or send gigabytes delay only
their own jobs' figures, never another job's pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from asyncgrpo_api import ray_auth
from asyncgrpo_api.v1alpha1.runtime import MIN_POLL_SECONDS
from asyncgrpo_operator import naming
from asyncgrpo_operator.observed import PodView, ProgressReading

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of a job."""

READ_TIMEOUT_SECONDS = 3.0
MAX_BODY_BYTES = 1 << 20
"""The largest /progress answer read (the trainer's is under 1 KiB)."""
SLOTS = 16
"""Reads in flight at once, over all jobs."""
MAX_BACKOFF_SECONDS = 60.0
"""The longest wait between two reads of a head whose reads keep failing."""
DEFAULT_URL_TEMPLATE = "http://{pod_ip}:{port}/progress"
URL_TEMPLATE_ENV = "ASYNCGRPO_PROGRESS_URL_TEMPLATE"
PLACEHOLDERS = frozenset({"pod_ip", "port", "namespace", "job", "pod"})


class ProgressError(Exception):
    """The endpoint did not answer with a JSON object."""


class NotListeningError(ProgressError):
    """Nothing accepted the connection (the driver's server is not up yet): a cheap failure."""


def check_url_template(template: str) -> str:
    """The template, or ValueError naming what is wrong with it (checked once, at startup)."""
    fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    unknown = fields - PLACEHOLDERS
    if unknown:
        raise ValueError(
            f"{URL_TEMPLATE_ENV}: unknown placeholder(s) {sorted(unknown)}; use {sorted(PLACEHOLDERS)}"
        )
    if urlsplit(template).scheme not in ("http", "https"):
        raise ValueError(f"{URL_TEMPLATE_ENV}: {template!r} must be an http:// or https:// URL")
    drain_url_template(template)
    return template


def drain_url_template(template: str) -> str:
    """Where the driver's /drain is (drain.py): beside its /progress, the template with its path
    segment `progress` read as `drain`, so one setting routes both."""
    parts = urlsplit(template)
    segments = parts.path.split("/")
    if "progress" not in segments:
        raise ValueError(
            f"{URL_TEMPLATE_ENV}: {template!r} needs a path segment `progress` (the driver's /drain is "
            "the same URL with `drain` in its place), e.g. http://{pod_ip}:{port}/progress"
        )
    segments[segments.index("progress")] = "drain"
    return urlunsplit(parts._replace(path="/".join(segments)))


def progress_url(template: str, namespace: str, job: str, head: PodView | None) -> str | None:
    """Where to read the job's progress, or None while there is nowhere to read it from.

    Only the operator's template and facts the operator observed go in: the head pod's IP (from
    the pod's status) and names. Nothing the job's author writes chooses the host.
    """
    if head is None or (not head.ip and "{pod_ip}" in template):
        return None
    ip = head.ip or ""
    return template.format(
        pod_ip=f"[{ip}]" if ":" in ip else ip,  # an IPv6 address needs brackets in a URL
        port=naming.PROGRESS_PORT,
        namespace=quote(namespace, safe=""),
        job=quote(job, safe=""),
        pod=quote(head.name, safe=""),
    )


async def read_progress(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    timeout: float = READ_TIMEOUT_SECONDS,
    max_bytes: int = MAX_BODY_BYTES,
) -> ProgressReading:
    """GET the progress document with the job's Ray `token`; raises ProgressError with a short,
    human-readable cause. At most `max_bytes` are read and the whole exchange takes at most
    `timeout` seconds."""
    try:
        async with session.get(
            url,
            headers={"Authorization": ray_auth.authorization(token)},
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            if response.status in (401, 403):
                # The token in the job's Secret is not the one this operator derives (its key changed).
                raise ProgressError(
                    f"GET {url}: HTTP {response.status}: the driver refused the job's Ray token"
                )
            if response.status != 200:
                raise ProgressError(f"GET {url}: HTTP {response.status}")
            if (response.content_length or 0) > max_bytes:
                raise ProgressError(f"GET {url}: the answer is larger than {max_bytes} bytes")
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 << 10):
                body += chunk
                if len(body) > max_bytes:
                    raise ProgressError(f"GET {url}: the answer is larger than {max_bytes} bytes")
    except aiohttp.ClientConnectorError as exc:
        raise NotListeningError(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ProgressError(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    return await asyncio.to_thread(_parse, url, bytes(body))


def _parse(url: str, body: bytes) -> ProgressReading:
    """The document in `body` (run in a thread: parsing a hostile megabyte takes a while)."""
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ProgressError(f"GET {url}: {type(exc).__name__}: {str(exc)[:200]}".rstrip(": ")) from exc
    if not isinstance(document, dict):
        raise ProgressError(f"GET {url}: not a JSON object")
    return ProgressReading.from_json(document)


@dataclass(frozen=True)
class Poll:
    """The latest read of one job's /progress: the document, or why there is none."""

    read_at: datetime
    reading: ProgressReading | None
    error: str | None


@dataclass
class _Target:
    url: str
    token: str
    interval: float
    due: float
    failures: int = 0
    reading: bool = False


class Poller:
    """Reads the /progress of every job a pass asked for (`track`), each about once per its
    pollSeconds (at least MIN_POLL_SECONDS), with at most `slots` reads at once: heads whose last
    read succeeded first, then the earliest due. A failed read doubles the wait before the next
    one, up to MAX_BACKOFF_SECONDS, so heads that hang cannot keep the slots from the others; a
    refused connection (a driver still starting) is read again at its interval.
    `changed` is told which job has a result that differs from its previous one (the work queue:
    a pass writes it to the status). No read starts while `active` is False: a replica that lost
    its lease stops reading the heads along with its passes."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        changed: Callable[[Key], None] = lambda _: None,
        active: Callable[[], bool] = lambda: True,
        slots: int = SLOTS,
        timeout: float = READ_TIMEOUT_SECONDS,
        max_bytes: int = MAX_BODY_BYTES,
        min_interval: float = MIN_POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.changed = changed
        self.active = active
        self.slots = slots
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.min_interval = min_interval
        self.clock = clock
        self._targets: dict[Key, _Target] = {}
        self._latest: dict[Key, Poll] = {}
        self._busy = 0
        self._wake = asyncio.Event()

    def track(self, key: Key, url: str, interval: float, token: str) -> None:
        """Read `url` for the job, with its Ray `token`, from now on; a new URL (a new head pod) is
        read at once, and a result read from the old one is no longer the job's."""
        target = self._targets.get(key)
        interval = max(interval, self.min_interval)
        if target is not None and (target.url, target.token) == (url, token):
            target.interval = interval
            return
        self._targets[key] = _Target(url, token, interval, due=self.clock())
        self._latest.pop(key, None)
        self._wake.set()

    def forget(self, key: Key) -> None:
        """Stop reading the job's /progress (its driver is not running, or it is gone)."""
        self._targets.pop(key, None)
        self._latest.pop(key, None)

    def latest(self, key: Key) -> Poll | None:
        """The job's latest result, or None before the first read ended."""
        return self._latest.get(key)

    async def run(self) -> None:
        """Start due reads while slots are free, until cancelled."""
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                now = self.clock()
                active = self.active()
                idle = [(key, t) for key, t in self._targets.items() if active and not t.reading]
                due = sorted((t.failures > 0, t.due, key) for key, t in idle if t.due <= now)
                for _, _, key in due[: max(self.slots - self._busy, 0)]:
                    target = self._targets[key]
                    target.reading = True
                    self._busy += 1
                    group.create_task(self._read(key, target), name="asyncgrpo-progress")
                later = [t.due - now for _, t in idle if t.due > now]
                timeout = min([1.0, *later]) if self._busy < self.slots else 1.0
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the wait's result
                # when a cancel arrives as the wake fires, so the loop would outlive its cancel.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()

    async def _read(self, key: Key, target: _Target) -> None:
        started = self.clock()
        try:
            reading = await read_progress(
                self.session, target.url, target.token, self.timeout, self.max_bytes
            )
            poll = Poll(_now(), reading, None)
            target.failures = 0
        except NotListeningError as exc:
            # A driver that has not started its server yet (every driver, for its first seconds or
            # minutes) is refused at once and holds no slot: read it again at its interval, so the
            # first step shows when it happens, not after a backoff of up to a minute.
            poll = Poll(_now(), None, str(exc))
            target.failures = 0
        except ProgressError as exc:
            poll = Poll(_now(), None, str(exc))
            target.failures += 1
        except Exception as exc:  # a read must never end the poller
            log.exception("reading /progress failed", extra={"job": "/".join(key)})
            poll = Poll(_now(), None, f"{type(exc).__name__}: {exc}")
            target.failures += 1
        finally:
            target.reading = False
            self._busy -= 1
            self._wake.set()
        if self._targets.get(key) is not target:
            return  # forgotten, or another head, while it was read
        wait = min(target.interval * 2.0**target.failures, max(MAX_BACKOFF_SECONDS, target.interval))
        target.due = started + wait
        previous = self._latest.get(key)
        self._latest[key] = poll
        if previous is None or (previous.reading, previous.error) != (poll.reading, poll.error):
            self.changed(key)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
