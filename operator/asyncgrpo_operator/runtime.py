"""The operator's long-lived parts, built at startup and kept in kopf's memo.

kopf hands every handler the same `memo`; the watch handlers find the work queue and the cache
there, the probe finds the queue's heartbeat, and the cleanup handler closes the clients. Nothing is
global, so tests can run an operator in-process next to other code.

The cache (cache.py) is filled by the job watch (kopf, handlers/jobs.py), by the resync's list of
jobs, and by one informer per child resource (Kueue's Workloads included) and watched namespace
(informer.py). No pass runs before each of them has listed once.

Every long-lived loop (the work queue, each informer, the /progress poller, the leader election,
the metrics certificate's reload) runs under a supervisor (supervisor.py) that starts it again if
it ever ends; the liveness probe fails only if a supervisor is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from asyncgrpo_operator import drain, k8s, metrics_tls, naming, progress, raytoken
from asyncgrpo_operator import metrics as metrics_module
from asyncgrpo_operator.cache import Cache, Key
from asyncgrpo_operator.controller import Controller
from asyncgrpo_operator.informer import Informer, Sink
from asyncgrpo_operator.leader import LeaseElector, Timing
from asyncgrpo_operator.manifests import OperatorPods
from asyncgrpo_operator.metrics import Metrics
from asyncgrpo_operator.metrics_access import MetricsAccess
from asyncgrpo_operator.observed import PodView, kuberay_head_exit
from asyncgrpo_operator.reconciler import ConflictError, Reconciler
from asyncgrpo_operator.supervisor import Loop, supervise

log = logging.getLogger(__name__)

MEMO_KEY = "asyncgrpo"
WATCH_NAMESPACES_ENV = "ASYNCGRPO_WATCH_NAMESPACES"
"""Comma-separated namespaces the resync lists (default: all). Match kopf's --namespace flags."""
RESYNC_ENV = "ASYNCGRPO_RESYNC_SECONDS"
WORKERS_ENV = "ASYNCGRPO_WORKERS"
DEFAULT_WORKERS = 16
"""Passes run at once; the best of 4, 8, 16 and 32 in docs/benchmarks.md (issue 19)."""
LEADER_ELECTION_ENV = "ASYNCGRPO_LEADER_ELECTION"
"""true: only the holder of the Lease asyncgrpo-operator reconciles (for more than one replica)."""
LEADER_NAMESPACE_ENV = "ASYNCGRPO_LEADER_ELECTION_NAMESPACE"
"""Namespace of the Lease (default: $POD_NAMESPACE, which the chart sets)."""
LEADER_TIMING_ENV = "ASYNCGRPO_LEADER_ELECTION_TIMING"
"""leaseDuration,renewDeadline,retryPeriod in seconds (default 15,10,2, client-go's)."""
DRY_RUN_ENV = "ASYNCGRPO_WEBHOOK_DRY_RUN"
"""false: the admission webhook does not dry-run the job's RayCluster (default true; webhook.py)."""
POD_LABELS_ENV = "ASYNCGRPO_OPERATOR_POD_LABELS"
"""The operator pods' labels (`k=v,k=v`; the chart sets its selector labels): with $POD_NAMESPACE,
what every job's NetworkPolicy admits to the driver's /progress port."""


@dataclass(kw_only=True)
class Admission:
    """What the admission handlers share (webhook.py, kueue_admission.py): all a replica that only
    serves admission (`--role webhook`, `start_admission`) builds."""

    api: k8s.Api
    metrics: Metrics
    admission_dry_run: bool = True
    dry_runs_in_flight: int = 0
    """The admission webhook's RayCluster dry-runs running now (dryrun.MAX_IN_FLIGHT bounds it)."""
    metrics_server: web.AppRunner | None = None
    metrics_certificate: asyncio.Task[None] | None = None
    """Reloads the metrics endpoint's certificate when its files change (HTTPS only)."""

    def loops(self) -> list[asyncio.Task[None]]:
        """The supervisors of every long-lived loop (none of them ends while the operator runs)."""
        return [t for t in (self.metrics_certificate,) if t is not None]


@dataclass(kw_only=True)
class Runtime(Admission):
    """Everything the handlers share."""

    session: aiohttp.ClientSession
    cache: Cache
    reconciler: Reconciler
    controller: Controller
    task: asyncio.Task[None]
    """The work queue's supervisor (like every task here: supervisor.py restarts the loop it runs)."""
    poller: asyncio.Task[None]
    """Reads the running drivers' /progress (progress.Poller), outside the passes."""
    drainer: asyncio.Task[None]
    """Sends the elastic fleets' drain requests to their drivers (drain.Drainer)."""
    informers: list[asyncio.Task[None]]
    elector: LeaseElector | None = None
    elector_task: asyncio.Task[None] | None = None

    def enqueue(self, namespace: str | None, name: str | None, delay: float = 0.0) -> None:
        if namespace and name:
            self.controller.enqueue((namespace, name), delay)

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else True

    def loops(self) -> list[asyncio.Task[None]]:
        elector = [self.elector_task] if self.elector_task is not None else []
        return [self.task, self.poller, self.drainer, *self.informers, *elector, *super().loops()]


