"""Placement as the API server judges a pod: quantities, requests within limits, label values,
and a typed affinity. A RayCluster does not validate its pod templates, so each of these used to
pass `kubectl apply` and only fail when KubeRay created the pods, on a job already holding GPUs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from asyncgrpo_api import quantity
from asyncgrpo_api.rules import validate_manifest

HEAD = "spec.cluster.head"
POOL = "spec.cluster.policyWorkers"


def errors_of(manifest: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate_manifest(manifest).errors]


@pytest.mark.parametrize(
    "value", ["1", "500m", "1.5", ".5", "1.", "2Gi", "64Mi", "1e3", "1E3", "1E", "+4", "10n"]
)
def test_kubernetes_quantities_are_accepted(base_job: dict[str, Any], value: str) -> None:
    base_job["spec"]["cluster"] = {"head": {"resources": {"requests": {"cpu": value}}}}
    assert validate_manifest(base_job).ok, errors_of(base_job)


@pytest.mark.parametrize(
    "value", ["1.2.3", "1iM", "1Gb", "-1", "1e", "1e1.5", "", "Gi", "1 Gi", "1mi", "0x10"]
)
def test_strings_the_quantity_grammar_refuses_are_rejected_at_their_path(
    base_job: dict[str, Any], value: str
) -> None:
    base_job["spec"]["cluster"] = {"head": {"resources": {"limits": {"memory": value}}}}
    errors = errors_of(base_job)
    assert any(e.startswith(f"{HEAD}.resources.limits.memory:") for e in errors), errors


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", Decimal(2**30)), ("1024Mi", Decimal(2**30)), ("250m", Decimal("0.25")), ("2e3", Decimal(2000))],
)
def test_quantities_compare_as_the_api_server_reads_them(text: str, value: Decimal) -> None:
    assert quantity.parse(text) == value


def test_a_request_above_its_limit_is_rejected(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = {
        "policyWorkers": {
            "resources": {"requests": {"memory": "2Gi", "cpu": "1"}, "limits": {"memory": "1024Mi"}}
        }
    }
    assert errors_of(base_job) == [
        f"{POOL}.resources.requests.memory: 2Gi is more than the limit 1024Mi; a pod's request may not "
        "exceed its limit. Lower the request or raise the limit"
    ]
    base_job["spec"]["cluster"]["policyWorkers"]["resources"]["limits"]["memory"] = "2048Mi"
    assert validate_manifest(base_job).ok


def test_the_driver_containers_request_above_its_limit_or_a_gpu_is_rejected_at_its_field(
    base_job: dict[str, Any],
) -> None:
    base_job["spec"]["cluster"] = {
        "head": {
            "driverResources": {
                "requests": {"memory": "2Gi", "nvidia.com/gpu": "1"},
                "limits": {"memory": "1Gi"},
            }
        }
    }
    assert errors_of(base_job) == [
        f"{HEAD}.driverResources.requests: must not set nvidia.com/gpu: use a worker pool (the head needs no "
        "GPU), which sets request and limit together",
        f"{HEAD}.driverResources.requests.memory: 2Gi is more than the limit 1Gi; a pod's request may not "
        "exceed its limit. Lower the request or raise the limit",
    ]


def test_label_values_must_be_label_values(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = {"head": {"nodeSelector": {"pool": "gpu h100"}}}
    assert any(e.startswith(f"{HEAD}.nodeSelector.pool:") for e in errors_of(base_job))


GOOD_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "preference": {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["64"]}]},
            }
        ],
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                },
            }
        ]
    },
}


def test_a_core_v1_affinity_is_accepted_and_rendered_as_written(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = {"policyWorkers": {"affinity": GOOD_AFFINITY}}
    report = validate_manifest(base_job)
    assert report.job is not None, errors_of(base_job)
    dumped = report.job.spec.cluster.policy_workers.affinity
    assert dumped is not None
    assert dumped.model_dump(mode="json", by_alias=True, exclude_none=True) == GOOD_AFFINITY


@pytest.mark.parametrize(
    ("affinity", "path", "text"),
    [
        (
            {"nodeAffinity": {"requiredDuringScheduling": {}}},
            "affinity.nodeAffinity.requiredDuringScheduling",
            "did you mean 'requiredDuringSchedulingIgnoredDuringExecution'",
        ),
        (
            {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}},
            "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
            "is required",
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In"}]}]
                    }
                }
            },
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0]",
            "operator In needs at least one value",
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["x"]}]}
                        ]
                    }
                }
            },
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0]",
            "takes exactly one integer",
        ),
        (
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
            "at least 1 item",
        ),
        (
            {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0}]}},
            "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            "greater than or equal to 1",
        ),
        (
            {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "topologyKey": "zone",
                            "labelSelector": {
                                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]
                            },
                        }
                    ]
                }
            },
            "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
            ".matchExpressions[0]",
            "takes no `values`",
        ),
        (
            {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]
                },
                "podAfinity": {},
            },
            "affinity.podAfinity",
            "did you mean 'podAffinity'",
        ),
    ],
)
def test_an_affinity_mistake_is_refused_at_apply_with_its_path(
    base_job: dict[str, Any], affinity: dict[str, Any], path: str, text: str
) -> None:
    base_job["spec"]["cluster"] = {"head": {"affinity": affinity}}
    errors = errors_of(base_job)
    assert any(e.startswith(f"{HEAD}.{path}:") and text in e for e in errors), errors


GEN = "spec.cluster.generationWorkers"


def test_an_elastic_generation_fleet_between_its_bounds_is_accepted(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4}}
    assert validate_manifest(base_job).ok, errors_of(base_job)


def test_an_autoscaling_rule_on_a_fixed_fleet_is_named_as_ignored_and_on_an_elastic_one_is_not(
    base_job: dict[str, Any],
) -> None:
    rule = {"autoscaling": {"windowSteps": 2}}
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 2, **rule}}
    report = validate_manifest(base_job)
    assert report.ok
    (ignored,) = [w for w in report.warnings if w.path == f"{GEN}.autoscaling"]
    assert "is ignored by a fixed fleet" in ignored.message, ignored.message
    assert "maxReplicas above replicas" in ignored.message, ignored.message
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 2, "maxReplicas": 3, **rule}}
    assert not [w for w in validate_manifest(base_job).warnings if w.path == f"{GEN}.autoscaling"]


@pytest.mark.parametrize(
    ("bounds", "finding"),
    [
        (
            {"minReplicas": 3, "maxReplicas": 4},
            f"{GEN}.minReplicas: (3) must be at most replicas (2): the fleet starts at replicas and "
            "shrinks no lower than minReplicas; lower minReplicas or raise replicas",
        ),
        (
            {"maxReplicas": 1},
            f"{GEN}.maxReplicas: (1) must be at least replicas (2): the fleet starts at replicas and "
            "grows no higher than maxReplicas; raise maxReplicas or lower replicas",
        ),
    ],
)
def test_replicas_outside_the_fleets_bounds_name_the_bound_and_the_fix(
    base_job: dict[str, Any], bounds: dict[str, int], finding: str
) -> None:
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 2, **bounds}}
    assert errors_of(base_job) == [finding]


def test_a_colocated_engine_has_no_fleet_to_scale(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 0, "maxReplicas": 2}}
    base_job["spec"]["trainer"]["generation"] = {"colocated": True}
    errors = errors_of(base_job)
    expected = f"{GEN}.maxReplicas: (2) must be unset when generation.colocated is true: generation "
    assert any(e.startswith(expected) for e in errors), errors


def test_a_fleet_larger_than_the_staleness_bound_lets_be_in_flight_is_refused(
    base_job: dict[str, Any],
) -> None:
    """P = 8, S = 0: at most 8 groups in flight, so a ninth engine would never get one."""
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 1, "maxReplicas": 9}}
    base_job["spec"]["trainer"]["asyncRL"] = {"maxStalenessVersions": 0}
    assert errors_of(base_job) == [
        f"{GEN}.maxReplicas: (9) would run 9 generation engines, but the staleness bound lets at most 8 "
        "prompt groups be in flight (asyncRL.maxInflightPrompts, default maxBufferedRollouts = "
        "numPromptsPerStep x (maxStalenessVersions + 1)): the engines beyond it would never get a group. "
        "Lower maxReplicas to 8 or raise the bound"
    ]
    base_job["spec"]["cluster"]["generationWorkers"]["maxReplicas"] = 8
    assert validate_manifest(base_job).ok, errors_of(base_job)


def test_kueue_admits_a_fixed_fleet_only(base_job: dict[str, Any]) -> None:
    base_job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    base_job["spec"]["cluster"] = {"generationWorkers": {"replicas": 1, "maxReplicas": 3}}
    assert errors_of(base_job) == [
        f"{GEN}.maxReplicas: makes the generation fleet elastic (1 to 3 workers), but Kueue queues this job "
        "and admits a fixed number of pods: growing would use quota Kueue never granted. Set minReplicas and "
        "maxReplicas to replicas (1) or remove them, or do not queue the job in Kueue"
    ]
    base_job["spec"]["cluster"]["generationWorkers"]["maxReplicas"] = 1
    assert validate_manifest(base_job).ok, errors_of(base_job)
