"""The base model every API object derives from, and the small shared field types.

Every model is strict about unknown keys (a typo in a job file is an error, not a silent no-op),
uses camelCase on the wire and snake_case in Python, and is frozen: a parsed job is a value.
"""

from __future__ import annotations

from typing import Annotated

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
