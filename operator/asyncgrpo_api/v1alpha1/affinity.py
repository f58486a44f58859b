"""core/v1 Affinity, typed: node affinity, pod affinity and pod anti-affinity of a pool's pods.

The pod spec takes the object unchanged, but a RayCluster does not validate its pod templates: a
misspelt key (`requiredDuringScheduling`), an unknown operator or `In` without values used to pass
`kubectl apply` and only failed when KubeRay created the pods, as ReplicaFailure on a job that was
already holding GPUs. Typed here, the same mistakes are refused at admission with the field path.

The checks are the API server's pod validation for these fields (apimachinery's
ValidateNodeSelectorRequirement, ValidateLabelSelector, ValidatePodAffinityTerm): operator and
values must agree, weights are 1-100, a pod affinity term needs a topologyKey. Every field is
optional and None by default, so a dumped object carries exactly what the user wrote.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from asyncgrpo_api.v1alpha1.base import ApiModel, DnsLabel, LabelKey, LabelValue

_INTEGER = r"^[+-]?[0-9]+$"


class NodeSelectorRequirement(ApiModel):
    """A node label (matchExpressions) or node field (matchFields) condition."""

    key: LabelKey = Field(description="The node label (or field, e.g. metadata.name) to test.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In/NotIn need values; Exists/DoesNotExist take none; Gt/Lt take one integer."
    )
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Values to compare with."
    )

    @model_validator(mode="after")
    def _operator_and_values_agree(self) -> NodeSelectorRequirement:
        values = self.values or []
        if self.operator in ("In", "NotIn") and not values:
            raise ValueError(f"operator {self.operator} needs at least one value in `values`")
        if self.operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"operator {self.operator} takes no `values`; remove them")
        if self.operator in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(_INTEGER, values[0])):
            raise ValueError(f"operator {self.operator} takes exactly one integer in `values`")
        return self


class NodeSelectorTerm(ApiModel):
    """Requirements ANDed together; a term with none matches no node."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Conditions on node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Conditions on node fields (metadata.name)."
    )


class NodeSelector(ApiModel):
    """Terms ORed together: a node must match one of them."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=32, description="At least one term; a node matching any term fits."
    )


class PreferredSchedulingTerm(ApiModel):
    """A node preference with its weight in the scheduler's scoring."""

    weight: int = Field(ge=1, le=100, description="1-100; added to a node's score when it matches.")
    preference: NodeSelectorTerm = Field(description="The nodes preferred.")


class NodeAffinity(ApiModel):
    """Which nodes a pool's pods may (required) or would rather (preferred) land on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must land on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=32, description="Nodes the pods prefer, by weight."
    )


class LabelSelectorRequirement(ApiModel):
    """One matchExpressions entry of a LabelSelector."""

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In/NotIn need values; Exists/DoesNotExist take none."
    )
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Values to compare with."
    )

    @model_validator(mode="after")
    def _operator_and_values_agree(self) -> LabelSelectorRequirement:
        values = self.values or []
        if self.operator in ("In", "NotIn") and not values:
            raise ValueError(f"operator {self.operator} needs at least one value in `values`")
        if self.operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"operator {self.operator} takes no `values`; remove them")
        return self


class LabelSelector(ApiModel):
    """A metav1.LabelSelector: matchLabels and matchExpressions, ANDed."""

    match_labels: dict[LabelKey, LabelValue] | None = Field(
        default=None, max_length=32, description="Labels the pods must carry."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Conditions on the pods' labels."
    )


class PodAffinityTerm(ApiModel):
    """Pods (selected by labels, in some namespaces) whose topology domain the pods join or avoid."""

    label_selector: LabelSelector | None = Field(default=None, description="The pods this term is about.")
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces of those pods, by label (empty with no namespaces: the pod's own).",
    )
    namespaces: list[DnsLabel] | None = Field(
        default=None, max_length=32, description="Namespaces of those pods, by name."
    )
    topology_key: LabelKey = Field(
        description="Node label that defines a domain, e.g. kubernetes.io/hostname or "
        "topology.kubernetes.io/zone."
    )
    match_label_keys: list[LabelKey] | None = Field(
        default=None, max_length=32, description="Label keys whose values are taken from the incoming pod."
    )
    mismatch_label_keys: list[LabelKey] | None = Field(
        default=None,
        max_length=32,
        description="Label keys whose values must differ from the incoming pod's.",
    )


class WeightedPodAffinityTerm(ApiModel):
    """A pod (anti-)affinity preference with its weight."""

    weight: int = Field(ge=1, le=100, description="1-100; added to a node's score when it matches.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(ApiModel):
    """Co-locate the pods with other pods (pod affinity), or keep them apart (anti-affinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=32, description="Terms every placement must satisfy."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=32, description="Terms the scheduler prefers, by weight."
    )


class Affinity(ApiModel):
    """A core/v1 Affinity, rendered unchanged into the pool's pod template."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")
