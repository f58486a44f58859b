"""Run the operator's real admission pipeline in-process: our kopf server, kopf's admission engine.

Only the pieces the kopf operator would wire up itself are assembled here (kopf offers no public
API to serve webhooks without also connecting to a cluster); the handler, the TLS server and the
response format are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
from kopf._cogs.structs import ephemera, references
from kopf._core.engines import admission, indexing
from kopf._core.reactor import inventory

from asyncgrpo_api.v1alpha1 import GROUP, KIND, PLURAL, VERSION
from asyncgrpo_operator.webhook import WebhookConfig, configure_admission

RESOURCE = references.Resource(GROUP, VERSION, PLURAL, kind=KIND, namespaced=True)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(config: WebhookConfig) -> AsyncIterator[kopf.OperatorSettings]:
    """Serve the webhook as the operator would after `configure_admission(settings)`."""
    settings = kopf.OperatorSettings()
    configure_admission(settings, config)
    insights = references.Insights()
    insights.webhook_resources.add(RESOURCE)
    webhookfn = functools.partial(
        admission.serve_admission_request,
        settings=settings,
        registry=kopf.get_default_registry(),
        insights=insights,
        memories=inventory.ResourceMemories(),
        memobase=ephemera.AnyMemo(kopf.Memo()),
        indices=indexing.OperatorIndexers().indices,
    )
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    started = asyncio.Event()

    async def run() -> None:
        async with server:
            async for _ in server(webhookfn):
                started.set()

    task = asyncio.create_task(run())
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        yield settings
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def admission_review(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview as kube-apiserver sends it."""
    obj = new if new is not None else old
    assert obj is not None
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": GROUP, "version": VERSION, "kind": KIND},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "requestKind": {"group": GROUP, "version": VERSION, "kind": KIND},
            "requestResource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "name": obj["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "tester", "groups": ["system:authenticated"]},
            "object": new,
            "oldObject": old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


async def post(url: str, cafile: Path, review: dict[str, Any]) -> dict[str, Any]:
    """POST a review over TLS, verifying the server against `cafile` as the API server would."""
    context = ssl.create_default_context(cafile=str(cafile))
    async with aiohttp.ClientSession() as session, session.post(url, json=review, ssl=context) as resp:
        resp.raise_for_status()
        return json.loads(await resp.text())  # type: ignore[no-any-return]
