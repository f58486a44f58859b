"""The operator's Prometheus metrics, and the HTTP endpoint that serves them (GET /metrics).

What is measured, and where:
- reconcile passes by result, and their latency (controller.py, around each pass);
- Kubernetes API calls by verb, resource and HTTP code, and their latency (k8s.py, every call);
- jobs by phase, as this replica last reconciled them (only the leader reconciles: a standby
  reports none), the work queue's depth and passes in flight, and whether this replica leads;
- admission requests by operation and verdict, with latency, and the outcome of the webhook's
  server-side dry-run of the RayCluster (handlers/admission.py);
- restarts of the operator's long-lived loops (supervisor.py), by task.

One registry per operator (not prometheus_client's global one), so tests can run several
operators in one process. The endpoint is an aiohttp app on the operator's event loop, on
ASYNCGRPO_METRICS_PORT (the chart sets it to `metrics.port`); unset, nothing is served. With
ASYNCGRPO_METRICS_SECURE=true (the chart's default, `metrics.secure`) it is HTTPS
(metrics_tls.py) and answers only callers whose bearer token RBAC lets `get` /metrics
(metrics_access.py); otherwise plain HTTP to anyone who reaches the port.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import get_args

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from asyncgrpo_api.v1alpha1.job import Phase
from asyncgrpo_operator.metrics_access import METRICS_PATH, MetricsAccess, Verdict

log = logging.getLogger(__name__)

PORT_ENV = "ASYNCGRPO_METRICS_PORT"
SECURE_ENV = "ASYNCGRPO_METRICS_SECURE"
"""true: HTTPS, and only for bearer tokens RBAC lets get /metrics (default false: plain HTTP)."""
CERT_DIR_ENV = "ASYNCGRPO_METRICS_CERT_DIR"
"""Folder with tls.crt and tls.key for HTTPS (the chart: the webhook's); unset, a self-signed one."""
CERT_CHECK_ENV = "ASYNCGRPO_METRICS_CERT_CHECK_SECONDS"
"""How often those files are re-read (default 60; the chart: webhook.certCheckSeconds, as for the
webhook, which serves the same certificate)."""
PHASES: tuple[Phase, ...] = get_args(Phase)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Every metric of one operator process, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "asyncgrpo_reconcile_passes",
            "Reconcile passes by result: success, conflict (re-planned at once), error (retried) or deposed "
            "(this replica lost the lease during the pass, which stopped before its next write).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "asyncgrpo_reconcile_duration_seconds",
            "Duration of one reconcile pass (read, plan, write status, act, post events).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.api_requests = Counter(
            "asyncgrpo_api_requests",
            "Kubernetes API calls made by the reconciler, by verb, resource and HTTP code (0: no answer).",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.api_seconds = Histogram(
            "asyncgrpo_api_request_duration_seconds",
            "Duration of one Kubernetes API call, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.admissions = Counter(
            "asyncgrpo_admission_requests",
            "Admission reviews of AsyncGRPOJobs, by operation and verdict (allowed or denied).",
            ["operation", "verdict"],
            registry=self.registry,
        )
        self.admission_seconds = Histogram(
            "asyncgrpo_admission_duration_seconds",
            "Time to judge one admission review, by operation (the dry-run included).",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.dry_runs = Counter(
            "asyncgrpo_admission_dry_runs",
            "Server-side dry-runs of a job's RayCluster at admission, by result: accepted, refused, "
            "skipped (the API server could not judge it; the job is admitted), unchanged (an update "
            "that leaves the RayCluster as it was) or shed (too many at once; admitted without one).",
            ["result"],
            registry=self.registry,
        )
        self.task_restarts = Counter(
            "asyncgrpo_task_restarts",
            "Restarts of the operator's long-lived loops (an informer, the /progress poller, the work "
            "queue, the leader election) after one ended unexpectedly, by task; any is a bug to report.",
            ["task"],
            registry=self.registry,
        )

    def watch(
        self,
        *,
        phases: Callable[[], Iterable[str]],
        queue_depth: Callable[[], int],
        in_flight: Callable[[], int],
        is_leader: Callable[[], bool],
    ) -> None:
        """Gauges read at scrape time from the live objects (nothing to keep in sync)."""
        self.registry.register(_LiveGauges(phases, queue_depth, in_flight, is_leader))


class _LiveGauges(Collector):
    def __init__(
        self,
        phases: Callable[[], Iterable[str]],
        queue_depth: Callable[[], int],
        in_flight: Callable[[], int],
        is_leader: Callable[[], bool],
    ) -> None:
        self.phases, self.queue_depth, self.in_flight, self.is_leader = (
            phases,
            queue_depth,
            in_flight,
            is_leader,
        )

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily(
            "asyncgrpo_jobs",
            "AsyncGRPOJobs by phase, as this replica last reconciled them.",
            labels=["phase"],
        )
        counts: Mapping[str, int] = _count(self.phases())
        for phase in PHASES:
            jobs.add_metric([phase], counts.get(phase, 0))
        yield jobs
        yield GaugeMetricFamily(
            "asyncgrpo_workqueue_depth",
            "Jobs waiting in the work queue for a pass.",
            value=self.queue_depth(),
        )
        yield GaugeMetricFamily(
            "asyncgrpo_workqueue_in_flight", "Reconcile passes running now.", value=self.in_flight()
        )
        yield GaugeMetricFamily(
            "asyncgrpo_leader",
            "1 while this replica holds the leader Lease (or runs alone).",
            value=self.is_leader(),
        )


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


REFUSALS: Mapping[Verdict, tuple[int, str]] = {
    "unauthenticated": (401, "Unauthorized: send a bearer token the API server knows\n"),
    "forbidden": (403, "Forbidden: RBAC does not let this identity get /metrics\n"),
}


async def serve(
    metrics: Metrics,
    port: int,
    host: str = "0.0.0.0",
    *,
    tls: ssl.SSLContext | None = None,
    access: MetricsAccess | None = None,
) -> web.AppRunner:
    """Serve GET /metrics on host:port (over `tls`, to callers `access` allows, when given);
    returns the runner to clean up at shutdown."""

    async def scrape(request: web.Request) -> web.Response:
        if access is not None:
            try:
                verdict = await access.check(request.headers.get("Authorization"))
            except Exception as exc:  # the API server did not answer: refuse this scrape only
                log.warning("could not review a metrics scrape's token: %s", exc)
                return web.Response(status=500, text="could not review the token with the API server\n")
            if verdict != "allowed":
                status, text = REFUSALS[verdict]
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                return web.Response(status=status, text=text, headers=headers)
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    log.info(
        "serving Prometheus metrics",
        extra={"port": port, "https": tls is not None, "token_reviewed": access is not None},
    )
    return runner
