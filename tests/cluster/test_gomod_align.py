"""The wrapper modules build each shared Go module at one version (tests/cluster/gomod_align.py)."""

from __future__ import annotations

import pytest

from tests.cluster.gomod_align import AlignRule, drift, planned_replaces, rules

OWN = {
    "example.com/component": "v1.2.0",
    "k8s.io/client-go": "v0.37.0",
    "k8s.io/cri-api": "v0.37.0",
    "golang.org/x/net": "v0.58.0",
    "google.golang.org/grpc": "v1.83.2",
    "github.com/only/mine": "v0.1.0",
}
KUEUE = {"k8s.io/client-go": "v0.35.3", "example.com/component": "v1.0.0"}
BASE = {
    "k8s.io/client-go": "v0.36.3",
    "k8s.io/cri-api": "v0.36.3",
    "golang.org/x/net": "v0.49.0",
    "google.golang.org/grpc": "v1.83.2",
    "example.com/component": "v0.9.0",
}


def test_a_wrapper_takes_the_base_version_of_every_module_it_shares_but_never_moves_its_own_pin() -> None:
    wanted = planned_replaces("example.com/component", OWN, [BASE], AlignRule())
    assert wanted == {
        "k8s.io/client-go": "v0.36.3",
        "k8s.io/cri-api": "v0.36.3",
        "golang.org/x/net": "v0.49.0",
    }  # grpc is already the base's; github.com/only/mine is not shared


def test_align_with_comes_before_the_base_and_keep_and_only_leave_modules_alone() -> None:
    with_kueue = planned_replaces("example.com/component", OWN, [KUEUE, BASE], AlignRule())
    assert with_kueue["k8s.io/client-go"] == "v0.35.3"
    kept = planned_replaces("example.com/component", OWN, [BASE], AlignRule(keep=("k8s.io/*",)))
    assert kept == {"golang.org/x/net": "v0.49.0"}
    only = planned_replaces(
        "example.com/component",
        OWN,
        [BASE],
        AlignRule(only=("k8s.io/*",), keep=("k8s.io/cri-api",)),
    )
    assert only == {"k8s.io/client-go": "v0.36.3"}


def test_versions_toml_names_only_components_it_pins_in_align_with() -> None:
    names = set(rules())
    for name, rule in rules().items():
        assert set(rule.align_with) <= names, f"{name}: align_with names {rule.align_with}"


@pytest.mark.cluster
def test_every_wrapper_builds_the_modules_it_shares_at_one_version() -> None:
    """Fails after a version bump that was not followed by `python -m tests.cluster align`: a fresh
    machine would compile those modules twice (docs/benchmarks.md, Build)."""
    assert drift() == {}, "run `python -m tests.cluster align`"
