"""The operator when the world says no, against the real API server and KubeRay (issue 17).

Like tests/e2e/test_operator.py (whose fixtures these reuse), the operator is a subprocess
watching the test's namespace, with no admission webhook in front of it, so that jobs the webhook
would refuse can reach it, as they do when the webhook fails open or the rules change:

- a RayCluster the API server refuses (a ValidatingAdmissionPolicy: 422; a ResourceQuota: 403)
  shows on the job with the API server's words, within a pass, with a Warning Event; the retry
  backs off; the startup deadline counts from the first try;
- a started job whose spec fails rules tightened since is kept running (SpecValid False);
- a job's `asyncgrpo.dev/progress-url` annotation sends the operator nowhere;
- a RayCluster with the job's name and labels but another owner is neither adopted nor deleted;
- the operator's Prometheus /metrics, scraped;
- heads that hang or flood on /progress (40 and 4) do not hold up a healthy job's status.
"""

from __future__ import annotations

import functools
import secrets
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_operator import manifests
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import raycluster_path, wait_until
from tests.e2e import test_operator as base
from tests.e2e.test_operator import (
    JOBS,
    OperatorProcess,
    ProgressServer,
    create_job,
    end_driver,
    events,
    free_port,
    get_job,
    head_pod,
    job_manifest,
    live_rayclusters,
    rayclusters,
    run_until_running,
    wait_phase,
)

pytestmark = pytest.mark.cluster

# The fixtures of tests/e2e/test_operator.py: the CRD, the operator subprocess, the drivers' /progress.
asyncgrpo_crd = base.asyncgrpo_crd
operator = base.operator
driver_progress = base.driver_progress

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
NO_HOST_NETWORK = "RayClusters in this namespace may not use hostNetwork"


def conditions(status: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in status.get("conditions", [])}


def until(
    api: Api, ns: str, name: str, what: str, ok: Callable[[JSON], bool], *, timeout: float = 60
) -> JSON:
    def reached() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        return status if ok(status) else None

    try:
        return wait_until(reached, f"{name}: {what}", timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status: {get_job(api, ns, name).get('status')}") from exc


@contextmanager
def host_network_refused(kube_api: Api, namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy, bound to `namespace`, that refuses hostNetwork RayClusters
    (reason Invalid: HTTP 422), as a cluster's admins might; effective when yielded."""
    name = f"no-host-network-{secrets.token_hex(3)}"
    kube_api.create(
        POLICIES,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["ray.io"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["rayclusters"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.spec.headGroupSpec.template.spec.hostNetwork) || "
                        "!object.spec.headGroupSpec.template.spec.hostNetwork",
                        "message": NO_HOST_NETWORK,
                        "reason": "Invalid",
                    }
                ],
            },
        },
    )
    kube_api.create(
        BINDINGS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    )
    probe = host_network_cluster(namespace)

    def enforced() -> bool:
        try:
            kube_api.request("POST", raycluster_path(namespace), probe, query={"dryRun": "All"})
        except ApiError as err:
            return err.status == 422
        return False

    wait_until(lambda: enforced() or None, "the policy is enforced", timeout=30)
    yield name
    for path in (BINDINGS, POLICIES):
        kube_api.delete(f"{path}/{name}")


@pytest.fixture
def no_host_network(kube_api: Api, namespace: str) -> Iterator[str]:
    with host_network_refused(kube_api, namespace) as name:
        yield name


def host_network_cluster(namespace: str) -> JSON:
    manifest = job_manifest("probe", network={"hostNetwork": True})
    manifest["metadata"]["namespace"] = namespace
    report = validate_manifest(manifest)
    assert report.job is not None
    return manifests.ray_cluster(report.job, 0)


# --- refused creates ----------------------------------------------------------------------------


