"""Reading the driver's /progress endpoint.

The driver serves GET /progress on the head pod (DRIVER_PROGRESS_PORT); the operator reads it and
is the only writer of status.progress. The URL is the head pod's IP by default; the annotation
`asyncgrpo.dev/progress-url` on the job overrides it (a driver run as a local process, a proxy).
Reads are short (a few seconds) so a wedged driver cannot stall the reconcile loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from asyncgrpo_operator import naming
from asyncgrpo_operator.observed import PodView, ProgressReading

READ_TIMEOUT_SECONDS = 3.0


class ProgressError(Exception):
    """The endpoint did not answer with a JSON object."""


def progress_url(job: Mapping[str, Any], head: PodView | None) -> str | None:
    """Where to read the job's progress, or None while there is nowhere to read it from."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    override = annotations.get(naming.PROGRESS_URL_ANNOTATION)
    if override:
        return str(override)
    if head is None or not head.ip:
        return None
    return f"http://{head.ip}:{naming.PROGRESS_PORT}/progress"


async def read_progress(
    session: aiohttp.ClientSession, url: str, timeout: float = READ_TIMEOUT_SECONDS
) -> ProgressReading:
    """GET the progress document; raises ProgressError with a short, human-readable cause."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                raise ProgressError(f"GET {url}: HTTP {response.status}")
            document = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ProgressError(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if not isinstance(document, dict):
        raise ProgressError(f"GET {url}: not a JSON object")
    return ProgressReading.from_json(document)
