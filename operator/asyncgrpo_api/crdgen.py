"""Generate the CustomResourceDefinitions (AsyncGRPOJob, AsyncGRPORuntime) from the pydantic models.

The models are the one schema: this turns their JSON schema into a Kubernetes structural schema
(refs inlined, nullable unions collapsed, pydantic-only keywords dropped), adds the defaults so
the API server stores complete objects, the printer columns of `kubectl get agj`, the status
subresource, and CEL rules for what one object's schema needs (one volume source per volume; a
name that leaves room for the retries' RayCluster names). The cross-field invariants CEL can
express are not here but in the chart's ValidatingAdmissionPolicy (admissionpolicy.py), generated
from the table the webhook evaluates (invariants.py): Helm never upgrades a CRD, so rules here
would lag behind the webhook's (and one copy kept here by hand already refused PPO mini-batches
the webhook admits), and the policy judges only the namespaces the webhook judges.

Run `python -m asyncgrpo_api.crdgen` to rewrite crds/ and the Helm chart's byte copy of it;
`--check` fails when any file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from asyncgrpo_api.v1alpha1 import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from asyncgrpo_api.v1alpha1.admin_runtime import (
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    RUNTIME_SHORT_NAMES,
    RUNTIME_SINGULAR,
    AsyncGRPORuntimeSpec,
)
from asyncgrpo_api.v1alpha1.job import AsyncGRPOJobSpec, AsyncGRPOJobStatus

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
RUNTIME_CRD_FILE = f"{GROUP}_{RUNTIME_PLURAL}.yaml"
Schema = dict[str, Any]

_DROPPED_KEYWORDS = frozenset({"title", "propertyNames", "additionalProperties"})
OPAQUE = "x-kubernetes-preserve-unknown-fields"
"""A field whose model sets this in its json_schema_extra is an untyped object in the CRD: a
standard Kubernetes type (core/v1 Affinity) that the webhook validates with its full model, whose
schema would otherwise triple the CRD's size (it appears in every pool)."""

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.rewardMean"},
    {"name": "Accuracy", "type": "number", "jsonPath": ".status.progress.accuracy"},
    {"name": "Staleness", "type": "number", "jsonPath": ".status.progress.meanStaleness"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Val-Acc", "type": "number", "jsonPath": ".status.progress.validationAccuracy", "priority": 1},
    {"name": "Max-Steps", "type": "integer", "jsonPath": ".status.progress.maxSteps", "priority": 1},
    {"name": "Version", "type": "integer", "jsonPath": ".status.progress.policyVersion", "priority": 1},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond", "priority": 1},
    {"name": "Oldest", "type": "number", "jsonPath": ".status.progress.meanOldestStaleness", "priority": 1},
    {"name": "Behaviour-KL", "type": "number", "jsonPath": ".status.progress.behaviourKl", "priority": 1},
    {"name": "IS-Truncated", "type": "number", "jsonPath": ".status.progress.isOutOfBounds", "priority": 1},
    {"name": "Policy-Idle", "type": "number", "jsonPath": ".status.progress.policyIdleShare", "priority": 1},
    {"name": "Gen-Idle", "type": "number", "jsonPath": ".status.progress.generationIdleShare", "priority": 1},
    {"name": "Buffer", "type": "number", "jsonPath": ".status.progress.bufferFill", "priority": 1},
    {
        "name": "Checkpoint",
        "type": "integer",
        "jsonPath": ".status.progress.lastCheckpointStep",
        "priority": 1,
    },
    {
        "name": "Durable-Ckpt",
        "type": "integer",
        "jsonPath": ".status.progress.durableCheckpointStep",
        "priority": 1,
    },
    {"name": "Cluster", "type": "string", "jsonPath": ".status.rayClusterName", "priority": 1},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
]

VOLUME_RULES: list[Schema] = [
    {
        "rule": "[has(self.pvc), has(self.hostPath), has(self.emptyDir)].filter(x, x).size() == 1",
        "message": "set exactly one of pvc, hostPath or emptyDir",
    }
]

