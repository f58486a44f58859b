"""The operator's long-lived parts, built at startup and kept in kopf's memo.

kopf hands every handler the same `memo`; the watch handlers find the work queue there, the probe
finds the queue's heartbeat, and the cleanup handler closes the clients. Nothing is global, so
tests can run an operator in-process next to other code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import aiohttp

from asyncgrpo_operator import k8s
from asyncgrpo_operator.controller import Controller
from asyncgrpo_operator.reconciler import ConflictError, Key, Reconciler

log = logging.getLogger(__name__)

MEMO_KEY = "asyncgrpo"
WATCH_NAMESPACES_ENV = "ASYNCGRPO_WATCH_NAMESPACES"
"""Comma-separated namespaces the resync lists (default: all). Match kopf's --namespace flags."""
RESYNC_ENV = "ASYNCGRPO_RESYNC_SECONDS"
WORKERS_ENV = "ASYNCGRPO_WORKERS"


@dataclass
class Runtime:
    """Everything the handlers share."""

    api: k8s.Api
    session: aiohttp.ClientSession
    reconciler: Reconciler
    controller: Controller
    task: asyncio.Task[None]

    def enqueue(self, namespace: str | None, name: str | None, delay: float = 0.0) -> None:
        if namespace and name:
            self.controller.enqueue((namespace, name), delay)


def of(memo: Any) -> Runtime:
    """The runtime stored in kopf's memo by the startup handler."""
    runtime = memo[MEMO_KEY]
    assert isinstance(runtime, Runtime)
    return runtime


async def start(memo: Any) -> Runtime:
    """Connect, build the reconciler and the queue, and start the queue in the background."""
    api = await k8s.Api.connect()
    session = aiohttp.ClientSession()
    reconciler = Reconciler(api, session)
    namespaces = [n.strip() for n in os.environ.get(WATCH_NAMESPACES_ENV, "").split(",") if n.strip()]

    async def list_keys() -> list[Key]:
        jobs: list[dict[str, Any]] = []
        scopes: list[str | None] = list(namespaces) if namespaces else [None]
        for namespace in scopes:
            jobs += await api.list_jobs(namespace)
        return [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs]

    controller = Controller(
        reconcile=reconciler.reconcile,
        list_keys=list_keys,
        workers=int(os.environ.get(WORKERS_ENV, "4")),
        resync_seconds=float(os.environ.get(RESYNC_ENV, "60")),
        conflict_errors=(ConflictError,),
    )
    task = asyncio.create_task(controller.run(), name="asyncgrpo-controller")
    runtime = Runtime(api=api, session=session, reconciler=reconciler, controller=controller, task=task)
    memo[MEMO_KEY] = runtime
    log.info("controller started", extra={"namespaces": namespaces or "all"})
    return runtime


async def stop(memo: Any) -> None:
    """Stop the queue (in-flight passes are cancelled; they are idempotent) and close clients."""
    runtime = memo.get(MEMO_KEY)
    if not isinstance(runtime, Runtime):
        return
    runtime.task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await runtime.task
    await runtime.session.close()
    await runtime.api.close()
