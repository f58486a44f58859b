"""The operator's internal layering, checked on the source: the logic modules stay pure.

plan, decision, manifests, observed, naming and render decide and describe; they must never reach
the API (k8s.py), kopf, HTTP clients or the clock-driven runtime, or the unit tests would stop
being unit tests. Only the reconciler, the runtime, the leader election and the handlers do I/O,
and only k8s.py talks to the Kubernetes API.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "asyncgrpo_operator"
PURE = [
    "plan",
    "decision",
    "elastic",
    "manifests",
    "observed",
    "naming",
    "recovery",
    "render",
    "workload",
]
IO_MODULES = {
    "k8s",
    "cache",
    "informer",
    "reconciler",
    "runtime",
    "leader",
    "controller",
    "progress",
    "drain",
    "handlers",
    "settings",
    "main",
    "supervisor",
}
FORBIDDEN_IN_PURE = {
    "kopf",
    "aiohttp",
    "kubernetes",
    "kubernetes_asyncio",
    "asyncio",
    "socket",
    "urllib",
    "http",
}


def imports_of(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "asyncgrpo_operator":
                names |= {f"asyncgrpo_operator.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("name", PURE)
def test_logic_modules_do_no_io(name: str) -> None:
    imported = imports_of(PACKAGE / f"{name}.py")
    roots = {n.split(".")[0] for n in imported}
    assert not roots & FORBIDDEN_IN_PURE, f"{name}.py imports {sorted(roots & FORBIDDEN_IN_PURE)}"
    ours = {n.split(".")[1] for n in imported if n.startswith("asyncgrpo_operator.")}
    assert not ours & IO_MODULES, f"{name}.py imports {sorted(ours & IO_MODULES)}"


def test_only_k8s_talks_to_the_kubernetes_api() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in {"k8s.py"}:
            continue
        roots = {n.split(".")[0] for n in imports_of(path)}
        assert not roots & {"kubernetes", "kubernetes_asyncio"}, f"{path.relative_to(PACKAGE)} uses a client"