def watched_namespaces() -> list[str]:
    """The namespaces the operator acts in ($ASYNCGRPO_WATCH_NAMESPACES); empty: all of them."""
    return [n.strip() for n in os.environ.get(WATCH_NAMESPACES_ENV, "").split(",") if n.strip()]


def of(memo: Any) -> Runtime:
    """The runtime stored in kopf's memo by the startup handler."""
    runtime = memo[MEMO_KEY]
    assert isinstance(runtime, Runtime)
    return runtime


def find(memo: Any) -> Admission | None:
    """What the admission handlers share (a whole Runtime where this replica reconciles too), or
    None before the startup handler built it (the webhook may be asked first)."""
    runtime = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    return runtime if isinstance(runtime, Admission) else None


async def start_admission(memo: Any) -> Admission:
    """A replica that only serves admission: the API client, the metrics (and their endpoint);
    no cache, no watches, no reconciling, so nothing others write can grow it or crash it."""
    metrics = Metrics()
    api = await k8s.Api.connect(metrics)
    admission = Admission(api=api, metrics=metrics, admission_dry_run=_dry_run())

    port = os.environ.get(metrics_module.PORT_ENV)
    if port:
        await _serve_metrics(admission, int(port), functools.partial(_supervised, metrics))
    memo[MEMO_KEY] = admission
    log.info("admission started (no reconciling in this replica)")
    return admission


def _supervised(metrics: Metrics, name: str, run: Loop) -> asyncio.Task[None]:
    """`run` under a supervisor that starts it again whenever it ends, counting each restart."""
    restarted = metrics.task_restarts.labels
    return asyncio.create_task(
        supervise(name, run, lambda task: restarted(task).inc()), name=f"supervise-{name}"
    )


def _dry_run() -> bool:
    return os.environ.get(DRY_RUN_ENV, "true").lower() not in {"0", "false", "no"}


async def start(memo: Any) -> Runtime:
    """Connect, build the reconciler and the queue, start the queue (and the metrics endpoint)."""
    template = progress.check_url_template(
        os.environ.get(progress.URL_TEMPLATE_ENV) or progress.DEFAULT_URL_TEMPLATE
    )
    metrics = Metrics()
    api = await k8s.Api.connect(metrics)
    session = aiohttp.ClientSession()
    namespaces = watched_namespaces()
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    cache = Cache(scopes=tuple(scopes))
    elector = _elector(api)
    leading: Callable[[], bool] = (lambda: elector.is_leader) if elector is not None else (lambda: True)
    poller = progress.Poller(session, active=leading)
    drainer = drain.Drainer(session)
    reconciler = Reconciler(
        api,
        poller,
        cache,
        drainer=drainer,
        progress_url_template=template,
        may_act=leading,
        ray_key=raytoken.load_key(),
        operator_pods=operator_pods(),
    )

    async def list_keys() -> list[Key]:
        return await resync_keys(api, cache, scopes)

    controller = Controller(
        reconcile=reconciler.reconcile,
        list_keys=list_keys,
        workers=int(os.environ.get(WORKERS_ENV, DEFAULT_WORKERS)),
        resync_seconds=float(os.environ.get(RESYNC_ENV, "60")),
        conflict_errors=(ConflictError,),
        is_active=((lambda: cache.synced() and elector.is_leader) if elector is not None else cache.synced),
        metrics=metrics,
    )
    poller.changed = controller.enqueue  # a new /progress reading: a pass writes it
    drainer.changed = controller.enqueue  # a drain refused: a pass reports it

    def changed(keys: Iterable[Key]) -> None:
        for key in keys:
            controller.enqueue(key)

    def every_job() -> None:
        changed(cache.jobs.keys())

    def pod_seen(key: Key, pod: dict[str, Any]) -> None:
        """Remember a driver's exit: KubeRay deletes a head pod whose Ray container ended, and the
        last state of a deleted pod is only in its watch event. Only the exit of the head pod
        KubeRay created for one of the job's RayClusters (`is_kuberay_head`), not of a look-alike."""
        if (pod["metadata"].get("labels") or {}).get(naming.RAY_NODE_TYPE_LABEL) == "head":
            exit_ = kuberay_head_exit(PodView.from_dict(pod), cache.clusters.of(key))
            if exit_ is not None:
                reconciler.remember_exit(key, exit_)

    cache.pods.seen = pod_seen

    supervised = functools.partial(_supervised, metrics)

    informers = []
    watched: tuple[tuple[str, Sink, str, bool], ...] = (
        (naming.RAYCLUSTER_PLURAL, cache.clusters, naming.JOB_NAME_LABEL, False),
        ("pods", cache.pods, naming.JOB_NAME_LABEL, False),
        ("configmaps", cache.configmaps, naming.SPEC_CONFIGMAP_SELECTOR, True),
        (naming.WORKLOAD_PLURAL, cache.workloads, naming.JOB_NAME_LABEL, False),
    )
    for resource, index, selector, metadata_only in watched:
        for scope in scopes:
            informer = Informer(
                api,
                resource,
                scope,
                index,
                changed=changed,
                listed=functools.partial(cache.children_listed.add, (resource, scope)),
                found_again=every_job,
                label_selector=selector,
                metadata_only=metadata_only,
            )
            informers.append(supervised(f"asyncgrpo-watch-{resource}-{scope or 'all'}", informer.run))
    task = supervised("asyncgrpo-controller", controller.run)
    poller_task = supervised("asyncgrpo-progress-poller", poller.run)
    drainer_task = supervised("asyncgrpo-drainer", drainer.run)
    elector_task = supervised("asyncgrpo-leader", elector.run) if elector is not None else None
    runtime = Runtime(
        api=api,
        session=session,
        cache=cache,
        reconciler=reconciler,
        controller=controller,
        metrics=metrics,
        task=task,
        poller=poller_task,
        drainer=drainer_task,
        informers=informers,
        elector=elector,
        elector_task=elector_task,
        admission_dry_run=_dry_run(),
    )
    metrics.watch(
        phases=reconciler.memory.phases.values,
        queue_depth=controller.depth,
        in_flight=controller.in_flight,
        is_leader=lambda: runtime.is_leader,
    )
    port = os.environ.get(metrics_module.PORT_ENV)
    if port:
        await _serve_metrics(runtime, int(port), supervised)
    memo[MEMO_KEY] = runtime
    log.info("controller started", extra={"namespaces": namespaces or "all", "progress_url": template})
    return runtime


