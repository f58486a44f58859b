"""`helm install`, then `kubectl apply`: the webhook accepts, warns, denies and never blocks deletion.

Everything here is real: the chart installed by helm into the local control plane, kube-apiserver
calling the webhook over TLS with the chart's CA, the operator process authenticated only as the
chart's ServiceAccount, and kubectl's own output. See tests/webhook/cluster_harness.py for why the
operator runs as a local process.

The tests run in file order; the last ones stop the operator to check what happens without it.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.naming import spec_configmap_name
from asyncgrpo_operator import certs
from asyncgrpo_operator.webhook import WEBHOOK_NAME
from tests.chart.helm import NO_HELM, REPO, find_helm, template
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import ApiError
from tests.cluster.samples import raycluster_path, wait_until
from tests.e2e.test_operator_hardening import NO_HOST_NETWORK, host_network_refused, samples_of, value
from tests.webhook.cluster_harness import JOBS_PATH, METRICS_READER, Installation, running_chart
from tests.webhook.jobs import (
    INVALID_COMBINATIONS,
    SYNC_WITH_FORCE_IN_ORDER,
    VALID_MODES,
    WEBHOOK_ONLY,
    Case,
    job,
)
from tests.webhook.server import free_port

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))
DENIED_BY_WEBHOOK = f'admission webhook "{WEBHOOK_NAME}" denied the request'
DENIED_BY_POLICY = "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request"


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    with running_chart(local_cluster, helm_bin, metrics_port=free_port()) as installation:
        yield installation


@pytest.fixture
def jobs_ns(chart: Installation) -> Iterator[str]:
    """The namespace the webhook validates and the operator watches; emptied after each test."""
    yield chart.jobs_ns
    chart.delete_all_jobs(chart.jobs_ns)


def rejected(outcome_stderr: str, returncode: int, path: str) -> None:
    assert returncode != 0, "expected kubectl to fail"
    assert path in outcome_stderr, outcome_stderr


# --- the installation itself ---------------------------------------------------------------------


def test_the_operator_runs_with_only_the_chart_service_account(chart: Installation) -> None:
    assert chart.process is not None and chart.process.poll() is None, chart.log_tail()
    sa_kubeconfig = chart.workdir / "sa-kubeconfig"
    can = chart.kubectl("--kubeconfig", str(sa_kubeconfig), "auth", "can-i", "--list")
    assert can.returncode == 0, can.stderr
    for denied in (
        ("get", "secrets"),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
    ):
        answer = chart.kubectl("--kubeconfig", str(sa_kubeconfig), "auth", "can-i", *denied, "-A")
        assert answer.stdout.strip() == "no", denied
    log = chart.log.read_text(errors="replace")
    assert "Forbidden" not in log and " 403" not in log, chart.log_tail()


def test_the_api_server_reaches_the_webhook_through_the_charts_configuration(chart: Installation) -> None:
    vwc = chart.api.get(
        f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{chart.fullname}"
    )
    (entry,) = vwc["webhooks"]
    assert entry["clientConfig"]["url"] == f"https://127.0.0.1:{chart.port}/validate-asyncgrpojob"
    assert entry["failurePolicy"] == "Fail"


def test_the_operator_reconciles_a_job_with_only_the_chart_rbac(chart: Installation, jobs_ns: str) -> None:
    # Creating the RayCluster and the spec ConfigMap and writing status all go through the role.
    if chart.module != "asyncgrpo_operator.main":
        pytest.skip(f"the operator ({chart.module}) does not reconcile")
    manifest = VALID_MODES[0].manifest
    name = manifest["metadata"]["name"]
    assert chart.kubectl.apply(jobs_ns, manifest).returncode == 0
    path = JOBS_PATH.format(ns=jobs_ns) + f"/{name}"
    deadline = time.monotonic() + 60
    while not chart.api.get(path).get("status", {}).get("rayClusterName"):
        assert time.monotonic() < deadline, f"no status.rayClusterName after 60 s:\n{chart.log_tail()}"
        time.sleep(0.5)
    cluster = chart.api.get(path)["status"]["rayClusterName"]
    assert chart.api.get(f"/apis/ray.io/v1/namespaces/{jobs_ns}/rayclusters/{cluster}")
    assert chart.api.get(f"/api/v1/namespaces/{jobs_ns}/configmaps/{spec_configmap_name(name)}")
    log = chart.log.read_text(errors="replace")
    assert "Forbidden" not in log and " 403" not in log, chart.log_tail()


def test_the_operator_holds_the_leader_lease_with_the_chart_role(chart: Installation) -> None:
    if chart.module != "asyncgrpo_operator.main":
        pytest.skip(f"the operator ({chart.module}) does not elect a leader")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{chart.namespace}/leases/asyncgrpo-operator"
    deadline = time.monotonic() + 30
    while True:
        try:
            holder = chart.api.get(path)["spec"].get("holderIdentity", "")
        except ApiError as err:
            assert err.status == 404, err
            holder = ""
        if holder.startswith(f"{chart.fullname}-local"):
            break
        assert time.monotonic() < deadline, f"lease holder {holder!r}:\n{chart.log_tail()}"
        time.sleep(0.5)


def test_helm_upgrade_keeps_the_generated_certificate(chart: Installation) -> None:
    secret_path = f"/api/v1/namespaces/{chart.namespace}/secrets/{chart.fullname}-webhook-tls"
    vwc_path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{chart.fullname}"
    before = (
        chart.api.get(secret_path)["data"],
        chart.api.get(vwc_path)["webhooks"][0]["clientConfig"]["caBundle"],
    )
    chart.upgrade()
    after = (
        chart.api.get(secret_path)["data"],
        chart.api.get(vwc_path)["webhooks"][0]["clientConfig"]["caBundle"],
    )
    assert after == before, "helm upgrade rotated the webhook CA under the running operator"
    assert chart.webhook_answers()


def test_a_rotated_certificate_is_served_without_restarting_the_operator(
    chart: Installation, jobs_ns: str
) -> None:
    # What cert-manager (or deleting the Secret and `helm upgrade`) does: new files under the mount,
    # a new CA in the webhook configuration. The operator re-reads the files every 2 s here.
    assert chart.process is not None
    pid = chart.process.pid
    ca = certs.generate_ca("rotated-e2e-ca")
    certs.write_tls_dir(chart.tls_dir, ca, certs.issue_serving_cert(ca, ["127.0.0.1"]))
    vwc = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{chart.fullname}"
    bundle = base64.b64encode(ca.cert_pem).decode()
    chart.api.request(
        "PATCH",
        vwc,
        json.dumps([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]),
        content_type="application/json-patch+json",
    )
    case = WEBHOOK_ONLY[0]
    deadline = time.monotonic() + 30
    while True:
        outcome = chart.kubectl.apply(jobs_ns, case.manifest)
        if DENIED_BY_WEBHOOK in outcome.stderr:
            break
        assert "failed calling webhook" in outcome.stderr, outcome.stderr  # old cert, new CA: x509 error
        assert time.monotonic() < deadline, outcome.stderr
        time.sleep(0.5)
    assert chart.process.pid == pid and chart.process.poll() is None


# --- admitted, warned, denied --------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_docs_example_is_admitted(chart: Installation, jobs_ns: str, example: Path) -> None:
    outcome = chart.kubectl("apply", "-n", jobs_ns, "-f", str(example))
    assert outcome.returncode == 0, outcome.stderr
    assert "created" in outcome.stdout


@pytest.mark.parametrize("case", VALID_MODES, ids=lambda c: c.id)
def test_each_mode_of_the_knob_table_is_admitted(chart: Installation, jobs_ns: str, case: Case) -> None:
    outcome = chart.kubectl.apply(jobs_ns, case.manifest)
    assert outcome.returncode == 0, outcome.stderr


@pytest.mark.parametrize("case", INVALID_COMBINATIONS, ids=lambda c: c.id)
def test_each_invalid_combination_is_rejected_naming_the_field(
    chart: Installation, jobs_ns: str, case: Case
) -> None:
    # The chart's ValidatingAdmissionPolicy runs before admission webhooks, so these six are
    # refused by the API server itself; the webhook would refuse them too (tests/webhook/test_review.py).
    outcome = chart.kubectl.apply(jobs_ns, case.manifest)
    assert case.path is not None
    rejected(outcome.stderr, outcome.returncode, case.path)
    assert DENIED_BY_POLICY.format(name=chart.fullname) in outcome.stderr


@pytest.mark.parametrize("case", WEBHOOK_ONLY, ids=lambda c: c.id)
def test_rules_cel_cannot_express_are_denied_by_the_webhook(
    chart: Installation, jobs_ns: str, case: Case
) -> None:
    outcome = chart.kubectl.apply(jobs_ns, case.manifest)
    assert case.path is not None
    rejected(outcome.stderr, outcome.returncode, case.path)
    assert DENIED_BY_WEBHOOK in outcome.stderr


def test_every_error_is_listed_in_one_denial(chart: Installation, jobs_ns: str) -> None:
    manifest = job(
        "two-errors",
        policy={"trainMicroBatchSize": 5},
        trainer={"loss": {"truncatedImportanceSamplingType": "icepop"}},
    )
    outcome = chart.kubectl.apply(jobs_ns, manifest)
    assert DENIED_BY_WEBHOOK in outcome.stderr
    assert '"two-errors" is invalid (2 errors)' in outcome.stderr
    for case in WEBHOOK_ONLY:
        assert f"- {case.path}: " in outcome.stderr


def test_sync_mode_with_force_in_order_is_admitted_with_a_warning(chart: Installation, jobs_ns: str) -> None:
    outcome = chart.kubectl.apply(jobs_ns, SYNC_WITH_FORCE_IN_ORDER)
    assert outcome.returncode == 0, outcome.stderr
    assert "Warning: spec.trainer.asyncRL.forceInOrder: is ignored in sync mode" in outcome.stderr


def test_changing_a_locked_field_is_refused_and_suspend_is_not(chart: Installation, jobs_ns: str) -> None:
    manifest = VALID_MODES[1].manifest
    name = manifest["metadata"]["name"]
    assert chart.kubectl.apply(jobs_ns, manifest).returncode == 0
    changed = copy.deepcopy(manifest)
    changed["spec"]["trainer"]["grpo"]["maxNumSteps"] = 7
    outcome = chart.kubectl.apply(jobs_ns, changed)
    rejected(outcome.stderr, outcome.returncode, "spec.trainer: cannot change once the job exists")
    assert DENIED_BY_WEBHOOK in outcome.stderr
    suspend = chart.kubectl(
        "patch", "-n", jobs_ns, "asyncgrpojob", name, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    assert suspend.returncode == 0, suspend.stderr


def test_placement_is_locked_once_the_operator_runs_the_job(chart: Installation, jobs_ns: str) -> None:
    manifest = VALID_MODES[0].manifest
    name = manifest["metadata"]["name"]
    assert chart.kubectl.apply(jobs_ns, manifest).returncode == 0
    path = JOBS_PATH.format(ns=jobs_ns) + f"/{name}"
    deadline = time.monotonic() + 60
    # Once the operator has created the job's RayCluster, the placement is locked. (Before that it
    # may change; reading the status and then patching would race the operator's create.)
    while not chart.api.get(path).get("status", {}).get("rayClusterName"):
        if chart.module != "asyncgrpo_operator.main" or time.monotonic() > deadline:
            pytest.skip(f"the operator ({chart.module}) created no RayCluster; nothing runs the job")
        time.sleep(0.5)
    patch = '{"spec":{"cluster":{"head":{"nodeSelector":{"pool":"other"}}}}}'
    outcome = chart.kubectl("patch", "-n", jobs_ns, "asyncgrpojob", name, "--type=merge", "-p", patch)
    rejected(outcome.stderr, outcome.returncode, "spec.cluster: cannot change while the job runs")
    # A label-only update reaches the webhook too when it is the queue's (matchConditions): handing
    # a running job to Kueue would suspend it mid-run.
    label = chart.kubectl("label", "-n", jobs_ns, "asyncgrpojob", name, "kueue.x-k8s.io/queue-name=team-a")
    rejected(
        label.stderr,
        label.returncode,
        "metadata.labels.kueue.x-k8s.io/queue-name: cannot change while the job runs",
    )
    assert chart.kubectl("label", "-n", jobs_ns, "asyncgrpojob", name, "team=rl").returncode == 0


def test_deleting_a_job_is_never_blocked(chart: Installation, jobs_ns: str) -> None:
    manifest = job("held")
    manifest["metadata"]["finalizers"] = ["asyncgrpo.dev/test-hold"]
    assert chart.kubectl.apply(jobs_ns, manifest).returncode == 0
    assert chart.kubectl("delete", "-n", jobs_ns, "asyncgrpojob", "held", "--wait=false").returncode == 0
    release = chart.kubectl(
        "patch",
        "-n",
        jobs_ns,
        "asyncgrpojob",
        "held",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
    )
    assert release.returncode == 0, release.stderr
    gone = chart.kubectl("wait", "-n", jobs_ns, "--for=delete", "asyncgrpojob/held", "--timeout=30s")
    assert gone.returncode == 0, gone.stderr


# --- the RayCluster, dry-run by the API server --------------------------------------------------


def test_a_job_whose_raycluster_the_api_server_would_refuse_is_refused_at_apply(
    chart: Installation, jobs_ns: str
) -> None:
    """The webhook dry-runs the job's RayCluster (dryRun=All): a cluster policy on RayClusters,
    which the rules know nothing of, refuses the job at `kubectl apply`, in the policy's words."""
    exposed = job("exposed", network={"hostNetwork": True})
    with host_network_refused(chart.api, jobs_ns):
        outcome = chart.kubectl.apply(jobs_ns, exposed)
        rejected(outcome.stderr, outcome.returncode, NO_HOST_NETWORK)
        assert (
            DENIED_BY_WEBHOOK in outcome.stderr
            and "spec: the API server refused the RayCluster exposed-0" in (outcome.stderr)
        )
        fine = chart.kubectl.apply(jobs_ns, job("unexposed"))
        assert fine.returncode == 0, fine.stderr
    # Nothing was created by the dry-run, and without the policy the same job is admitted.
    assert (
        chart.api.get(raycluster_path(jobs_ns), labelSelector="asyncgrpo.dev/job-name=exposed")["items"] == []
    )

    def admitted() -> bool | None:  # the API server drops the policy from its cache within seconds
        return chart.kubectl.apply(jobs_ns, exposed).returncode == 0 or None

    wait_until(admitted, "the same job admitted once the policy is gone", timeout=30)