def test_a_raycluster_refused_as_invalid_is_shown_at_once_and_the_startup_deadline_still_fires(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    no_host_network: str,
) -> None:
    created = time.monotonic()
    create_job(
        kube_api, namespace, job_manifest("exposed", network={"hostNetwork": True}, startupDeadlineSeconds=25)
    )

    shown = until(
        kube_api,
        namespace,
        "exposed",
        "ClusterCreateFailed",
        lambda s: s.get("reason") == "ClusterCreateFailed",
    )
    seen_after = time.monotonic() - created
    scheduled = conditions(shown)["PodsScheduled"]
    assert scheduled["status"] == "False" and "HTTP 422" in scheduled["message"]
    assert NO_HOST_NETWORK in scheduled["message"]  # the API server's own words
    assert shown["phase"] == "Pending" and NO_HOST_NETWORK in shown["message"]
    wait_until(  # the Event follows the status write it reports
        lambda: [e for e in events(kube_api, namespace, "exposed") if e["type"] == "Warning"] or None,
        "a Warning Event",
        timeout=10,
    )
    time.sleep(1)  # and a duplicate would follow it
    warnings = [e for e in events(kube_api, namespace, "exposed") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ClusterCreateFailed"]
    assert NO_HOST_NETWORK in warnings[0]["message"]
    assert live_rayclusters(kube_api, namespace, "exposed") == []

    # Refused again on every retry, the attempt still runs into its startup deadline (25 s after
    # the first try), which a clock restarted by each try would never reach.
    failed = wait_phase(kube_api, namespace, "exposed", "Failed", "DeadlineExceeded", timeout=90)
    assert "startupDeadlineSeconds (25 s)" in failed["message"] and "ClusterCreateFailed" in failed["message"]
    elapsed = time.monotonic() - created
    print(
        f"refusal shown {seen_after:.1f} s after the job was created; DeadlineExceeded after {elapsed:.1f} s"
    )
    # "Within one pass": the condition carries the time of the pass that first acted on the job.
    first_pass = datetime.fromisoformat(shown["startTime"].replace("Z", "+00:00"))
    refused_at = datetime.fromisoformat(scheduled["lastTransitionTime"].replace("Z", "+00:00"))
    assert (refused_at - first_pass).total_seconds() <= 1, (
        shown["startTime"],
        scheduled["lastTransitionTime"],
    )
    assert seen_after < 60
    assert 25 <= elapsed < 75


def test_a_raycluster_refused_by_quota_is_shown_and_created_once_the_quota_allows(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    quota = f"/api/v1/namespaces/{namespace}/resourcequotas/no-rayclusters"
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        {"metadata": {"name": "no-rayclusters"}, "spec": {"hard": {"count/rayclusters.ray.io": "0"}}},
    )
    wait_until(lambda: kube_api.get(quota).get("status", {}).get("hard") or None, "quota status computed")
    create_job(kube_api, namespace, job_manifest("squeezed"))

    shown = until(
        kube_api,
        namespace,
        "squeezed",
        "ClusterCreateFailed",
        lambda s: s.get("reason") == "ClusterCreateFailed",
    )
    message = conditions(shown)["PodsScheduled"]["message"]
    assert "HTTP 403" in message and "exceeded quota" in message, message

    kube_api.delete(quota)
    running = until(
        kube_api,
        namespace,
        "squeezed",
        "its RayCluster once the quota is gone",
        lambda s: bool(s.get("rayClusterName")),
        timeout=90,
    )
    assert running["rayClusterName"] == "squeezed-0"


# --- rules tightened under a running job ---------------------------------------------------------


TIGHTENED = {"spec": {"cluster": {"head": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}}}
"""A spec the current rules refuse (a request above its limit), written past the webhook (the
tests run none): what an operator upgrade with tighter rules makes of a stored job, or a change
made while the webhook was not called."""


def test_a_running_job_whose_spec_newer_rules_refuse_keeps_running_and_keeps_its_cluster(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    create_job(kube_api, namespace, job_manifest("veteran"))
    run_until_running(kube_api, namespace, "veteran", driver_progress)
    admitted = get_job(kube_api, namespace, "veteran")["status"]["admittedGeneration"]
    assert admitted == 1
    # The upgrade: the old operator admitted (and recorded) the spec the new rules refuse.
    operator.stop()
    path = f"{JOBS.format(ns=namespace)}/veteran"
    written = kube_api.merge_patch(path, TIGHTENED)
    generation = written["metadata"]["generation"]
    kube_api.merge_patch(f"{path}/status", {"status": {"admittedGeneration": generation}})
    operator.start()
    status = until(kube_api, namespace, "veteran", "SpecValid False", lambda s: "SpecValid" in conditions(s))
    spec = conditions(status)["SpecValid"]
    assert (spec["status"], spec["reason"]) == ("False", "AdmittedUnderOlderRules")
    assert "spec.cluster.head.resources.requests.cpu" in spec["message"]
    time.sleep(5)  # several passes (pollSeconds 2)
    status = get_job(kube_api, namespace, "veteran")["status"]
    assert status["phase"] == "Running" and live_rayclusters(kube_api, namespace, "veteran") == ["veteran-0"]
    assert status["admittedGeneration"] == generation
    assert "AdmittedUnderOlderRules" in {e["reason"] for e in events(kube_api, namespace, "veteran")}


def test_a_spec_change_written_past_the_webhook_is_refused_and_the_running_attempt_ends_the_job(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    create_job(kube_api, namespace, job_manifest("bypassed", backoffLimit=3))
    run_until_running(kube_api, namespace, "bypassed", driver_progress)
    written = kube_api.merge_patch(f"{JOBS.format(ns=namespace)}/bypassed", TIGHTENED)
    status = until(kube_api, namespace, "bypassed", "SpecValid False", lambda s: "SpecValid" in conditions(s))
    spec = conditions(status)["SpecValid"]
    assert (spec["status"], spec["reason"]) == ("False", "SpecChangeNotAdmitted")
    generation = written["metadata"]["generation"]
    assert f"spec generation {generation} was never admitted" in spec["message"]
    assert "spec.cluster.head.resources.requests.cpu" in spec["message"]
    assert status["phase"] == "Running" and status["admittedGeneration"] == 1
    assert live_rayclusters(kube_api, namespace, "bypassed") == ["bypassed-0"]
    # Killed by a signal: a valid job would be retried (backoffLimit 3); this one gets no new attempt.
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "bypassed-0"), 137)
    failed = wait_phase(kube_api, namespace, "bypassed", "Failed")
    assert failed["reason"] == "InvalidSpec" and "no new attempt" in failed["message"]
    assert failed["restarts"] == 0
    assert [c["metadata"]["name"] for c in rayclusters(kube_api, namespace, "bypassed")] == ["bypassed-0"]


# --- no request forgery -------------------------------------------------------------------------


def test_a_jobs_progress_url_annotation_is_ignored(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    elsewhere = ProgressServer()  # what an author would like the operator to fetch
    elsewhere.doc = {"step": 99, "maxSteps": 100, "state": "running"}
    try:
        manifest = job_manifest("curious")
        manifest["metadata"]["annotations"] = {
            "asyncgrpo.dev/progress-url": elsewhere.url_of(namespace, "curious")
        }
        create_job(kube_api, namespace, manifest)
        run_until_running(kube_api, namespace, "curious", driver_progress)
        status = until(
            kube_api,
            namespace,
            "curious",
            "progress read",
            lambda s: (s.get("progress") or {}).get("step") == 3,
        )
        time.sleep(5)  # pollSeconds 2: several more reads
        assert elsewhere.hits == []
        assert f"/progress/{namespace}/curious" in driver_progress.hits
        assert status["progress"]["step"] == 3
    finally:
        elsewhere.close()


# --- adoption checks ownership -------------------------------------------------------------------


def test_a_raycluster_with_the_jobs_name_but_another_owner_is_neither_adopted_nor_deleted(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    manifest = job_manifest("claimed")
    manifest["metadata"]["namespace"] = namespace
    report = validate_manifest(manifest)
    assert report.job is not None
    for attempt in (0, 1):  # the current attempt's name, and one that looks like a stale attempt
        kube_api.create(raycluster_path(namespace), manifests.ray_cluster(report.job, attempt))  # no owner
    create_job(kube_api, namespace, job_manifest("claimed"))

    taken = until(
        kube_api, namespace, "claimed", "ClusterNameTaken", lambda s: s.get("reason") == "ClusterNameTaken"
    )
    assert "claimed-0" in taken["message"] and "not this job's" in taken["message"]
    assert not taken.get("rayClusterName")
    time.sleep(3)
    assert live_rayclusters(kube_api, namespace, "claimed") == ["claimed-0", "claimed-1"]  # none deleted

    kube_api.delete(f"{raycluster_path(namespace)}/claimed-0")
    run_until_running(kube_api, namespace, "claimed", driver_progress)
    job_uid = get_job(kube_api, namespace, "claimed")["metadata"]["uid"]
    ours = next(
        rc for rc in rayclusters(kube_api, namespace, "claimed") if rc["metadata"]["name"] == "claimed-0"
    )
    assert ours["metadata"]["ownerReferences"][0]["uid"] == job_uid
    assert "claimed-1" in live_rayclusters(kube_api, namespace, "claimed")  # still not ours to delete


# --- metrics ------------------------------------------------------------------------------------


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The operator's plain-HTTP /metrics (no ASYNCGRPO_METRICS_SECURE), parsed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return samples_of(response.read().decode())


def samples_of(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus' text format, parsed: sample name -> [(labels, value)]."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for got, v in samples.get(name, []) if labels.items() <= got.items())


def test_the_operator_serves_prometheus_metrics(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,
    tmp_path: Path,
    driver_progress: ProgressServer,
) -> None:
    port = free_port()
    op = OperatorProcess(
        kubeconfig,
        namespace,
        tmp_path / "operator.log",
        {"ASYNCGRPO_METRICS_PORT": str(port)},
        progress=driver_progress,
    )
    op.start()
    try:
        create_job(kube_api, namespace, job_manifest("measured"))
        run_until_running(kube_api, namespace, "measured", driver_progress)

        def counted_running() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            samples = scrape(port)
            return samples if value(samples, "asyncgrpo_jobs", phase="Running") == 1 else None

        samples = wait_until(counted_running, "asyncgrpo_jobs{phase=Running} 1", timeout=30)
    finally:
        op.stop()
    assert value(samples, "asyncgrpo_reconcile_passes_total", result="success") >= 2
    assert value(samples, "asyncgrpo_reconcile_duration_seconds_count") >= 2
    assert (
        value(samples, "asyncgrpo_api_requests_total", verb="create", resource="rayclusters", code="200") == 1
    )
    assert value(samples, "asyncgrpo_api_requests_total", verb="patch", resource="asyncgrpojobs/status") >= 2
    # A pass reads from the watch caches (issue 19): pods are read by the informer, as a streamed
    # list (a watch with sendInitialEvents; pages of a list where a server refuses it) and then
    # watched; nothing is read per pass.
    assert value(samples, "asyncgrpo_api_requests_total", verb="watch", resource="pods") >= 1
    assert value(samples, "asyncgrpo_api_requests_total", verb="get") == 0
    assert value(samples, "asyncgrpo_api_request_duration_seconds_count", verb="patch") >= 2
    assert value(samples, "asyncgrpo_jobs", phase="Pending") == 0
    assert "asyncgrpo_workqueue_depth" in samples and "asyncgrpo_workqueue_in_flight" in samples
    assert value(samples, "asyncgrpo_leader") == 1


# --- hostile heads (issue 27) ----------------------------------------------------------------------


def progress_step(status: JSON) -> int | None:
    step = (status.get("progress") or {}).get("step")
    return int(step) if step is not None else None


def at_step(step: int, status: JSON) -> bool:
    return progress_step(status) == step


HEAD_ONLY = {"policyWorkers": {"replicas": 0}, "generationWorkers": {"replicas": 0}}
"""Jobs of a head pod alone: dozens fit on the fake CPU node next to other sessions' jobs."""


def test_heads_that_hang_or_flood_do_not_hold_up_a_healthy_jobs_status(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    """40 running jobs whose heads accept /progress and never answer, 4 whose heads send an endless
    body, and one healthy job: each new step of the healthy driver is in its status within one
    pollSeconds (2) and a read (before issue 27 the hanging reads took the reconcile workers, 16,
    and the healthy job's passes queued behind them), and the operator stays up."""
    hostile = {f"hangs-{i}": "hang" for i in range(40)} | {f"floods-{i}": "flood" for i in range(4)}
    for name in [*hostile, "healthy"]:
        create_job(kube_api, namespace, job_manifest(name, cluster=HEAD_ONLY))
    for name in [*hostile, "healthy"]:
        run_until_running(kube_api, namespace, name, driver_progress)
    driver_progress.hostile = {(namespace, name): how for name, how in hostile.items()}
    time.sleep(5)  # every hostile head read, its reads failing
    lags = []
    for step in (5, 6, 7, 8):
        driver_progress.docs[(namespace, "healthy")] = {**driver_progress.doc, "step": step}
        started = time.monotonic()
        until(kube_api, namespace, "healthy", f"step {step}", functools.partial(at_step, step))
        lags.append(time.monotonic() - started)
    print("healthy job's step in its status after (s):", [round(lag, 1) for lag in lags])
    assert max(lags) < 5, lags
    assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
    for name in hostile:
        status = get_job(kube_api, namespace, name)["status"]
        assert status["phase"] == "Running", (name, status)
