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
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp

from asyncgrpo_operator import k8s
from asyncgrpo_operator.controller import Controller
from asyncgrpo_operator.leader import LeaseElector
from asyncgrpo_operator.reconciler import ConflictError, Key, Reconciler

log = logging.getLogger(__name__)

MEMO_KEY = "asyncgrpo"
WATCH_NAMESPACES_ENV = "ASYNCGRPO_WATCH_NAMESPACES"
"""Comma-separated namespaces the resync lists (default: all). Match kopf's --namespace flags."""
RESYNC_ENV = "ASYNCGRPO_RESYNC_SECONDS"
WORKERS_ENV = "ASYNCGRPO_WORKERS"
LEADER_ELECTION_ENV = "ASYNCGRPO_LEADER_ELECTION"
"""true: only the holder of the Lease asyncgrpo-operator reconciles (for more than one replica)."""
LEADER_NAMESPACE_ENV = "ASYNCGRPO_LEADER_ELECTION_NAMESPACE"
"""Namespace of the Lease (default: $POD_NAMESPACE, which the chart sets)."""


@dataclass
class Runtime:
    """Everything the handlers share."""

    api: k8s.Api
    session: aiohttp.ClientSession
    reconciler: Reconciler
    controller: Controller
    task: asyncio.Task[None]
    elector: LeaseElector | None = None
    elector_task: asyncio.Task[None] | None = None

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

    elector = _elector(api)
    controller = Controller(
        reconcile=reconciler.reconcile,
        list_keys=list_keys,
        workers=int(os.environ.get(WORKERS_ENV, "16")),
        resync_seconds=float(os.environ.get(RESYNC_ENV, "60")),
        conflict_errors=(ConflictError,),
        is_active=(lambda: elector.is_leader) if elector is not None else (lambda: True),
    )
    task = asyncio.create_task(controller.run(), name="asyncgrpo-controller")
    elector_task = (
        asyncio.create_task(elector.run(), name="asyncgrpo-leader") if elector is not None else None
    )
    runtime = Runtime(
        api=api,
        session=session,
        reconciler=reconciler,
        controller=controller,
        task=task,
        elector=elector,
        elector_task=elector_task,
    )
    memo[MEMO_KEY] = runtime
    log.info("controller started", extra={"namespaces": namespaces or "all"})
    return runtime


async def stop(memo: Any) -> None:
    """Stop the queue (in-flight passes are cancelled; they are idempotent) and close clients."""
    runtime = memo.get(MEMO_KEY)
    if not isinstance(runtime, Runtime):
        return
    for task in (runtime.task, runtime.elector_task):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    await runtime.session.close()
    await runtime.api.close()


def _elector(api: k8s.Api) -> LeaseElector | None:
    if os.environ.get(LEADER_ELECTION_ENV, "").lower() not in {"1", "true", "yes"}:
        return None
    namespace = os.environ.get(LEADER_NAMESPACE_ENV) or os.environ.get("POD_NAMESPACE") or "default"
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}"
    log.info("leader election on", extra={"lease_namespace": namespace, "identity": identity})
    return LeaseElector(api, namespace, identity)