def test_admissions_and_dry_runs_are_counted_in_the_operators_metrics(
    chart: Installation, jobs_ns: str
) -> None:
    token = chart.token(METRICS_READER)

    def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
        status, text = chart.read_metrics(token)
        assert status == 200, text
        return samples_of(text)

    before = scrape()
    assert chart.kubectl.apply(jobs_ns, job("counted")).returncode == 0
    refused = chart.kubectl.apply(jobs_ns, WEBHOOK_ONLY[0].manifest)  # the policy lets it by, the webhook not
    assert refused.returncode != 0 and DENIED_BY_WEBHOOK in refused.stderr
    after = scrape()

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("asyncgrpo_admission_requests_total", operation="CREATE", verdict="allowed") == 1
    assert grew("asyncgrpo_admission_requests_total", operation="CREATE", verdict="denied") == 1
    assert grew("asyncgrpo_admission_duration_seconds_count", operation="CREATE") == 2
    assert (
        grew("asyncgrpo_admission_dry_runs_total", result="accepted") == 1
    )  # the refused one never got there
    assert grew("asyncgrpo_api_requests_total", verb="create", resource="rayclusters", code="200") >= 1


# --- without the webhook -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_ns(chart: Installation) -> Iterator[str]:
    """A namespace outside the webhook's namespaceSelector: only the CRD's schema applies."""
    name = chart.jobs_namespace("no-webhook", validated=False)
    yield name
    chart.delete_namespace(name)