def operator_pods() -> OperatorPods | None:
    """This operator's pods as $POD_NAMESPACE and $ASYNCGRPO_OPERATOR_POD_LABELS name them, or None
    for an operator that is not a pod (either unset)."""
    namespace = os.environ.get("POD_NAMESPACE")
    pairs = [item.partition("=") for item in os.environ.get(POD_LABELS_ENV, "").split(",") if item.strip()]
    labels = {key.strip(): value.strip() for key, _, value in pairs}
    if not namespace or not labels:
        return None
    return OperatorPods(namespace, labels)


async def _serve_metrics(
    runtime: Admission, port: int, supervised: Callable[[str, Loop], asyncio.Task[None]]
) -> None:
    """Plain /metrics, or (ASYNCGRPO_METRICS_SECURE) HTTPS for the callers RBAC lets read it."""
    if os.environ.get(metrics_module.SECURE_ENV, "").lower() not in {"1", "true", "yes"}:
        runtime.metrics_server = await metrics_module.serve(runtime.metrics, port)
        return
    cert_dir = os.environ.get(metrics_module.CERT_DIR_ENV)
    tls = metrics_tls.serving_tls(Path(cert_dir) if cert_dir else None)
    runtime.metrics_server = await metrics_module.serve(
        runtime.metrics, port, tls=tls.context, access=MetricsAccess(runtime.api)
    )
    every = float(os.environ.get(metrics_module.CERT_CHECK_ENV) or metrics_tls.CHECK_SECONDS)
    runtime.metrics_certificate = supervised(
        "asyncgrpo-metrics-certificate", functools.partial(tls.follow, every)
    )


async def resync_keys(api: k8s.Api, cache: Cache, scopes: Iterable[str | None]) -> list[Key]:
    """Every job, listed afresh (the list also repairs the job cache), and the jobs the list
    dropped: deleted while their DELETE event was missed. Their pass finds them gone and forgets
    them (their phase in the jobs-by-phase metric, their /progress reads)."""
    dropped: set[Key] = set()
    for namespace in scopes:
        jobs, version = await api.list_jobs(namespace)
        dropped |= cache.jobs.replace(jobs, version, namespace)
    return cache.jobs.keys() + sorted(dropped)


async def stop(memo: Any) -> None:
    """Stop acting, then give the Lease up, then close the clients.

    In-flight passes are cancelled (they are idempotent). The Lease is released only once this
    replica has stopped reconciling, so the standby that takes it over never overlaps with it.
    """
    runtime = memo.get(MEMO_KEY)
    if isinstance(runtime, Runtime):
        await _cancel(runtime.task)
        await _cancel(runtime.poller)
        await _cancel(runtime.drainer)
        for informer in runtime.informers:
            await _cancel(informer)
        if runtime.elector is not None:
            await _cancel(runtime.elector_task)
            await runtime.elector.release()
        await runtime.session.close()
    if not isinstance(runtime, Admission):
        return
    await _cancel(runtime.metrics_certificate)
    if runtime.metrics_server is not None:
        await runtime.metrics_server.cleanup()
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
