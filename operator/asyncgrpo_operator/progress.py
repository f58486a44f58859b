"""Reading the driver's /progress endpoint.

The driver serves GET /progress on the head pod (DRIVER_PROGRESS_PORT); the operator reads it and
is the only writer of status.progress. Where it reads is the operator's setting, never the job's:
a URL a job author could choose would make the operator send requests wherever they like from
inside the cluster (request forgery), and copy the answers' error text into the status. The
default is the head pod's own IP; an operator that cannot reach pod IPs (a local run, the tests,
a proxy) is given a template with `--progress-url-template` / ASYNCGRPO_PROGRESS_URL_TEMPLATE.
Redirects are not followed, for the same reason. Reads are short (a few seconds) so a wedged
driver cannot stall the reconcile loop.
"""

from __future__ import annotations

import string
from urllib.parse import quote, urlsplit

import aiohttp

from asyncgrpo_operator import naming
from asyncgrpo_operator.observed import PodView, ProgressReading

READ_TIMEOUT_SECONDS = 3.0
DEFAULT_URL_TEMPLATE = "http://{pod_ip}:{port}/progress"
URL_TEMPLATE_ENV = "ASYNCGRPO_PROGRESS_URL_TEMPLATE"
PLACEHOLDERS = frozenset({"pod_ip", "port", "namespace", "job", "pod"})


class ProgressError(Exception):
    """The endpoint did not answer with a JSON object."""


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
    return template


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
    session: aiohttp.ClientSession, url: str, timeout: float = READ_TIMEOUT_SECONDS
) -> ProgressReading:
    """GET the progress document; raises ProgressError with a short, human-readable cause."""
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False
        ) as response:
            if response.status != 200:
                raise ProgressError(f"GET {url}: HTTP {response.status}")
            document = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ProgressError(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if not isinstance(document, dict):
        raise ProgressError(f"GET {url}: not a JSON object")
    return ProgressReading.from_json(document)