def test_outside_the_webhooks_namespaces_the_policy_does_not_judge_either(
    chart: Installation, plain_ns: str
) -> None:
    """The policy is never stricter than the webhook: where webhook.namespaceSelector does not
    reach, neither judges (the trainer still refuses the job at start), while the CRD's schema
    and its own CEL (a volume's one source, the name's length) still do."""
    outcome = chart.kubectl.apply(plain_ns, INVALID_COMBINATIONS[0].manifest)
    assert outcome.returncode == 0, outcome.stderr
    too_long = job("x" * 52)
    refused = chart.kubectl.apply(plain_ns, too_long)
    rejected(refused.stderr, refused.returncode, "metadata.name")
    assert "admission webhook" not in refused.stderr and "ValidatingAdmissionPolicy" not in refused.stderr


def test_with_the_operator_down_deletion_and_metadata_updates_still_pass(
    chart: Installation, jobs_ns: str
) -> None:
    held = job("held-while-down")
    held["metadata"]["finalizers"] = ["asyncgrpo.dev/test-hold"]
    assert chart.kubectl.apply(jobs_ns, held).returncode == 0
    chart.stop_operator()
    assert not chart.webhook_answers()

    # failurePolicy Fail: a new job is refused while nothing could run it ...
    refused = chart.kubectl.apply(jobs_ns, VALID_MODES[2].manifest)
    assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
    # ... the ValidatingAdmissionPolicy still names the field of an invalid one (the API server
    # evaluates it before any webhook) ...
    bad = INVALID_COMBINATIONS[0]
    cel = chart.kubectl.apply(jobs_ns, bad.manifest)
    assert bad.path is not None
    rejected(cel.stderr, cel.returncode, bad.path)
    assert DENIED_BY_POLICY.format(name=chart.fullname) in cel.stderr
    # ... and labels, finalizers and deletion never reach the webhook (matchConditions).
    label = chart.kubectl("label", "-n", jobs_ns, "asyncgrpojob", "held-while-down", "team=rl")
    assert label.returncode == 0, label.stderr
    assert (
        chart.kubectl("delete", "-n", jobs_ns, "asyncgrpojob", "held-while-down", "--wait=false").returncode
        == 0
    )
    unblock = chart.kubectl(
        "patch",
        "-n",
        jobs_ns,
        "asyncgrpojob",
        "held-while-down",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
    )
    assert unblock.returncode == 0, unblock.stderr
    with pytest.raises(ApiError) as err:
        for _ in range(100):
            chart.api.get(JOBS_PATH.format(ns=jobs_ns) + "/held-while-down")
            time.sleep(0.1)
    assert err.value.status == 404


