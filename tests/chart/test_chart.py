"""The chart as rendered by `helm template`/`helm lint`: what a user installs."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from asyncgrpo_operator import certs
from asyncgrpo_operator.webhook import DEFAULT_CERT_DIR, WEBHOOK_NAME, WEBHOOK_PATH
from tests.api.test_admission_policy import cel
from tests.chart.helm import CHART, REPO, HelmError, by_kind, helm, kube_version, one, template

Objects = list[dict[str, Any]]


def deployment(objects: Objects, role: str = "reconciler") -> dict[str, Any]:
    """The reconciler's Deployment, or the webhook's (`role="webhook"`)."""
    (found,) = [
        d
        for d in by_kind(objects, "Deployment")
        if d["metadata"]["name"].endswith("-webhook") == (role == "webhook")
    ]
    return found


def container(objects: Objects, role: str = "reconciler") -> dict[str, Any]:
    pod = deployment(objects, role)["spec"]["template"]["spec"]
    (operator,) = pod["containers"]
    return dict(operator)


def env(objects: Objects, role: str = "reconciler") -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(objects, role)["env"]}


AGGREGATED = "agrpo-asyncgrpo-operator-edit", "agrpo-asyncgrpo-operator-view"
INVARIANTS_POLICY = "agrpo-asyncgrpo-operator"
RUNTIME_POLICY = "agrpo-asyncgrpo-operator-runtime"


def named(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


METRICS_READER = "agrpo-asyncgrpo-operator-metrics-reader"


def operator_role(objects: Objects) -> dict[str, Any]:
    """The ClusterRole bound to the operator (the others are users': aggregated into edit/view,
    and the right to read /metrics)."""
    (role,) = [
        o
        for o in by_kind(objects, "ClusterRole")
        if o["metadata"]["name"] not in {*AGGREGATED, METRICS_READER}
    ]
    return role


def webhook_secret(objects: Objects) -> dict[str, Any]:
    """The webhook's generated TLS Secret (the other Secret is the Ray token key)."""
    (secret,) = tls_secrets(objects)
    return secret


def tls_secrets(objects: Objects) -> Objects:
    return [s for s in by_kind(objects, "Secret") if s.get("type") == "kubernetes.io/tls"]


def webhook_entry(objects: Objects) -> dict[str, Any]:
    (entry,) = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    return dict(entry)


def test_chart_crd_is_a_byte_copy_of_the_generated_crd() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    copied = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert copied == generated
    for name in generated:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/asyncgrpo-operator/crds/{name} is stale: cp crds/{name} charts/asyncgrpo-operator/crds/"
        )


def test_helm_lint_passes_strictly(helm_bin: Path) -> None:
    out = helm("lint", "--strict", "--kube-version", kube_version(), str(CHART), helm_bin=helm_bin)
    assert "0 chart(s) failed" in out


def test_lint_also_passes_with_cert_manager_and_url_mode(helm_bin: Path) -> None:
    for flag in ("webhook.tls.certManager.enabled=true", "webhook.url=https://127.0.0.1:19443"):
        helm(
            "lint", "--strict", "--kube-version", kube_version(), str(CHART), "--set", flag, helm_bin=helm_bin
        )


def test_default_install_renders_the_expected_objects(default_objects: Objects) -> None:
    kinds = sorted(o["kind"] for o in default_objects)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",  # AsyncGRPOJob
            "CustomResourceDefinition",  # AsyncGRPORuntime
            "ServiceAccount",
            "ClusterRole",  # the operator's
            "ClusterRole",  # users': aggregated into edit and admin
            "ClusterRole",  # users': aggregated into view
            "ClusterRole",  # get /metrics, for Prometheus
            "ClusterRoleBinding",
            "Role",  # the leader-election Lease
            "RoleBinding",
            "PodDisruptionBudget",  # two webhook replicas: one keeps serving through a drain
            "Deployment",  # the reconciler
            "Deployment",  # the webhook (admission only)
            "Service",  # webhook
            "Service",  # the reconciler's metrics
            "Service",  # the webhook's metrics
            "NetworkPolicy",  # the webhook's pods: its port and the metrics port only
            "Secret",  # generated webhook certificate
            "Secret",  # generated key of the jobs' Ray tokens
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",  # the invariants CEL can express, while no webhook answers
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # a namespace's runtime (label asyncgrpo.dev/runtime)
            "ValidatingAdmissionPolicyBinding",
        ]
    )


