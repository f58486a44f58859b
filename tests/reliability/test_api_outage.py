"""The API server disappears while jobs run, then comes back: watches recover, status catches up.

Why not restart the real kube-apiserver: the local control plane is shared by every test session
on the machine (and by benchmarks), and a restart fails their requests. Instead the operator talks
to the API server through the recording proxy (apiproxy.py), and the proxy goes away: every open
watch stream is cut mid-flight and new connections are refused, for OUTAGE seconds, exactly what
the operator sees when its API server restarts. Meanwhile the world moves on (a job is suspended,
another is created, a head pod fails); after the outage the operator must reconcile all of it.
What this does not cover: a watch resumed after etcd compaction (410 Gone) -- the real API server
keeps its watch cache here.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import faults, pki
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import JSON, Api
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import (
    JOBS,
    OperatorProcess,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    get_job,
    head_pod,
    job_manifest,
    suspended_in_place,
)
from tests.reliability.apiproxy import RecordingProxy
from tests.reliability.conftest import count

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def proxy(local_cluster: LocalCluster) -> Iterator[RecordingProxy]:
    cluster_pki = local_cluster.paths.pki
    cert, key = pki.issue(
        cluster_pki, f"reliability-outage-{secrets.token_hex(3)}", cn="outage-proxy", sans=("127.0.0.1",)
    )
    server = RecordingProxy(
        local_cluster.api.base_url,
        cluster_pki.ca_crt,
        cert,
        key,
        client_cert=(cluster_pki.admin_crt, cluster_pki.admin_key),
    )
    server.start()
    yield server
    server.stop()
    cert.unlink(missing_ok=True)
    key.unlink(missing_ok=True)


def _until(api: Api, ns: str, name: str, what: str, ok: Callable[[JSON], bool]) -> JSON:
    def reached() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        return status if ok(status) else None

    return wait_until(reached, f"{name}: {what}", timeout=120)


def test_an_api_server_outage_is_survived_and_status_catches_up(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
    progress: ProgressServer,
    proxy: RecordingProxy,
) -> None:
    api, ns = kube_api, namespace
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = proxy.url
    for entry in config["users"]:
        entry["user"] = {"token": "unused-the-proxy-authenticates-as-admin"}
    via_proxy = tmp_path / "kubeconfig"
    via_proxy.write_text(yaml.safe_dump(config))
    # A 10-minute resync: only re-established watches can deliver the changes in time.
    op = OperatorProcess(
        via_proxy, ns, tmp_path / "operator.log", {"ASYNCGRPO_RESYNC_SECONDS": "600"}, progress=progress
    )
    op.start()
    outages = count("outages", 1)
    try:
        for round_ in range(outages):
            a, b, c = (f"{x}-{round_}" for x in "abc")
            for name in (a, c):
                create_job(api, ns, job_manifest(name))
            for name in (a, c):
                _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")

            watches = sum("watch=" in c.query for c in proxy.calls)
            proxy.outage_begin()
            started = time.monotonic()
            api.merge_patch(f"{JOBS.format(ns=ns)}/{a}", {"spec": {"suspend": True}})
            create_job(api, ns, job_manifest(b))
            faults.fail_pod(api, ns, head_pod(api, ns, f"{c}-0")["metadata"]["name"], exit_code=137)
            time.sleep(max(0.0, 15 - (time.monotonic() - started)))
            assert op.proc is not None and op.proc.poll() is None, op.tail()
            proxy.outage_end()
            back = time.monotonic()

            _until(api, ns, a, "Suspended after the outage", lambda s: s.get("phase") == "Suspended")
            _until(api, ns, b, "Running after the outage", lambda s: s.get("phase") == "Running")
            retried = _until(
                api,
                ns,
                c,
                "retried after the outage",
                lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
            )
            caught_up = time.monotonic() - back
            assert retried["rayClusterName"] == f"{c}-1"
            wait_until(
                lambda job=a: suspended_in_place(api, ns, job) == [f"{job}-0"] or None, "suspended in place"
            )
            print(
                f"outage {round_}: 15 s; status caught up {caught_up:.1f} s after the API came back; ", end=""
            )
            print(f"{sum('watch=' in c.query for c in proxy.calls) - watches} watches re-established")
            assert caught_up < 60
            rewatched = sum("watch=" in c.query for c in proxy.calls) - watches
            assert rewatched >= 3, "the operator did not re-establish its watches through the proxy"
    finally:
        op.stop()
        print(op.tail(30))
