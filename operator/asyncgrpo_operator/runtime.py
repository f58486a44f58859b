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
from aiohttp import web

from asyncgrpo_operator import k8s, progress
from asyncgrpo_operator import metrics as metrics_module
from asyncgrpo_operator.controller import Controller
from asyncgrpo_operator.leader import LeaseElector, Timing
from asyncgrpo_operator.metrics import Metrics
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
LEADER_TIMING_ENV = "ASYNCGRPO_LEADER_ELECTION_TIMING"
"""leaseDuration,renewDeadline,retryPeriod in seconds (default 15,10,2, client-go's)."""
DRY_RUN_ENV = "ASYNCGRPO_WEBHOOK_DRY_RUN"
"""false: the admission webhook does not dry-run the job's RayCluster (default true; webhook.py)."""


@dataclass
class Runtime:
    """Everything the handlers share."""

    api: k8s.Api
    session: aiohttp.ClientSession
    reconciler: Reconciler
    controller: Controller
    metrics: Metrics
    task: asyncio.Task[None]
    elector: LeaseElector | None = None
    elector_task: asyncio.Task[None] | None = None
    metrics_server: web.AppRunner | None = None
    admission_dry_run: bool = True
    dry_runs_in_flight: int = 0
    """The admission webhook's RayCluster dry-runs running now (dryrun.MAX_IN_FLIGHT bounds it)."""

    def enqueue(self, namespace: str | None, name: str | None, delay: float = 0.0) -> None:
        if namespace and name:
            self.controller.enqueue((namespace, name), delay)

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else True


def of(memo: Any) -> Runtime:
    """The runtime stored in kopf's memo by the startup handler."""
    runtime = memo[MEMO_KEY]
    assert isinstance(runtime, Runtime)
    return runtime


def find(memo: Any) -> Runtime | None:
    """The runtime, or None before the startup handler built it (the webhook may be asked first)."""
    runtime = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    return runtime if isinstance(runtime, Runtime) else None


async def start(memo: Any) -> Runtime:
    """Connect, build the reconciler and the queue, start the queue (and the metrics endpoint)."""
    template = progress.check_url_template(
        os.environ.get(progress.URL_TEMPLATE_ENV) or progress.DEFAULT_URL_TEMPLATE
    )
    metrics = Metrics()
    api = await k8s.Api.connect(metrics)
    session = aiohttp.ClientSession()
    reconciler = Reconciler(api, session, progress_url_template=template)
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
        metrics=metrics,
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
        metrics=metrics,
        task=task,
        elector=elector,
        elector_task=elector_task,
        admission_dry_run=os.environ.get(DRY_RUN_ENV, "true").lower() not in {"0", "false", "no"},
    )
    metrics.watch(
        phases=reconciler.memory.phases.values,
        queue_depth=controller.depth,
        in_flight=controller.in_flight,
        is_leader=lambda: runtime.is_leader,
    )
    port = os.environ.get(metrics_module.PORT_ENV)
    if port:
        runtime.metrics_server = await metrics_module.serve(metrics, int(port))
    memo[MEMO_KEY] = runtime
    log.info("controller started", extra={"namespaces": namespaces or "all", "progress_url": template})
    return runtime


async def stop(memo: Any) -> None:
    """Stop acting, then give the Lease up, then close the clients.

    In-flight passes are cancelled (they are idempotent). The Lease is released only once this
    replica has stopped reconciling, so the standby that takes it over never overlaps with it.
    """
    runtime = memo.get(MEMO_KEY)
    if not isinstance(runtime, Runtime):
        return
    await _cancel(runtime.task)
    if runtime.elector is not None:
        await _cancel(runtime.elector_task)
        await runtime.elector.release()
    if runtime.metrics_server is not None:
        await runtime.metrics_server.cleanup()
    await runtime.session.close()
    await runtime.api.close()


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _elector(api: k8s.Api) -> LeaseElector | None:
    if os.environ.get(LEADER_ELECTION_ENV, "").lower() not in {"1", "true", "yes"}:
        return None
    namespace = os.environ.get(LEADER_NAMESPACE_ENV) or os.environ.get("POD_NAMESPACE") or "default"
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}"
    timing = Timing()
    if os.environ.get(LEADER_TIMING_ENV):
        lease, renew, retry = (float(v) for v in os.environ[LEADER_TIMING_ENV].split(","))
        timing = Timing(lease, renew, retry)
    log.info(
        "leader election on",
        extra={"lease_namespace": namespace, "identity": identity, "timing": timing},
    )
    return LeaseElector(api, namespace, identity, timing=timing)