def test_operator_pod_is_locked_down(default_objects: Objects) -> None:
    pod = deployment(default_objects)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(default_objects)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = container(default_objects)["resources"]
    assert set(resources) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_probes_target_kopf_liveness_and_the_webhook_listener(default_objects: Objects) -> None:
    for role in ("reconciler", "webhook"):
        c = container(default_objects, role)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in c["args"]
    c = container(default_objects, "webhook")
    assert c["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    assert env(default_objects, "webhook")["ASYNCGRPO_WEBHOOK_PORT"] == str(c["ports"][0]["containerPort"])
    assert container(default_objects)["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_admission_is_served_by_a_deployment_of_its_own_and_the_reconciler_serves_none(
    default_objects: Objects,
) -> None:
    """Issue 47 item 5: the reconciler, which watches what tenants write, could be OOM-killed into
    a crash loop, and admission (failurePolicy Fail) with it. The webhook Service now routes to a
    Deployment that only admits, with a selector the reconciler's pods do not match."""
    reconciler, webhook = container(default_objects), container(default_objects, "webhook")
    assert "--role=reconciler" in reconciler["args"] and "--role=webhook" in webhook["args"]
    assert "webhook" not in {p["name"] for p in reconciler["ports"]}
    assert not [name for name in env(default_objects) if name.startswith("ASYNCGRPO_WEBHOOK_")]
    assert "ASYNCGRPO_RAY_TOKEN_KEY_FILE" not in env(default_objects, "webhook")
    service = named(default_objects, "Service", "agrpo-asyncgrpo-operator-webhook")
    webhook_pods = deployment(default_objects, "webhook")["spec"]["template"]["metadata"]["labels"]
    reconciler_pods = deployment(default_objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= webhook_pods.items()
    assert not service["spec"]["selector"].items() <= reconciler_pods.items()
    assert not deployment(default_objects)["spec"]["selector"]["matchLabels"].items() <= webhook_pods.items()
    assert deployment(default_objects, "webhook")["spec"]["replicas"] == 2


def test_the_webhooks_pods_take_connections_on_its_port_alone_and_a_client_ca_when_given(
    default_objects: Objects, helm_bin: Path
) -> None:
    """Issue 47 item 9: a NetworkPolicy (where the network plugin enforces it), and with
    webhook.clientAuth.caBundle the webhook answers only callers with a certificate that CA signed."""
    (policy,) = by_kind(default_objects, "NetworkPolicy")
    webhook_pods = deployment(default_objects, "webhook")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= webhook_pods.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"]]
    assert ports == [[9443], [9090]]
    assert "ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE" not in env(default_objects, "webhook")
    ca = base64.b64encode(certs.generate_ca().cert_pem).decode()
    control_plane = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    objects = template(
        helm_bin, {"webhook.clientAuth.caBundle": ca, "webhook.networkPolicy.from": control_plane}
    )
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == control_plane
    path = env(objects, "webhook")["ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE"]
    configmap = named(objects, "ConfigMap", "agrpo-asyncgrpo-operator-webhook-client-ca")
    assert configmap["data"]["ca.crt"].strip() == base64.b64decode(ca).decode().strip()
    mount = next(m for m in container(objects, "webhook")["volumeMounts"] if m["name"] == "webhook-client-ca")
    assert path == f"{mount['mountPath']}/ca.crt"
    assert not by_kind(template(helm_bin, {"webhook.networkPolicy.enabled": False}), "NetworkPolicy")


def test_operator_runs_its_own_entrypoint_on_all_namespaces(default_objects: Objects) -> None:
    c = container(default_objects)
    assert c["command"] == ["python", "-m", "asyncgrpo_operator"]
    assert "--log-format=json" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--namespace")]


def test_webhook_certificate_is_mounted_where_the_operator_reads_it(default_objects: Objects) -> None:
    c = container(default_objects, "webhook")
    pod = deployment(default_objects, "webhook")["spec"]["template"]["spec"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "webhook-tls")
    assert (
        mount["mountPath"]
        == env(default_objects, "webhook")["ASYNCGRPO_WEBHOOK_CERT_DIR"]
        == str(DEFAULT_CERT_DIR)
    )
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    secret = webhook_secret(default_objects)
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert secret["type"] == "kubernetes.io/tls"


def test_rbac_reads_no_secrets_and_has_no_wildcards(default_objects: Objects) -> None:
    """The operator creates each job's Ray token Secret and reads none: its tokens are derived from
    its key, a mounted volume (a reader of Secrets cluster-wide would hold every tenant's)."""
    rules = operator_role(default_objects)["rules"]
    for rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["create"], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def granted(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            verbs |= set(rule["verbs"])
    return verbs


def test_rbac_covers_what_the_operator_and_kopf_call(default_objects: Objects) -> None:
    rules = operator_role(default_objects)["rules"]
    # what asyncgrpo_operator.k8s calls (its informers list and watch RayClusters, pods and
    # ConfigMaps), plus kopf's watch of jobs; a pass reads from those caches, never with a GET
    assert granted(rules, "asyncgrpo.dev", "asyncgrpojobs") == {"list", "watch", "delete", "patch"}
    assert granted(rules, "asyncgrpo.dev", "asyncgrpojobs/status") == {"patch"}
    assert granted(rules, "asyncgrpo.dev", "asyncgrpojobs/finalizers") == {"update"}
    assert granted(rules, "ray.io", "rayclusters") == {"create", "list", "watch", "delete", "patch"}
    assert granted(rules, "kueue.x-k8s.io", "workloads") == {"list", "watch", "create", "patch", "delete"}
    assert granted(rules, "kueue.x-k8s.io", "workloads/status") == {"patch"}
    assert granted(rules, "kueue.x-k8s.io", "resourceflavors") == {"get"}
    assert granted(rules, "scheduling.k8s.io", "priorityclasses") == {"get"}
    assert granted(rules, "asyncgrpo.dev", "asyncgrporuntimes") == {"get"}, "a job's runtime, read afresh"
    assert granted(rules, "", "configmaps") == {"create", "patch", "list", "watch"}
    assert granted(rules, "", "pods") == {"list", "watch"}
    assert granted(rules, "", "secrets") == {"create"}, "each job's Ray token Secret, never read back"
    assert granted(rules, "networking.k8s.io", "networkpolicies") == {"create", "get", "update"}
    assert granted(rules, "", "events") == {"create"}
    assert not granted(rules, "", "namespaces"), "kopf reads no namespaces when it watches all of them"
    assert granted(rules, "apiextensions.k8s.io", "customresourcedefinitions") == {"list", "watch"}
    # who scrapes /metrics (metrics.secure): the caller's token, then its right to get /metrics
    assert granted(rules, "authentication.k8s.io", "tokenreviews") == {"create"}
    assert granted(rules, "authorization.k8s.io", "subjectaccessreviews") == {"create"}
    assert not granted(rules, "coordination.k8s.io", "leases"), "the Lease is a Role in the release namespace"
    assert not granted(rules, "admissionregistration.k8s.io", "validatingwebhookconfigurations"), (
        "the chart owns the webhook configuration; the operator must not be able to rewrite it"
    )
    binding = one(default_objects, "ClusterRoleBinding")
    sa = one(default_objects, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "asyncgrpo-system"}
    ]


def test_with_watched_namespaces_the_operator_gets_roles_there_and_nothing_namespaced_cluster_wide(
    helm_bin: Path,
) -> None:
    objects = template(
        helm_bin,
        {
            "operator.watchNamespaces": ["team-a", "team-b"],
            "replicaCount": 1,
            "leaderElection.enabled": False,
        },
    )
    cluster_rules = operator_role(objects)["rules"]
    # Only what no Role can grant: cluster-scoped objects a job names, read by name, and the two
    # reviews of /metrics callers. kopf's scanning is off, so no CRDs and no namespaces.
    assert {r for rule in cluster_rules for r in rule["resources"]} == {
        "resourceflavors",
        "workloadpriorityclasses",
        "priorityclasses",
        "asyncgrporuntimes",
        "tokenreviews",
        "subjectaccessreviews",
    }
    for group, resource in (
        ("kueue.x-k8s.io", "resourceflavors"),
        ("kueue.x-k8s.io", "workloadpriorityclasses"),
        ("scheduling.k8s.io", "priorityclasses"),
        ("asyncgrpo.dev", "asyncgrporuntimes"),
    ):
        assert granted(cluster_rules, group, resource) == {"get"}, resource
    assert granted(cluster_rules, "authentication.k8s.io", "tokenreviews") == {"create"}
    assert granted(cluster_rules, "authorization.k8s.io", "subjectaccessreviews") == {"create"}
    roles = {r["metadata"]["namespace"]: r["rules"] for r in by_kind(objects, "Role")}
    assert set(roles) == {"team-a", "team-b"}
    for rules in roles.values():
        assert granted(rules, "asyncgrpo.dev", "asyncgrpojobs") == {"list", "watch", "delete", "patch"}
        assert granted(rules, "ray.io", "rayclusters") == {"create", "list", "watch", "delete", "patch"}
        assert granted(rules, "", "configmaps") == {"create", "patch", "list", "watch"}
    bindings = by_kind(objects, "RoleBinding")
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    assert all(b["subjects"][0]["name"] == sa and b["roleRef"]["kind"] == "Role" for b in bindings)


def test_with_watched_namespaces_the_webhook_and_the_policy_judge_only_those_namespaces(
    helm_bin: Path,
) -> None:
    """The operator may dry-run RayClusters only there, and another install's operator, running
    the other namespaces' jobs, must not meet this install's webhook (its matchConditions exempt
    this install's ServiceAccount only). An explicit webhook.namespaceSelector still wins."""
    watched = {"operator.watchNamespaces": ["team-a", "team-b"]}
    objects = template(helm_bin, watched)
    only_those = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }
    (hook,) = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"] == only_those
    policies = [
        p
        for p in by_kind(objects, "ValidatingAdmissionPolicy")
        if not p["metadata"]["name"].endswith("-runtime")
    ]
    assert [p["spec"]["matchConstraints"]["namespaceSelector"] for p in policies] == [only_those]
    chosen = {"matchLabels": {"tenant": "a"}}
    objects = template(helm_bin, {**watched, "webhook.namespaceSelector": chosen})
    (hook,) = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"] == chosen


def test_jobs_that_name_no_queue_meet_a_mutating_webhook_only_where_kueues_settings_say(
    helm_bin: Path, default_objects: Objects
) -> None:
    """kueue.manageJobsWithoutQueueName (or localQueueDefaulting) adds the webhook that queues such
    a job in LocalQueue default or refuses it (issue 47, item 11): in the namespaces both admission
    and Kueue's managedJobsNamespaceSelector pick, for a job without the queue label, and of
    updates only those that remove it; with the rights and settings it needs. Off by default."""
    assert not by_kind(default_objects, "MutatingWebhookConfiguration")
    assert not granted(operator_role(default_objects)["rules"], "kueue.x-k8s.io", "localqueues")
    objects = template(
        helm_bin,
        {"kueue.manageJobsWithoutQueueName": True, "operator.watchNamespaces": ["team-a"]},
    )
    (hook,) = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == "/default-queue-asyncgrpojob"
    assert hook["clientConfig"]["caBundle"] == webhook_entry(objects)["clientConfig"]["caBundle"]
    assert (hook["failurePolicy"], hook["reinvocationPolicy"]) == ("Fail", "Never")
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]},
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kueue-system"],
            },
        ]
    }
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "DoesNotExist"}]
    }
    conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
    assert conditions["created-or-label-removed"] == (
        "request.operation == 'CREATE' || (has(oldObject.metadata.labels) && "
        "'kueue.x-k8s.io/queue-name' in oldObject.metadata.labels)"
    )
    assert (
        conditions["not-the-operator"]
        == {c["name"]: c["expression"] for c in webhook_entry(objects)["matchConditions"]}["not-the-operator"]
    )
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["namespace"] == "team-a"]
    assert granted(role["rules"], "kueue.x-k8s.io", "localqueues") == {"get"}
    assert env(objects, "webhook")["ASYNCGRPO_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME"] == "true"
    assert "ASYNCGRPO_KUEUE_LOCAL_QUEUE_DEFAULTING" not in env(objects, "webhook")
    defaulting = template(helm_bin, {"kueue.localQueueDefaulting": True})
    assert one(defaulting, "MutatingWebhookConfiguration")
    assert env(defaulting, "webhook")["ASYNCGRPO_KUEUE_LOCAL_QUEUE_DEFAULTING"] == "true"