def test_helm_uninstall_removes_the_webhook_configuration(local_cluster: LocalCluster) -> None:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    installation = Installation(local_cluster, helm_bin)
    installation.install()
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{installation.fullname}"
    assert local_cluster.api.get(path)["webhooks"]
    installation.uninstall()
    with pytest.raises(ApiError) as err:
        local_cluster.api.get(path)
    assert err.value.status == 404
    crd = yaml.safe_load((REPO / "crds" / "asyncgrpo.dev_asyncgrpojobs.yaml").read_text())
    assert local_cluster.api.get(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    )


CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager@v1.16.2"


def cert_manager_crds() -> list[dict[str, Any]]:
    """cert-manager's CRDs from its Go module (the Go module cache, or the module proxy)."""
    try:
        with tempfile.TemporaryDirectory() as outside_any_module:
            out = subprocess.run(
                ["go", "mod", "download", "-json", CERT_MANAGER_MODULE],
                capture_output=True,
                text=True,
                timeout=180,
                check=True,
                cwd=outside_any_module,
                env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
            ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"cannot fetch {CERT_MANAGER_MODULE} for its CRDs: {err}")
    folder = Path(json.loads(out)["Dir"]) / "deploy" / "crds"
    crds = []
    for path in sorted(folder.glob("crd-*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crd["metadata"] = {"name": crd["metadata"]["name"]}  # drop helm-templated labels
        crds.append(crd)
    return crds


def test_cert_manager_objects_are_valid_for_cert_manager(chart: Installation) -> None:
    # No cert-manager controller runs here; its CRDs validate the Certificate and Issuers the chart
    # renders for webhook.tls.certManager.enabled (a server-side dry run against the real schemas).
    for crd in cert_manager_crds():
        chart.api.apply(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}", crd
        )
    for name in ("certificates.cert-manager.io", "issuers.cert-manager.io"):
        done = chart.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        assert done.returncode == 0, done.stderr
    for issuer_ref in ({}, {"name": "corp-ca", "kind": "ClusterIssuer"}):
        objects = template(
            chart.helm_bin,
            {"webhook.tls.certManager.enabled": True, "webhook.tls.certManager.issuerRef": issuer_ref},
            namespace=chart.namespace,
        )
        cm = [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]
        assert cm
        text = yaml.safe_dump_all(cm)
        outcome = chart.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-n", chart.namespace, "-f", "-", stdin=text
        )
        assert outcome.returncode == 0, outcome.stderr