RUNTIME_PRINTER_COLUMNS: list[Schema] = [
    {"name": "ServiceAccount", "type": "string", "jsonPath": ".spec.serviceAccountName"},
    {"name": "HostNetwork", "type": "boolean", "jsonPath": ".spec.allow.hostNetwork"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Images", "type": "string", "jsonPath": ".spec.images", "priority": 1},
    {"name": "Volumes", "type": "string", "jsonPath": ".spec.allow.volumes", "priority": 1},
]

ROOT_RULES: list[Schema] = [
    {
        "rule": "size(self.metadata.name) + size(string(self.spec.backoffLimit)) <= 52",
        "message": "metadata.name is too long: the RayCluster of the last retry (<name>-<backoffLimit>) "
        "must fit KubeRay's 53-character limit; shorten the name",
    },
    {
        "rule": "has(self.spec.managedBy) == has(oldSelf.spec.managedBy) && "
        "(!has(self.spec.managedBy) || self.spec.managedBy == oldSelf.spec.managedBy)",
        "message": "spec.managedBy cannot change once the job exists; create a new job",
    },
    {
        # The webhook refuses the change too; this holds with no webhook replica answering, where
        # removing the runtime would lift what it fixes (ServiceAccount, securityContext, images).
        "rule": "has(self.spec.runtimeRef) == has(oldSelf.spec.runtimeRef) && "
        "(!has(self.spec.runtimeRef) || self.spec.runtimeRef == oldSelf.spec.runtimeRef)",
        "message": "spec.runtimeRef cannot change once the job exists; create a new job",
    },
]


def build_crd() -> Schema:
    """The AsyncGRPOJob CustomResourceDefinition, as a dict ready to dump."""
    spec_schema = _structural(AsyncGRPOJobSpec.model_json_schema(by_alias=True), with_defaults=True)
    status_schema = _structural(AsyncGRPOJobStatus.model_json_schema(by_alias=True), with_defaults=False)
    for storage in spec_schema["properties"]["storage"]["properties"].values():
        if "pvc" in storage.get("properties", {}):  # a volume (not objectStore, a bucket)
            storage["x-kubernetes-validations"] = VOLUME_RULES
    root = _root(KIND, "An asynchronous GRPO training job run on a KubeRay RayCluster.", spec_schema)
    root["properties"]["status"] = status_schema
    root["x-kubernetes-validations"] = ROOT_RULES
    version: Schema = {"subresources": {"status": {}}, "additionalPrinterColumns": PRINTER_COLUMNS}
    return _crd(KIND, PLURAL, SINGULAR, SHORT_NAMES, scope="Namespaced", root=root, version=version)


def build_runtime_crd() -> Schema:
    """The AsyncGRPORuntime CustomResourceDefinition: cluster-scoped, a spec and no status."""
    spec_schema = _structural(AsyncGRPORuntimeSpec.model_json_schema(by_alias=True), with_defaults=True)
    description = (
        "An administrator's runtime for AsyncGRPOJobs: the images, ServiceAccount and securityContext the "
        "pods get, and what a job may add (host network, volume types, sidecars, init containers)."
    )
    root = _root(RUNTIME_KIND, description, spec_schema)
    version: Schema = {"additionalPrinterColumns": RUNTIME_PRINTER_COLUMNS}
    return _crd(
        RUNTIME_KIND,
        RUNTIME_PLURAL,
        RUNTIME_SINGULAR,
        RUNTIME_SHORT_NAMES,
        scope="Cluster",
        root=root,
        version=version,
    )


def _root(kind: str, description: str, spec_schema: Schema) -> Schema:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{GROUP}/{VERSION}."},
            "kind": {"type": "string", "description": f"{kind}."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
        },
    }