def test_users_get_jobs_through_the_default_edit_admin_and_view_roles(default_objects: Objects) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(default_objects, "ClusterRole")}
    edit, view = (roles[name] for name in AGGREGATED)
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert granted(edit["rules"], "asyncgrpo.dev", "asyncgrpojobs") >= {"create", "update", "delete", "get"}
    assert granted(edit["rules"], "asyncgrpo.dev", "asyncgrpojobs/status") == {"get", "list", "watch"}
    assert granted(view["rules"], "asyncgrpo.dev", "asyncgrpojobs") == {"get", "list", "watch"}
    assert granted(view["rules"], "asyncgrpo.dev", "asyncgrporuntimes") == {"get", "list", "watch"}
    assert not granted(edit["rules"], "asyncgrpo.dev", "asyncgrporuntimes"), "runtimes are administrators'"
    bound = {b["roleRef"]["name"] for b in by_kind(default_objects, "ClusterRoleBinding")}
    assert not bound & set(AGGREGATED), "the users' roles are never bound to the operator"


def test_webhook_configuration_is_deliberate(default_objects: Objects) -> None:
    entry = webhook_entry(default_objects)
    assert entry["name"] == WEBHOOK_NAME
    assert entry["failurePolicy"] == "Fail"
    assert entry["sideEffects"] == "None"
    assert entry["matchPolicy"] == "Equivalent"
    assert entry["timeoutSeconds"] == 5
    assert entry["admissionReviewVersions"] == ["v1"]
    assert entry["rules"] == [
        {
            "apiGroups": ["asyncgrpo.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["asyncgrpojobs"],
            "scope": "Namespaced",
        }
    ]
    assert entry["namespaceSelector"] == {} and entry["objectSelector"] == {}
    expressions = {c["name"]: c["expression"] for c in entry["matchConditions"]}
    operator = (
        f"system:serviceaccount:asyncgrpo-system:{one(default_objects, 'ServiceAccount')['metadata']['name']}"
    )
    assert expressions == {
        "not-the-operator": f"request.userInfo.username != '{operator}'",
        "not-being-deleted": "!has(object.metadata.deletionTimestamp)",
        "spec-or-queue-changed": (
            "request.operation != 'UPDATE' || object.spec != oldObject.spec || "
            "['kueue.x-k8s.io/queue-name', 'kueue.x-k8s.io/priority-class'].exists(k, "
            "(has(object.metadata.labels) && k in object.metadata.labels ? "
            "object.metadata.labels[k] : '') != "
            "(has(oldObject.metadata.labels) && k in oldObject.metadata.labels ? "
            "oldObject.metadata.labels[k] : ''))"
        ),
    }


def test_the_operators_own_writes_never_reach_the_webhook(default_objects: Objects) -> None:
    """Suspending a job Kueue evicted must not depend on the webhook's answer (a 413 for a large
    job kept a preempted job running): the operator's ServiceAccount is matched out, and a user's
    update of the same job is still judged."""
    (condition,) = [
        c for c in webhook_entry(default_objects)["matchConditions"] if c["name"] == "not-the-operator"
    ]
    sa = one(default_objects, "ServiceAccount")["metadata"]
    operator = f"system:serviceaccount:{sa['namespace']}:{sa['name']}"
    for username, judged in ((operator, False), ("alice", True), (f"{operator}-lookalike", True)):
        request = {"userInfo": {"username": username}, "operation": "UPDATE"}
        assert bool(cel(condition["expression"], request=request)) is judged, username


def test_webhook_calls_the_service_on_the_kopf_handler_path(default_objects: Objects) -> None:
    service_ref = webhook_entry(default_objects)["clientConfig"]["service"]
    services = {s["metadata"]["name"]: s for s in by_kind(default_objects, "Service")}
    svc = services[service_ref["name"]]
    assert service_ref["path"] == WEBHOOK_PATH, "a path other than the handler id would admit everything"
    assert service_ref["namespace"] == "asyncgrpo-system"
    (port,) = svc["spec"]["ports"]
    assert service_ref["port"] == port["port"] and port["targetPort"] == "webhook"
    assert (
        svc["spec"]["selector"] == deployment(default_objects, "webhook")["spec"]["selector"]["matchLabels"]
    )


def test_the_ray_token_key_is_generated_and_mounted_where_the_operator_reads_it(
    default_objects: Objects,
) -> None:
    """One key for every replica and every restart: the jobs' Ray tokens are derived from it."""
    (secret,) = [
        s for s in by_kind(default_objects, "Secret") if s["metadata"]["name"].endswith("-ray-token-key")
    ]
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    pod = deployment(default_objects)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "ray-token-key")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    mount = next(m for m in container(default_objects)["volumeMounts"] if m["name"] == "ray-token-key")
    path = Path(env(default_objects)["ASYNCGRPO_RAY_TOKEN_KEY_FILE"])
    assert str(path.parent) == mount["mountPath"] and path.name == volume["secret"]["items"][0]["path"]


