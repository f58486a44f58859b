"""An administrator's AsyncGRPORuntime against the real API server: `kubectl apply` of the
documented runtime, then jobs that name it.

The chart is installed by helm into the local control plane and the operator serves the webhook
as the chart's ServiceAccount (tests/webhook/cluster_harness.py): the webhook reads the runtime
with the chart's RBAC, admits a job that keeps within it (whose RayCluster then carries the
runtime's ServiceAccount and securityContext), and refuses one that does not, and one naming a
runtime that does not exist, in kubectl's output. A namespace labelled with a runtime refuses a
new job that names no runtime, or another, by the chart's ValidatingAdmissionPolicy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from asyncgrpo_operator.webhook import WEBHOOK_NAME
from tests.api.test_runtime_rules import IMAGE, RUNTIME, RUNTIME_FILE
from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.cluster.samples import wait_until
from tests.webhook.cluster_harness import JOBS_PATH, RUNTIMES_PATH, Installation, running_chart
from tests.webhook.jobs import job

pytestmark = pytest.mark.cluster

DENIED_BY_WEBHOOK = f'admission webhook "{WEBHOOK_NAME}" denied the request'
RUNTIME_LABEL = "asyncgrpo.dev/runtime"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    with running_chart(local_cluster, helm_bin) as installation:
        yield installation


@pytest.fixture
def restricted(chart: Installation) -> Iterator[str]:
    """The documented runtime, applied as an administrator applies it (cluster-scoped)."""
    applied = chart.kubectl("apply", "-f", str(RUNTIME_FILE))
    assert applied.returncode == 0, applied.stderr
    name = str(RUNTIME["metadata"]["name"])
    yield name
    chart.delete_all_jobs(chart.jobs_ns)
    chart.api.delete(f"{RUNTIMES_PATH}/{name}")


def test_a_job_within_the_runtime_is_admitted_and_its_raycluster_runs_as_the_runtime_says(
    chart: Installation, restricted: str
) -> None:
    manifest = job("confined", image=IMAGE, runtimeRef={"name": restricted})
    outcome = chart.kubectl.apply(chart.jobs_ns, manifest)
    assert outcome.returncode == 0, outcome.stderr
    path = f"{JOBS_PATH.format(ns=chart.jobs_ns)}/confined"
    deadline = time.monotonic() + 60
    while not (cluster := chart.api.get(path).get("status", {}).get("rayClusterName")):
        assert time.monotonic() < deadline, f"no status.rayClusterName after 60 s:\n{chart.log_tail()}"
        time.sleep(0.5)
    rendered = chart.api.get(f"/apis/ray.io/v1/namespaces/{chart.jobs_ns}/rayclusters/{cluster}")
    head = rendered["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == RUNTIME["spec"]["serviceAccountName"]
    assert head["securityContext"]["runAsUser"] == RUNTIME["spec"]["securityContext"]["pod"]["runAsUser"]
    for container in head["containers"]:
        assert container["securityContext"]["privileged"] is False, container["name"]
    log = chart.log.read_text(errors="replace")
    assert "Forbidden" not in log and " 403" not in log, chart.log_tail()


def test_a_job_the_runtime_does_not_allow_is_refused_by_the_webhook_naming_field_runtime_and_fix(
    chart: Installation, restricted: str
) -> None:
    manifest = job("unconfined", image=IMAGE, runtimeRef={"name": restricted}, network={"hostNetwork": True})
    outcome = chart.kubectl.apply(chart.jobs_ns, manifest)
    assert outcome.returncode != 0
    assert DENIED_BY_WEBHOOK in outcome.stderr, outcome.stderr
    assert f"spec.network.hostNetwork: AsyncGRPORuntime {restricted} does not allow" in outcome.stderr
    assert "kubectl get asyncgrporuntimes" in outcome.stderr


def test_a_job_naming_a_runtime_that_does_not_exist_is_refused_by_name(
    chart: Installation, restricted: str
) -> None:
    manifest = job("lost", image=IMAGE, runtimeRef={"name": "no-such-runtime"})
    outcome = chart.kubectl.apply(chart.jobs_ns, manifest)
    assert outcome.returncode != 0
    assert DENIED_BY_WEBHOOK in outcome.stderr, outcome.stderr
    assert "spec.runtimeRef.name: AsyncGRPORuntime no-such-runtime does not exist" in outcome.stderr


def test_a_namespace_labelled_with_a_runtime_refuses_new_jobs_that_do_not_name_it(
    chart: Installation, restricted: str
) -> None:
    policy = f"{chart.fullname}-runtime"

    def checked() -> dict[str, Any] | None:
        found = chart.api.get(f"{POLICIES}/{policy}")
        status = found.get("status") or {}
        return status if status.get("observedGeneration") == found["metadata"]["generation"] else None

    status = wait_until(checked, "the runtime policy's typeChecking status", timeout=60)
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), json.dumps(status, indent=1)
    namespace = f"/api/v1/namespaces/{chart.jobs_ns}"
    chart.api.merge_patch(namespace, {"metadata": {"labels": {RUNTIME_LABEL: restricted}}})
    try:
        bare = job("bare", image=IMAGE)

        def refused() -> str | None:
            outcome = chart.kubectl.apply(chart.jobs_ns, bare, "--dry-run=server")
            return outcome.stderr if outcome.returncode != 0 else None

        stderr = wait_until(refused, "the runtime policy enforced", timeout=30)
        assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request" in stderr
        assert f"namespace {chart.jobs_ns} runs only jobs under AsyncGRPORuntime {restricted}" in stderr
        elsewhere = job("elsewhere", image=IMAGE, runtimeRef={"name": "open"})
        assert f"'{policy}' denied request" in chart.kubectl.apply(chart.jobs_ns, elsewhere).stderr
        confined = job("confined", image=IMAGE, runtimeRef={"name": restricted})
        outcome = chart.kubectl.apply(chart.jobs_ns, confined, "--dry-run=server")
        assert outcome.returncode == 0, outcome.stderr
    finally:
        chart.api.merge_patch(namespace, {"metadata": {"labels": {RUNTIME_LABEL: None}}})
