"""Kubernetes resource quantities as numbers, to compare a pool's requests with its limits.

The grammar itself is enforced on the models (base.QUANTITY_PATTERN); this turns a string that
matched it into an exact Decimal (`"1.5Gi"` -> 1610612736, `"250m"` -> 0.25), the way
apimachinery's ParseQuantity reads it. Pure and exact: no floats, so `"1Gi"` equals `"1024Mi"`.
"""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def parse(text: str) -> Decimal:
    """The value of a quantity; ValueError when it does not follow the Kubernetes grammar."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1.5Gi, 1e3)")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return Decimal(number).scaleb(int(suffix[1:]))
    return Decimal(number) * _SUFFIXES[suffix]
