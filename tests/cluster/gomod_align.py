"""One version of each shared Go module across the wrapper modules, so a cold build compiles it once.

Each wrapper module (tests/cluster/gomod/<name>) pins one upstream component, and Go's minimal version
selection then gives each its own versions of everything the components share. Left so, the builds
of a fresh machine compiled six versions of k8s.io/api and client-go, six of x/net, four of grpc:
311 MB of Go source, of which 171 MB was distinct (docs/benchmarks.md, "Build"). The Go build cache
reuses a compiled package only when its module version is the same, so aligning the versions is what
lets the control plane's build pay for the others.

The base is the control plane's module (gomod/k8s, with the real node's kubelet): its Kubernetes
staging modules are fixed at the Kubernetes pin, so it does not move. Every other wrapper builds each
module that the base also builds at the base's version, through a `replace` in its go.mod. Its entry
in versions.toml may say otherwise:

- `align_with = ["kueue"]`: take versions from these components' builds before the base's;
- `align_keep = ["k8s.io/cri-client", "go.opentelemetry.io/*"]`: leave these at the component's own
  versions, because its code needs their newer API (a trailing `*` is a prefix);
- `align_only = [...]`: align only these;
- `align = false`: leave the component alone.

`python -m tests.cluster align` writes the replaces (after a version bump, then `go mod tidy` runs);
`--check` fails when a wrapper builds a shared module at another version
(tests/cluster/test_gomod_align.py runs it).
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase

from tests.cluster.build import BuildError, Target, go_env, optional_targets, targets
from tests.cluster.config import VERSIONS_FILE, components

BASE = ("kubernetes", "kubelet")
"""The control plane's own builds: the versions everything else aligns with."""

MAX_PASSES = 4
"""Aligning can pull in modules the wrapper did not build before; a few passes settle it."""


@dataclass(frozen=True)
class AlignRule:
    """How one component's wrapper aligns (its versions.toml entry's align_* keys)."""

    enabled: bool = True
    align_with: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    only: tuple[str, ...] = ()

    def applies_to(self, module: str) -> bool:
        if self.only and not any(_matches(module, p) for p in self.only):
            return False
        return not any(_matches(module, p) for p in self.keep)


def _matches(module: str, pattern: str) -> bool:
    return fnmatchcase(module, pattern) if pattern.endswith("*") else module == pattern


def rules() -> dict[str, AlignRule]:
    """The align_* keys of every component but the base, from versions.toml."""
    data = tomllib.loads(VERSIONS_FILE.read_text())
    out = {}
    for name, entry in data.items():
        if name in BASE:
            continue
        out[name] = AlignRule(
            enabled=bool(entry.get("align", True)),
            align_with=tuple(entry.get("align_with", ())),
            keep=tuple(entry.get("align_keep", ())),
            only=tuple(entry.get("align_only", ())),
        )
    return out


def planned_replaces(
    component_module: str, own: dict[str, str], sources: list[dict[str, str]], rule: AlignRule
) -> dict[str, str]:
    """module -> version for each module `own` builds at another version than the first source that
    builds it (sources in priority order: align_with's builds, then the base). The component's own
    module keeps its pin."""
    out = {}
    for module, version in own.items():
        if module == component_module or not rule.applies_to(module):
            continue
        target = next((s[module] for s in sources if module in s), None)
        if target is not None and target != version:
            out[module] = target
    return out


def _target(name: str) -> Target:
    return ({t.component: t for t in targets()} | optional_targets())[name]


def build_list(name: str) -> dict[str, str]:
    """module -> the version the build of `name` compiles (after its replaces), from `go list -deps`."""
    t = _target(name)
    fmt = "{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}"
    cmd = ["go", "list", "-deps", f"-f={fmt}"] + ([f"-tags={t.tags}"] if t.tags else []) + list(t.packages)
    gomod_dir = components()[name].gomod_dir
    proc = subprocess.run(cmd, cwd=gomod_dir, env=go_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"`go list` of {name} failed: {proc.stderr.strip()[-2000:]}")
    out = {}
    for line in proc.stdout.splitlines():
        module, _, version = line.partition(" ")
        if version:  # the wrapper module itself has none
            out[module] = version
    return out


def _order(all_rules: dict[str, AlignRule]) -> list[str]:
    """Components whose builds others align with come first."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done or name in BASE:
            return
        for dep in all_rules[name].align_with:
            visit(dep)
        done.append(name)

    for name in all_rules:
        visit(name)
    return done


def drift() -> dict[str, dict[str, str]]:
    """component -> {module: the version it should build} for every wrapper that is out of line."""
    all_rules = rules()
    base = [build_list(n) for n in BASE]
    lists: dict[str, dict[str, str]] = {}
    out = {}
    for name in _order(all_rules):
        rule = all_rules[name]
        lists[name] = build_list(name)
        if not rule.enabled:
            continue
        sources = [lists[d] for d in rule.align_with] + base
        wanted = planned_replaces(components()[name].module, lists[name], sources, rule)
        if wanted:
            out[name] = wanted
    return out


def align() -> dict[str, int]:
    """Write the replaces into every drifting wrapper and tidy it; component -> replaces written."""
    written: dict[str, int] = {}
    for _ in range(MAX_PASSES):
        todo = drift()
        if not todo:
            return written
        for name, wanted in todo.items():
            gomod_dir = components()[name].gomod_dir
            edits = [f"-replace={m}={m}@{v}" for m, v in sorted(wanted.items())]
            for cmd in (["go", "mod", "edit", *edits], ["go", "mod", "tidy"]):
                proc = subprocess.run(
                    cmd, cwd=gomod_dir, env=go_env(), capture_output=True, text=True, check=False
                )
                if proc.returncode != 0:
                    raise BuildError(f"{' '.join(cmd[:3])} in {gomod_dir} failed: {proc.stderr.strip()}")
            written[name] = written.get(name, 0) + len(wanted)
    raise BuildError(f"the wrappers did not settle in {MAX_PASSES} passes: {json.dumps(drift())}")