def test_the_jobs_network_policies_admit_the_operator_pods_by_the_labels_they_carry(
    default_objects: Objects,
) -> None:
    pod = deployment(default_objects)["spec"]["template"]
    pairs = env(default_objects)["ASYNCGRPO_OPERATOR_POD_LABELS"].split(",")
    labels = dict(pair.split("=", 1) for pair in pairs)
    assert labels and labels.items() <= pod["metadata"]["labels"].items()
    assert "POD_NAMESPACE" in env(default_objects)


def load_cert(b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def test_generated_certificate_is_signed_by_the_ca_bundle_and_names_the_service(
    default_objects: Objects,
) -> None:
    secret = webhook_secret(default_objects)
    ca = load_cert(webhook_entry(default_objects)["clientConfig"]["caBundle"])
    assert load_cert(secret["data"]["ca.crt"]) == ca
    cert = load_cert(secret["data"]["tls.crt"])
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)  # raises InvalidSignature if the CA did not sign it
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "agrpo-asyncgrpo-operator-webhook.asyncgrpo-system.svc" in sans.get_values_for_type(x509.DNSName)


def test_cert_manager_switch_replaces_the_generated_secret(helm_bin: Path) -> None:
    objects = template(helm_bin, {"webhook.tls.certManager.enabled": True})
    assert not tls_secrets(objects)
    certificates = {c["metadata"]["name"]: c for c in by_kind(objects, "Certificate")}
    serving = certificates["agrpo-asyncgrpo-operator-webhook"]
    annotations = one(objects, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert (
        annotations["cert-manager.io/inject-ca-from"] == "asyncgrpo-system/agrpo-asyncgrpo-operator-webhook"
    )
    assert "caBundle" not in webhook_entry(objects)["clientConfig"]
    pod = deployment(objects)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert serving["spec"]["secretName"] == volume["secret"]["secretName"]
    assert "agrpo-asyncgrpo-operator-webhook.asyncgrpo-system.svc" in serving["spec"]["dnsNames"]
    assert serving["spec"]["issuerRef"]["name"] == "agrpo-asyncgrpo-operator-webhook-ca"
    assert {i["metadata"]["name"] for i in by_kind(objects, "Issuer")} == {
        "agrpo-asyncgrpo-operator-selfsigned",
        "agrpo-asyncgrpo-operator-webhook-ca",
    }


def test_a_provided_certificate_and_ray_token_key_render_the_same_objects_on_every_helm_template(
    helm_bin: Path,
) -> None:
    """Argo CD renders with `helm template`, where `lookup` finds nothing: a chart that generates
    its certificate then renders a new CA on every refresh (and rotates it on every sync), and a
    generated Ray token key would change too (every existing job's /progress refused from then)."""
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    values = {
        "webhook.tls.caBundle": ca,
        "webhook.tls.secretName": "my-webhook-tls",
        "rayTokens.keySecret": "my-ray-token-key",
    }
    first, second = template(helm_bin, values), template(helm_bin, values)
    assert first == second
    assert not by_kind(first, "Secret")
    assert webhook_entry(first)["clientConfig"]["caBundle"] == ca
    pod = deployment(first)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == "my-webhook-tls"
    assert volumes["ray-token-key"]["secret"]["secretName"] == "my-ray-token-key"
    with pytest.raises(HelmError, match="exclude each other"):
        template(helm_bin, {**values, "webhook.tls.certManager.enabled": True})


def test_cert_manager_can_use_an_existing_cluster_issuer(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        {
            "webhook.tls.certManager.enabled": True,
            "webhook.tls.certManager.issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
        },
    )
    assert not by_kind(objects, "Issuer")
    (cert,) = by_kind(objects, "Certificate")
    assert cert["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_url_mode_points_the_api_server_at_the_url_with_a_matching_certificate(helm_bin: Path) -> None:
    objects = template(helm_bin, {"webhook.url": "https://127.0.0.1:19443"})
    client = webhook_entry(objects)["clientConfig"]
    assert client["url"] == f"https://127.0.0.1:19443{WEBHOOK_PATH}"
    assert "service" not in client
    cert = load_cert(webhook_secret(objects)["data"]["tls.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)


def test_non_default_values_reach_the_objects(helm_bin: Path) -> None:
    values = {
        "webhook.failurePolicy": "Ignore",
        "webhook.timeoutSeconds": 10,
        "webhook.namespaceSelector": {"matchLabels": {"asyncgrpo.dev/jobs": "enabled"}},
        "webhook.objectSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        "resources": {
            "requests": {"cpu": "50m", "memory": "100Mi"},
            "limits": {"cpu": "2", "memory": "300Mi"},
        },
        "nodeSelector": {"pool": "system"},
        "metrics.enabled": False,
        "serviceAccount.create": False,
        "serviceAccount.name": "existing-sa",
        "image.tag": "v9",
        "operator.logLevel": "debug",
        "operator.watchNamespaces": ["team-a", "team-b"],
        "fullnameOverride": "agrpo",
    }
    objects = template(helm_bin, values)
    entry = webhook_entry(objects)
    assert entry["failurePolicy"] == "Ignore" and entry["timeoutSeconds"] == 10
    assert entry["namespaceSelector"] == {"matchLabels": {"asyncgrpo.dev/jobs": "enabled"}}
    assert entry["objectSelector"]["matchExpressions"][0]["key"] == "team"
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing-sa" and not by_kind(objects, "ServiceAccount")
    assert pod["nodeSelector"] == {"pool": "system"}
    assert container(objects)["resources"]["limits"] == {"cpu": "2", "memory": "300Mi"}
    args = container(objects)["args"]
    assert container(objects)["image"].endswith(":v9") and "--verbose" in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert [s["metadata"]["name"] for s in by_kind(objects, "Service")] == ["agrpo-webhook"]
    assert "metrics" not in {p["name"] for p in container(objects)["ports"]}


BAD_VALUES = [
    pytest.param(
        {"leaderElection.enabled": False},
        "needs leaderElection.enabled=true",
        id="two-replicas-without-leader-election",
    ),
    pytest.param({"replicaCount": 11}, "replicaCount", id="too-many-replicas"),
    pytest.param({"webhook.failurePolicy": "Sometimes"}, "failurePolicy", id="unknown-failure-policy"),
    pytest.param({"webhook.timeoutSeconds": 31}, "timeoutSeconds", id="timeout-above-apiserver-max"),
    pytest.param({"webhok": {"port": 1}}, "webhok", id="misspelt-top-level-key"),
    pytest.param({"webhook.url": "http://127.0.0.1:9443"}, "url", id="plain-http-url"),
    pytest.param({"webhook.url": "https://127.0.0.1:9443/admit"}, "url", id="url-with-path"),
    pytest.param({"image.pullPolicy": "Sometimes"}, "pullPolicy", id="bad-pull-policy"),
    pytest.param({"resources": {"requests": {"cpu": "lots"}}}, "cpu", id="bad-quantity"),
    pytest.param({"webhook.tls.certManager.duration": "90 days"}, "duration", id="bad-duration"),
]


def test_by_default_two_replicas_elect_a_leader_roll_and_keep_one_through_drains(
    default_objects: Objects,
) -> None:
    """The webhook's failurePolicy Fail refuses every job write while no replica answers: two
    webhook replicas with a PodDisruptionBudget keep one answering through an upgrade or a node
    drain; two reconcilers elect a leader."""
    objects = default_objects
    reconciler, webhook = deployment(objects), deployment(objects, "webhook")
    for each in (reconciler, webhook):
        assert each["spec"]["replicas"] == 2
        assert each["spec"]["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
    assert env(objects)["ASYNCGRPO_LEADER_ELECTION"] == "true"
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == "asyncgrpo-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["asyncgrpo-operator"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": webhook["spec"]["selector"]}


def test_the_replicas_prefer_different_nodes_unless_the_affinity_is_set(
    default_objects: Objects, helm_bin: Path
) -> None:
    pod = deployment(default_objects)["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = deployment(default_objects)["spec"]["selector"]
    assert term["podAffinityTerm"]["labelSelector"] == selector
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    pinned = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    objects = template(helm_bin, {"affinity": pinned})
    assert deployment(objects)["spec"]["template"]["spec"]["affinity"] == pinned


def test_one_replica_without_leader_election_recreates_and_has_no_lease_role_or_pdb(helm_bin: Path) -> None:
    objects = template(
        helm_bin, {"replicaCount": 1, "leaderElection.enabled": False, "webhook.replicaCount": 1}
    )
    reconciler = deployment(objects)
    assert reconciler["spec"]["replicas"] == 1
    assert reconciler["spec"]["strategy"] == {"type": "Recreate"}, "two operators must never overlap"
    assert "ASYNCGRPO_LEADER_ELECTION" not in env(objects)
    assert not by_kind(objects, "Role") and not by_kind(objects, "RoleBinding")
    assert not by_kind(objects, "PodDisruptionBudget"), "a PDB on one replica would block drains"


def test_lease_name_in_the_role_is_the_operators() -> None:
    from asyncgrpo_operator.leader import LEASE_NAME  # noqa: PLC0415

    assert f'resourceNames: ["{LEASE_NAME}"]' in (CHART / "templates" / "rbac.yaml").read_text()


@pytest.mark.parametrize(("values", "named"), BAD_VALUES)
def test_bad_values_fail_install_with_a_message_naming_the_value(
    helm_bin: Path, values: dict[str, Any], named: str
) -> None:
    with pytest.raises(HelmError) as err:
        template(helm_bin, values)
    assert named in str(err.value)


def test_missing_service_account_name_fails_with_the_fix(helm_bin: Path) -> None:
    with pytest.raises(HelmError, match=r"serviceAccount\.name is required"):
        template(helm_bin, {"serviceAccount.create": False})


def leaf_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in {"resources", "managedJobsNamespaceSelector"}:
            keys += leaf_keys(value, f"{path}.")
        else:
            keys.append(path)
    return keys


def test_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    missing = [key for key in leaf_keys(values) if f"`{key}`" not in readme]
    assert not missing, f"charts/asyncgrpo-operator/README.md does not document: {missing}"


def test_every_value_has_a_comment_and_a_schema_entry() -> None:
    import json  # noqa: PLC0415

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in leaf_keys(values):
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        assert node, key


def test_metrics_are_served_where_the_chart_points_the_service(default_objects: Objects) -> None:
    """values.yaml, the Deployment, the Service and the operator agree on the metrics port."""
    from asyncgrpo_operator import metrics  # noqa: PLC0415 - the operator's side of the contract

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for role in ("reconciler", "webhook"):
        ports = {p["name"]: p["containerPort"] for p in container(default_objects, role)["ports"]}
        served = env(default_objects, role)
        assert served[metrics.PORT_ENV] == str(values["metrics"]["port"]) == str(ports["metrics"])
        assert served[metrics.SECURE_ENV] == "true"
        assert served[metrics.CERT_DIR_ENV] == str(DEFAULT_CERT_DIR), "the webhook's certificate"
        assert served[metrics.CERT_CHECK_ENV] == str(values["webhook"]["certCheckSeconds"])
    services = [s for s in by_kind(default_objects, "Service") if s["metadata"]["name"].endswith("-metrics")]
    selected = [s["spec"]["selector"] for s in services]
    assert selected == [
        deployment(default_objects, r)["spec"]["selector"]["matchLabels"] for r in ("reconciler", "webhook")
    ]
    assert {s["spec"]["ports"][0]["targetPort"] for s in services} == {"metrics"}
    assert not by_kind(default_objects, "ServiceMonitor")  # off by default: needs prometheus-operator


def test_a_service_monitor_scrapes_the_metrics_service_when_enabled(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        {"metrics.serviceMonitor.enabled": True, "metrics.serviceMonitor.labels": {"release": "prom"}},
    )
    monitor = one(objects, "ServiceMonitor")
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics"))
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
    # HTTPS with Prometheus' own token, verified against the CA of the certificate the operator serves
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    secret = webhook_secret(objects)
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": secret["metadata"]["name"], "key": "ca.crt"}}
    served = load_cert(secret["data"]["tls.crt"])
    sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert endpoint["tlsConfig"]["serverName"] in sans.get_values_for_type(x509.DNSName)
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert not by_kind(
        template(helm_bin, {"metrics.enabled": False, "metrics.serviceMonitor.enabled": True}),
        "ServiceMonitor",
    )


def test_kueue_may_read_the_jobs_only_when_asked(default_objects: Objects, helm_bin: Path) -> None:
    assert not [
        r for r in by_kind(default_objects, "ClusterRole") if r["metadata"]["name"].endswith("-kueue")
    ]
    objects = template(helm_bin, {"rbac.kueue.enabled": True})
    (role,) = [r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-kueue")]
    assert granted(role["rules"], "asyncgrpo.dev", "asyncgrpojobs") == {"get", "list", "watch"}
    (binding,) = [
        b for b in by_kind(objects, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-kueue")
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
    ]


def test_prometheus_gets_the_metrics_reader_role_when_named(default_objects: Objects, helm_bin: Path) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(default_objects, "ClusterRole")}
    assert roles[METRICS_READER]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert METRICS_READER not in {
        b["roleRef"]["name"] for b in by_kind(default_objects, "ClusterRoleBinding")
    }
    prometheus = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    objects = template(helm_bin, {"metrics.readers": [prometheus]})
    (binding,) = [b for b in by_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == METRICS_READER]
    assert binding["subjects"] == [prometheus]


def test_insecure_metrics_are_plain_http_with_no_review_rights_and_no_reader_role(helm_bin: Path) -> None:
    from asyncgrpo_operator import metrics  # noqa: PLC0415

    objects = template(helm_bin, {"metrics.secure": False, "metrics.serviceMonitor.enabled": True})
    assert metrics.SECURE_ENV not in env(objects)
    rules = operator_role(objects)["rules"]
    assert not granted(rules, "authentication.k8s.io", "tokenreviews")
    assert not granted(rules, "authorization.k8s.io", "subjectaccessreviews")
    assert METRICS_READER not in {r["metadata"]["name"] for r in by_kind(objects, "ClusterRole")}
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert "scheme" not in endpoint and "tlsConfig" not in endpoint


def test_the_admission_policy_judges_what_the_webhook_judges_and_fails_closed(
    default_objects: Objects, helm_bin: Path
) -> None:
    policy = named(default_objects, "ValidatingAdmissionPolicy", INVARIANTS_POLICY)
    webhook = webhook_entry(default_objects)
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["resourceRules"] == webhook["rules"]
    assert constraints["matchPolicy"] == webhook["matchPolicy"] == "Equivalent"
    assert policy["spec"]["failurePolicy"] == "Fail", "every expression is proven not to fail"
    generated = yaml.safe_load((CHART / "files" / "admission-policy.yaml").read_text())
    assert {k: v for k, v in policy["spec"].items() if k != "matchConstraints"} == generated
    binding = named(default_objects, "ValidatingAdmissionPolicyBinding", INVARIANTS_POLICY)
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}

    scoped = {
        "webhook.namespaceSelector": {"matchLabels": {"asyncgrpo.dev/jobs": "enabled"}},
        "webhook.objectSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
    }
    constraints = named(template(helm_bin, scoped), "ValidatingAdmissionPolicy", INVARIANTS_POLICY)["spec"][
        "matchConstraints"
    ]
    assert constraints["namespaceSelector"] == scoped["webhook.namespaceSelector"]
    assert constraints["objectSelector"] == scoped["webhook.objectSelector"]
    off = template(helm_bin, {"admissionPolicy.enabled": False})
    assert not by_kind(off, "ValidatingAdmissionPolicy") and not by_kind(
        off, "ValidatingAdmissionPolicyBinding"
    )


def test_a_namespace_labelled_with_a_runtime_admits_only_new_jobs_that_name_it(
    default_objects: Objects,
) -> None:
    """The policy behind docs/security.md#requiring-a-runtime, its CEL evaluated as the API server
    would (cel-python; tests/e2e/test_runtime_admission.py has the real API server refuse)."""
    policy = named(default_objects, "ValidatingAdmissionPolicy", RUNTIME_POLICY)["spec"]
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE"], "a job created before the label must stay suspendable"
    assert policy["matchConstraints"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "asyncgrpo.dev/runtime", "operator": "Exists"}]
    }
    binding = named(default_objects, "ValidatingAdmissionPolicyBinding", RUNTIME_POLICY)
    assert binding["spec"] == {"policyName": RUNTIME_POLICY, "validationActions": ["Deny"]}
    (validation,) = policy["validations"]
    namespace = {"metadata": {"name": "team-a", "labels": {"asyncgrpo.dev/runtime": "restricted"}}}

    def admitted(spec: dict[str, Any]) -> bool:
        return bool(cel(validation["expression"], object={"spec": spec}, namespaceObject=namespace))

    assert admitted({"image": "x", "runtimeRef": {"name": "restricted"}})
    assert not admitted({"image": "x", "runtimeRef": {"name": "open"}})
    assert not admitted({"image": "x"})
    message = str(cel(validation["messageExpression"], object={"spec": {}}, namespaceObject=namespace))
    assert message == (
        "spec.runtimeRef.name: namespace team-a runs only jobs under AsyncGRPORuntime restricted (its label "
        "asyncgrpo.dev/runtime); set spec.runtimeRef.name: restricted"
    )
