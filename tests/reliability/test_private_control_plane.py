"""Faults that must not happen to the shared control plane, on a private one (tests/cluster/private.py).

1. etcd compaction expires the operator's watches (410 Gone). The private API server runs without
   its watch cache (ASYNCGRPO_CLUSTER_WATCH_CACHE=0), so watches are served by etcd itself and a
   compacted resourceVersion is gone for good, as it is for a cache-less or restarted server after
   compaction. The operator talks through the recording proxy (apiproxy.py), which cuts its watch
   streams; meanwhile the world changes and etcd is compacted past the operator's last seen
   resourceVersion. Reconnecting from there, every watch gets 410 Gone and must list again: the
   operator runs with a 10-minute resync, so only the re-listed watches can catch up in time.
   Count: ASYNCGRPO_RELIABILITY_COMPACTIONS (default 1).
2. KubeRay is not installed: its RayCluster CRD is removed. A job then shows KubeRayMissing, with
   the API server's answer, instead of failing its passes silently; once the CRD is back, the job
   gets its RayCluster.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import faults, pki
from tests.cluster.fixtures import wait_for_default_service_account
from tests.cluster.private import PrivateCluster, private_control_plane
from tests.cluster.rest import JSON, Api, ApiError, condition
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import (
    CRD_FILE,
    JOBS,
    OperatorProcess,
    ProgressServer,
    create_job,
    events,
    get_job,
    head_pod,
    job_manifest,
    rayclusters,
    suspended_in_place,
)
from tests.reliability.apiproxy import RecordingProxy
from tests.reliability.conftest import count

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RAYCLUSTER_CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io"
OUTAGE_SECONDS = 10.0


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_control_plane(
        tmp_path_factory.mktemp("private-ctrlplane"), ASYNCGRPO_CLUSTER_WATCH_CACHE="0"
    ) as cluster:
        install_crd(cluster.api)
        yield cluster


def install_crd(api: Api) -> None:
    crd: JSON = yaml.safe_load(CRD_FILE.read_text())
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    api.apply(path, json.dumps(crd))
    wait_until(
        lambda: (
            ((c := condition(api.get(path), "Established")) is not None and c["status"] == "True") or None
        ),
        "CRD Established",
    )


def fresh_namespace(api: Api, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for_default_service_account(api, name)
    return name


def until(
    api: Api, ns: str, name: str, what: str, ok: Callable[[JSON], bool], *, timeout: float = 90
) -> JSON:
    def reached() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        return status if ok(status) else None

    return wait_until(reached, f"{name}: {what}", timeout=timeout)


# --- etcd compaction ----------------------------------------------------------------------------


def etcd(cluster: PrivateCluster, call: str, body: JSON) -> JSON:
    """One call of etcd's v3 JSON gateway (plain HTTP on loopback, as the cluster runs it)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.port('etcd-client')}/v3/{call}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: JSON = json.loads(response.read())
        return answer


