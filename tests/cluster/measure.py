"""Measure the numbers docs/benchmarks.md reports: warm `up`, memory, RayCluster time-to-ready.

    python -m tests.cluster.measure [--runs 3]

Starts its own control plane in the configured state folder (refuses if one is live, so the `up`
it times is a real one), measures, and stops it again. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from typing import Any

from tests.cluster.build import build
from tests.cluster.cluster import LocalCluster
from tests.cluster.fixtures import wait_for_default_service_account
from tests.cluster.processes import rss_bytes
from tests.cluster.samples import pods, raycluster, raycluster_path, raycluster_ready, wait_until


def _rss(cluster: LocalCluster) -> dict[str, float]:
    out = {r.name: round(rss_bytes(r.pid) / 2**20, 1) for r in cluster.records()}
    out["total"] = round(sum(out.values()), 1)
    return out


def raycluster_time_to_ready(cluster: LocalCluster, gpu_workers: int = 2) -> float:
    """Seconds from POST of a 1-head + N-GPU-worker RayCluster until KubeRay reports it ready."""
    api = cluster.api
    ns = f"bench-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    wait_for_default_service_account(api, ns)
    start = time.monotonic()
    api.create(raycluster_path(ns), raycluster("bench", gpu_workers=gpu_workers))
    wait_until(lambda: raycluster_ready(api, ns, "bench"), "RayCluster ready", timeout=120, interval=0.05)
    elapsed = time.monotonic() - start
    assert len(pods(api, ns, "ray.io/cluster=bench")) == 1 + gpu_workers
    api.delete(f"/api/v1/namespaces/{ns}")
    # Wait until the GPU nodes are free again: otherwise the next run's workers find the pool full,
    # stay Unschedulable until the scheduler's backoff retries them, and measure that instead.
    wait_until(lambda: not pods(api, ns) or None, "benchmark pods deleted", timeout=120)
    return round(elapsed, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.measure")
    parser.add_argument("--runs", type=int, default=3, help="RayCluster runs to time")
    args = parser.parse_args(argv)
    cluster = LocalCluster.from_env()
    if cluster.is_live():
        print("a control plane is already live; `python -m tests.cluster down` first", file=sys.stderr)
        return 1
    t = time.monotonic()
    binaries = build()
    result: dict[str, Any] = {"build_check_s": round(time.monotonic() - t, 2)}
    t = time.monotonic()
    result["up_milestones_s"] = cluster.up(binaries)
    result["up_wall_s"] = round(time.monotonic() - t, 2)
    try:
        time.sleep(10)  # let caches and informers settle before reading memory
        result["rss_mib_idle"] = _rss(cluster)
        result["raycluster_ready_s"] = [raycluster_time_to_ready(cluster) for _ in range(args.runs)]
        result["rss_mib_after_rayclusters"] = _rss(cluster)
    finally:
        with cluster.locked():
            cluster.down()
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)  # other work on the machine skews timings
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
