"""The base model every API object derives from, and the small shared field types.

Every model is strict about unknown keys (a typo in a job file is an error, not a silent no-op),
uses camelCase on the wire and snake_case in Python, and is frozen: a parsed job is a value.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of all spec and status models: camelCase aliases, unknown keys forbidden."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )


def known_fields(model: type[BaseModel], raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with only the keys `model` has (by name or alias), recursively through the fields whose
    type is a model, a list of models or an optional model: how this version reads an object that a
    newer one wrote (after a rollback), where the strict model would refuse it whole."""
    known: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias if info.alias is not None and info.alias in raw else name
        if key not in raw:
            continue
        nested = nested_model(info.annotation)
        value = raw[key]
        if nested is not None and isinstance(value, Mapping):
            value = known_fields(nested, value)
        elif nested is not None and isinstance(value, list):
            value = [known_fields(nested, v) if isinstance(v, Mapping) else v for v in value]
        known[key] = value
    return known


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model class a field's type names (itself, or inside Optional, a union or a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = nested_model(arg)
        if found is not None:
            return found
    return None


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
"""A non-negative Kubernetes quantity (apimachinery's ParseQuantity grammar): a decimal number, then
a binary suffix (Ki..Ei), a decimal one (n, u, m, k, M..E) or an integer exponent (e3, E-2).
Strict on purpose: the RayCluster schema accepts some strings that pod creation then refuses, and
a negative request or limit is refused for every resource."""
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
DnsSubdomain = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN)]
Quantity = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=QUANTITY_PATTERN)]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=316, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
AbsolutePath = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")]