def _crd(
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    *,
    scope: str,
    root: Schema,
    version: Schema,
) -> Schema:
    """The CustomResourceDefinition envelope: names, scope and the one served version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "asyncgrpo"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                # `kubectl get all` lists namespaced objects only.
                "categories": ["all", "asyncgrpo"] if scope == "Namespaced" else ["asyncgrpo"],
            },
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    **version,
                }
            ],
        },
    }


def _structural(schema: Schema, *, with_defaults: bool) -> Schema:
    defs: dict[str, Schema] = schema.pop("$defs", {})
    return _convert(schema, defs, with_defaults=with_defaults)


def _convert(node: Schema, defs: dict[str, Schema], *, with_defaults: bool) -> Schema:
    """Rewrite one JSON-schema node into its structural OpenAPI v3 form."""
    node = dict(node)
    if node.get(OPAQUE):
        # Free-form content (checked by the webhook): the CRD bounds at least its top-level keys.
        bound = {"maxProperties": node["maxProperties"]} if "maxProperties" in node else {}
        return _ordered({"description": node.get("description", ""), "type": "object", OPAQUE: True, **bound})
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}
    if "anyOf" in node:
        return _convert_optional(node, defs, with_defaults=with_defaults)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYWORDS or (key == "default" and (value is None or not with_defaults)):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {
                name: _convert(prop, defs, with_defaults=with_defaults) for name, prop in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, with_defaults=with_defaults)
        elif key == "patternProperties":
            (value_schema,) = value.values()
            out["additionalProperties"] = _convert(value_schema, defs, with_defaults=with_defaults)
        else:
            out[key] = value
    if node.get("additionalProperties") is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(
            node["additionalProperties"], defs, with_defaults=with_defaults
        )
    if with_defaults and out.get("type") == "object":
        _default_nested_objects(out, node.get("properties", {}))
    return _ordered(out)


def _convert_optional(node: Schema, defs: dict[str, Schema], *, with_defaults: bool) -> Schema:
    """`X | None` becomes X; it is nullable only when the model's default is not None.

    A None default means "leave the field out", which needs no null; a non-None default that the
    user may clear (startupDeadlineSeconds: null waits forever) needs nullable so the API server
    keeps the null instead of applying the default.
    """
    branches = [b for b in node["anyOf"] if b.get("type") != "null"]
    if len(branches) != 1:
        raise ValueError(f"unions other than Optional[X] cannot be expressed in a CRD: {branches}")
    out = _convert(branches[0], defs, with_defaults=with_defaults)
    if "description" in node:
        out["description"] = node["description"]
    default = node.get("default")
    if default is not None:
        out["nullable"] = True
        if with_defaults:
            out["default"] = default
    return _ordered(out)


def _default_nested_objects(out: Schema, source_properties: dict[str, Schema]) -> None:
    """Give sub-objects that pydantic builds by default a `default: {}`.

    The API server only defaults a field when its parent exists, so without this a minimal job
    would be stored without the nested defaults the models apply. Objects that default to None in
    the models (optional volumes, say) or that have required fields are left absent.
    """
    for name, prop in out.get("properties", {}).items():
        optional_none = "default" in source_properties.get(name, {})
        if (
            prop.get("type") == "object"
            and "properties" in prop
            and not optional_none
            and not prop.get("required")
        ):
            prop.setdefault("default", {})


_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "nullable",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
)


def _ordered(node: Schema) -> Schema:
    """A stable key order, so the generated file diffs cleanly."""
    rank = {key: i for i, key in enumerate(_KEY_ORDER)}
    return dict(sorted(node.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def render_crd(crd: Schema | None = None) -> str:
    """A CRD (the AsyncGRPOJob's by default) as YAML text, exactly as committed under crds/."""
    header = "# GENERATED by `python -m asyncgrpo_api.crdgen` from the asyncgrpo_api models. Do not edit.\n"
    return header + yaml.dump(
        build_crd() if crd is None else crd,
        Dumper=_NoAliasDumper,
        sort_keys=False,
        width=120,
        allow_unicode=True,
    )


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated values out in full: anchors would make the CRD hard to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


CHART_CRDS = Path("charts/asyncgrpo-operator/crds")


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the CRDs under crds/ and their copies in the Helm chart."""
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_api.crdgen", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("crds"), help="output folder (default: crds)")
    parser.add_argument(
        "--chart-crds", type=Path, default=CHART_CRDS, help=f"the chart's copy (default: {CHART_CRDS})"
    )
    parser.add_argument("--check", action="store_true", help="fail if a committed file is stale")
    args = parser.parse_args(argv)
    texts = {CRD_FILE: render_crd(), RUNTIME_CRD_FILE: render_crd(build_runtime_crd())}
    targets = [
        (folder / name, text) for name, text in texts.items() for folder in (args.out, args.chart_crds)
    ]
    if args.check:
        stale = [t for t, text in targets if not t.exists() or t.read_text() != text]
        for target in stale:
            print(f"{target} is stale: run `python -m asyncgrpo_api.crdgen`", file=sys.stderr)
        return 1 if stale else 0
    for target, text in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
