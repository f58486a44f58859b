"""Hypothesis strategies for AsyncGRPOJob manifests, valid and invalid.

Why mutations of real manifests rather than manifests built from scratch: random documents are
almost all rejected at the envelope (no spec, wrong kind) and never reach the interesting rules.
Starting from the docs examples and the knob-table jobs, and changing one to three things at a
random place, keeps most cases deep in the schema, the CEL rules and the webhook's cross-field
rules, where the two validation paths could disagree.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.webhook.jobs import INVALID_COMBINATIONS, VALID_MODES, WEBHOOK_ONLY

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))

Path_ = tuple[str | int, ...]

BIG_INT = 2**63 - 1


def base_manifests() -> list[dict[str, Any]]:
    """The docs examples plus every knob-table job (valid and invalid): the seeds of the mutations."""
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    cases = [c.manifest for c in (*VALID_MODES, *INVALID_COMBINATIONS, *WEBHOOK_ONLY)]
    return [copy.deepcopy(m) for m in (*docs, *cases)]


BASES = base_manifests()


def paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path below `node` (dict keys and list indices), parents before children."""
    out: list[Path_] = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = (*prefix, key)
            out.append(here)
            out.extend(paths(value, here))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            here = (*prefix, index)
            out.append(here)
            out.extend(paths(value, here))
    return out


def get(doc: Any, path: Path_) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _parent(doc: Any, path: Path_) -> Any:
    return get(doc, path[:-1])


# --- values ------------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 3, 7, 8, 64, 1023, 2**31 - 1, 2**31, 2**53 + 1, BIG_INT, -BIG_INT - 1]),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.5, -0.0, 1e-12, 1e300, -1e300, 2.5]),
)
"""Out-of-range and in-range numbers, including the int32/int64/float64 edges (JSON has no NaN)."""

STRINGS = st.one_of(
    st.text(max_size=40),  # any unicode (no surrogates: JSON and YAML cannot carry them)
    st.from_regex(r"[a-z][a-z0-9-]{0,70}", fullmatch=True),
    st.sampled_from(["", " ", "-", "0", "true", "null", "1e3", "ü-jöb", "名前", "a\nb", "\u200b", "🚀"]),
    st.integers(min_value=1_000, max_value=300_000).map(lambda n: "x" * n),  # huge strings
)

WRONG_TYPES = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    STRINGS,
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.from_regex(r"[a-zA-Z]{1,8}", fullmatch=True), st.integers(0, 3), max_size=2),
)

FIELD_NAMES = st.one_of(
    st.from_regex(r"[a-z][a-zA-Z]{0,15}", fullmatch=True),
    st.text(min_size=1, max_size=12),
)


def nearby(value: Any) -> st.SearchStrategy[Any]:
    """Values of the same type near `value`: mostly plausible, often just over a limit."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=min(value - 9, 2 * value), max_value=max(value + 9, 2 * value))
    if isinstance(value, float):
        return st.floats(min_value=-abs(value) * 2 - 1, max_value=abs(value) * 2 + 1, allow_nan=False)
    if isinstance(value, str):
        return STRINGS
    return WRONG_TYPES


# --- mutations ---------------------------------------------------------------------------------


@st.composite
def mutated_manifest(draw: st.DrawFn, bases: Sequence[dict[str, Any]] = BASES) -> dict[str, Any]:
    """A seed manifest with 0-3 random changes: replace, delete, add an unknown field, rename."""
    doc = copy.deepcopy(draw(st.sampled_from(list(bases))))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        spec_paths = [p for p in paths(doc) if p and p[0] == "spec"]
        envelope = [p for p in paths(doc) if p and p[0] in {"metadata", "apiVersion", "kind"}]
        # One change in ten hits the envelope: those are refused before any rule is looked at.
        candidates = draw(st.sampled_from([envelope] + [spec_paths] * 9)) or spec_paths or envelope
        op = draw(st.sampled_from(["nearby", "nearby", "wrong-type", "delete", "unknown-field", "name"]))
        if op == "name":
            doc.setdefault("metadata", {})
            if isinstance(doc["metadata"], dict):
                doc["metadata"]["name"] = draw(STRINGS)
            continue
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent = _parent(doc, path)
        key = path[-1]
        if op == "delete":
            if isinstance(parent, dict):
                del parent[key]
            elif isinstance(parent, list):
                parent.pop(int(key))
        elif op == "unknown-field":
            target = get(doc, path)
            if isinstance(target, dict):
                target[draw(FIELD_NAMES)] = draw(WRONG_TYPES)
            elif isinstance(parent, dict):
                parent[draw(FIELD_NAMES)] = draw(WRONG_TYPES)
        else:
            current = get(doc, path)
            parent[key] = draw(nearby(current) if op == "nearby" else WRONG_TYPES)
    return doc


def at_size_limit(kind: str) -> dict[str, Any]:
    """Manifests at the documented limits: longest legal name, many env vars, a 1 MiB field."""
    doc = copy.deepcopy(BASES[0])
    if kind == "longest-name":
        doc["metadata"]["name"] = "a" * 50
    elif kind == "many-secrets":
        doc["spec"]["secrets"] = [{"name": f"secret-{i}"} for i in range(500)]
    elif kind == "one-mebibyte-image":
        doc["spec"]["image"] = "r/" + "x" * (1024 * 1024)
    elif kind == "deep-unknown":
        node: dict[str, Any] = {}
        doc["spec"]["trainer"]["extra"] = node
        for _ in range(60):
            node["n"] = {}
            node = node["n"]
    else:
        raise ValueError(kind)
    return doc


SIZE_LIMIT_KINDS = ("longest-name", "many-secrets", "one-mebibyte-image", "deep-unknown")

MALFORMED_YAML = {
    "tab-indent": "apiVersion: asyncgrpo.dev/v1alpha1\nkind: AsyncGRPOJob\nspec:\n\timage: x\n",
    "unclosed-flow": "apiVersion: asyncgrpo.dev/v1alpha1\nkind: AsyncGRPOJob\nspec: {image: x\n",
    "bad-indent": "apiVersion: asyncgrpo.dev/v1alpha1\n  kind: AsyncGRPOJob\n spec: 1\n",
    "a-list": "- apiVersion: asyncgrpo.dev/v1alpha1\n- kind: AsyncGRPOJob\n",
    "a-scalar": "just a string\n",
    "empty": "",
    "binary": "\x00\x01\x02",
    "duplicate-anchor-bomb": "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\nspec: *d\n",
}
"""Files `asyncgrpo validate` must report as unreadable (exit 2) or invalid (exit 1), never crash on."""

WRONG_ENVELOPES: dict[str, dict[str, Any]] = {
    "wrong-kind": {**BASES[0], "kind": "RayJob"},
    "wrong-group": {**BASES[0], "apiVersion": "ray.io/v1"},
    "wrong-version": {**BASES[0], "apiVersion": "asyncgrpo.dev/v2"},
    "no-spec": {k: v for k, v in BASES[0].items() if k != "spec"},
    "spec-is-a-list": {**BASES[0], "spec": [1, 2]},
    "metadata-is-a-string": {**BASES[0], "metadata": "x"},
}
