"""Load: many jobs applied at once; all reach Running, the operator's memory and reconcile latency
stay bounded, and no job starves.

The jobs run on nodes of their own (kwok, a pool label unique to the test, 200 pods each), so they
neither fill the shared CPU/GPU pools nor meet other tests' or benchmarks' pods. Every job is
CPU-only (head + one policy + one generation worker, 10m CPU each). The test lists the jobs every
0.5 s and samples the operator's VmRSS every 0.5 s.

Measured per job: first-status latency (create -> the operator wrote any status: how long a job
waits for its first reconcile) and time to Running (create -> phase Running, which also includes
KubeRay creating the pods and kwok running them). Count: ASYNCGRPO_RELIABILITY_LOAD_JOBS (default
30; docs/reliability.md records a 200-job run).
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.nodes import spare_node
from tests.cluster.processes import RssSampler, rss_bytes
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import (
    JOBS,
    OperatorProcess,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    job_manifest,
)
from tests.reliability.conftest import count

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PODS_PER_NODE = 200
TINY = {"requests": {"cpu": "10m", "memory": "64Mi"}}


@pytest.fixture
def load_nodes(kube_api: Api) -> Iterator[str]:
    """Enough private kwok nodes for 3 pods per job; yields their pool label value."""
    pool = f"load-{secrets.token_hex(3)}"
    jobs = count("load_jobs", 30)
    names = [f"{pool}-{i}" for i in range(max(1, -(-3 * jobs // PODS_PER_NODE)))]
    for name in names:
        node = spare_node(name)
        node["metadata"]["labels"]["asyncgrpo.dev/pool"] = pool
        capacity = {"cpu": "64", "memory": "256Gi", "pods": str(PODS_PER_NODE), "ephemeral-storage": "1Ti"}
        node["status"]["capacity"] = node["status"]["allocatable"] = capacity
        kube_api.create("/api/v1/nodes", node)
    yield pool
    for name in names:
        try:
            kube_api.delete(f"/api/v1/nodes/{name}")
        except ApiError as err:
            if err.status != 404:
                raise


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_many_jobs_at_once_all_run_with_bounded_memory_and_latency(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
    load_nodes: str,
) -> None:
    api, ns, pool = kube_api, namespace, load_nodes
    jobs = count("load_jobs", 30)
    progress = ProgressServer()
    progress.doc = {"step": 1, "maxSteps": 20, "policyVersion": 1, "state": "running"}
    placement: dict[str, Any] = {
        "nodeSelector": {"asyncgrpo.dev/pool": pool},
        "tolerations": [{"key": "asyncgrpo.dev/spare", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": TINY,
    }
    cluster = {
        "head": placement,
        "policyWorkers": {**placement, "gpusPerReplica": 0},
        "generationWorkers": {**placement, "gpusPerReplica": 0},
    }
    op = OperatorProcess(
        kubeconfig, ns, tmp_path / "operator.log", {"ASYNCGRPO_RESYNC_SECONDS": "60"}, progress=progress
    )
    op.start()
    assert op.proc is not None
    try:
        # The baseline: the operator started and serving (liveness answers), before any job.
        op.wait_live()
        time.sleep(2)
        idle_rss = rss_bytes(op.proc.pid)
        sampler = RssSampler(op.proc.pid).start()
        created: dict[str, float] = {}
        first_status: dict[str, float] = {}
        running: dict[str, float] = {}
        t0 = time.monotonic()
        for i in range(jobs):
            name = f"load-{i:03d}"
            create_job(api, ns, job_manifest(name, cluster=cluster))
            created[name] = time.monotonic()
        applied = time.monotonic() - t0

        def all_running() -> bool | None:
            now = time.monotonic()
            for item in api.get(JOBS.format(ns=ns)).get("items", []):
                name, status = item["metadata"]["name"], item.get("status") or {}
                if status.get("phase"):
                    first_status.setdefault(name, now)
                if status.get("phase") == "Running":
                    running.setdefault(name, now)
            return len(running) == jobs or None

        timeout = 120 + 2.0 * jobs
        try:
            wait_until(all_running, f"{jobs} jobs Running", timeout=timeout, interval=0.5)
        finally:
            peak = sampler.stop()
        first = [first_status[n] - created[n] for n in created if n in first_status]
        to_running = [running[n] - created[n] for n in created if n in running]
        report = {
            "jobs": jobs,
            "applied_s": round(applied, 1),
            "all_running_s": round(time.monotonic() - t0, 1),
            "first_status_p50_s": round(statistics.median(first), 1),
            "first_status_p95_s": round(_pct(first, 0.95), 1),
            "first_status_max_s": round(max(first), 1),
            "running_p50_s": round(statistics.median(to_running), 1),
            "running_p95_s": round(_pct(to_running, 0.95), 1),
            "running_max_s": round(max(to_running), 1),
            "rss_idle_mib": round(idle_rss / 2**20),
            "rss_peak_mib": round(peak / 2**20),
        }
        print("load:", report)
        assert op.proc.poll() is None, op.tail()
        # Bounds: memory grows by at most 128 MiB + 1 MiB per job; no job waits far longer than
        # the median (starvation would show as a long tail).
        assert peak - idle_rss < 128 * 2**20 + jobs * 2**20, report
        assert max(to_running) < max(60.0, 5 * statistics.median(to_running)) + applied, report
    finally:
        op.stop()
        progress.close()
        # The jobs go with the test's namespace (deleted by its fixture, asynchronously): a
        # synchronous deletecollection of 200 jobs outlasts the client's 30 s timeout.