def compact_etcd(cluster: PrivateCluster) -> int:
    """Compact etcd at its current revision (physically): every older resourceVersion is gone."""
    key = base64.b64encode(b"/registry/").decode()
    revision = int(etcd(cluster, "kv/range", {"key": key, "limit": 1})["header"]["revision"])
    etcd(cluster, "kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def watch_answer(api: Api, path: str, resource_version: str) -> JSON:
    """The first event of a watch from `resource_version` (an ERROR event when it is expired)."""
    url = f"{api.base_url}{path}?watch=1&resourceVersion={resource_version}&timeoutSeconds=2"
    with urllib.request.urlopen(urllib.request.Request(url), context=api.ctx, timeout=10) as response:
        line = response.readline()
    event: JSON = json.loads(line) if line else {}
    return event


@pytest.fixture
def proxy(private: PrivateCluster) -> Iterator[RecordingProxy]:
    cert, key = pki.issue(
        private.pki, f"compaction-proxy-{secrets.token_hex(3)}", cn="compaction-proxy", sans=("127.0.0.1",)
    )
    server = RecordingProxy(
        private.api.base_url,
        private.pki.ca_crt,
        cert,
        key,
        client_cert=(private.pki.admin_crt, private.pki.admin_key),
    )
    server.start()
    yield server
    server.stop()


def test_watches_expired_by_etcd_compaction_are_listed_again_and_status_catches_up(
    private: PrivateCluster, proxy: RecordingProxy, tmp_path: Path
) -> None:
    api = private.api
    ns = fresh_namespace(api, "compaction")
    config = yaml.safe_load(private.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = proxy.url
    for entry in config["users"]:
        entry["user"] = {"token": "unused-the-proxy-authenticates-as-admin"}
    via_proxy = tmp_path / "kubeconfig"
    via_proxy.write_text(yaml.safe_dump(config))
    progress = ProgressServer()
    progress.doc = {"step": 3, "maxSteps": 20, "policyVersion": 3, "state": "running"}
    # A 10-minute resync: only the watches, listed again after 410 Gone, can catch up in time.
    op = OperatorProcess(
        via_proxy, ns, tmp_path / "operator.log", {"ASYNCGRPO_RESYNC_SECONDS": "600"}, progress=progress
    )
    op.start()
    try:
        for round_ in range(count("compactions", 1)):
            a, b, c = (f"{x}-{round_}" for x in "abc")
            for name in (a, c):
                create_job(api, ns, job_manifest(name))
            for name in (a, c):
                until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")
            seen = api.get(JOBS.format(ns=ns))["metadata"]["resourceVersion"]
            restarts_before = op.log.read_text().count("Restarting the watch-stream")

            proxy.outage_begin()
            started = time.monotonic()
            api.merge_patch(f"{JOBS.format(ns=ns)}/{a}", {"spec": {"suspend": True}})
            create_job(api, ns, job_manifest(b))
            faults.fail_pod(api, ns, head_pod(api, ns, f"{c}-0")["metadata"]["name"], exit_code=137)
            revision = compact_etcd(private)
            expired = watch_answer(api, JOBS.format(ns=ns), seen)
            assert expired.get("type") == "ERROR" and expired["object"]["code"] == 410, expired
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))
            assert op.proc is not None and op.proc.poll() is None, op.tail()
            proxy.outage_end()
            back = time.monotonic()

            until(api, ns, a, "Suspended after the compaction", lambda s: s.get("phase") == "Suspended")
            until(api, ns, b, "Running after the compaction", lambda s: s.get("phase") == "Running")
            retried = until(
                api,
                ns,
                c,
                "retried after the compaction",
                lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
            )
            caught_up = time.monotonic() - back
            assert retried["rayClusterName"] == f"{c}-1"
            wait_until(
                lambda job=a: suspended_in_place(api, ns, job) == [f"{job}-0"] or None, "suspended in place"
            )
            restarted = op.log.read_text().count("Restarting the watch-stream") - restarts_before
            print(
                f"compaction {round_}: etcd compacted at revision {revision} (the operator had seen {seen}); "
                f"{restarted} watch streams answered 410 and listed again; all caught up {caught_up:.1f} s "
                "after the API came back"
            )
            assert restarted >= 1, "no watch of the operator got 410 Gone"
            assert caught_up < 60
    finally:
        op.stop()
        progress.close()
        print(op.tail(20))


# --- KubeRay missing ---------------------------------------------------------------------------


def test_a_job_without_kuberay_says_so_and_starts_once_kuberay_is_installed(
    private: PrivateCluster, tmp_path: Path
) -> None:
    api = private.api
    ns = fresh_namespace(api, "nokuberay")
    crd = api.get(RAYCLUSTER_CRD)
    saved = {
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "metadata": {"name": crd["metadata"]["name"]},
    }
    saved["spec"] = crd["spec"]
    api.delete(RAYCLUSTER_CRD)

    def crd_gone() -> bool:
        try:
            api.get(RAYCLUSTER_CRD)
        except ApiError as err:
            return err.status == 404
        return False

    wait_until(lambda: crd_gone() or None, "RayCluster CRD deleted", timeout=60)
    progress = ProgressServer()
    op = OperatorProcess(private.kubeconfig, ns, tmp_path / "operator.log", progress=progress)
    op.start()
    try:
        create_job(api, ns, job_manifest("orphan"))
        missing = until(
            api, ns, "orphan", "KubeRayMissing", lambda s: s.get("reason") == "KubeRayMissing", timeout=60
        )
        assert missing["phase"] == "Pending" and "KubeRay" in missing["message"]
        assert "not found" in missing["message"]  # the API server's words ("404 page not found")
        warnings = wait_until(  # the Event follows the status write it reports
            lambda: [e for e in events(api, ns, "orphan") if e["type"] == "Warning"] or None,
            "a Warning Event",
        )
        assert [e["reason"] for e in warnings] == ["KubeRayMissing"]

        api.apply(RAYCLUSTER_CRD, json.dumps(saved))
        wait_until(
            lambda: (
                ((c := condition(api.get(RAYCLUSTER_CRD), "Established")) and c["status"] == "True") or None
            ),
            "RayCluster CRD Established again",
        )
        wait_until(
            lambda: rayclusters(api, ns, "orphan") or None,
            "RayCluster orphan-0 once KubeRay is back",
            timeout=90,
        )
        status = until(
            api, ns, "orphan", "no longer KubeRayMissing", lambda s: s.get("reason") != "KubeRayMissing"
        )
        assert status["phase"] in ("Pending", "Provisioning", "Running"), status
    finally:
        op.stop()
        progress.close()
        print(op.tail(20))
        if crd_gone():
            api.apply(RAYCLUSTER_CRD, json.dumps(saved))
