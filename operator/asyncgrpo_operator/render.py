"""`asyncgrpo render job.yaml`: print the exact objects the operator would create for a job.

It validates the job with the same rules as the admission webhook and renders it with the same
pure code the operator uses (manifests.py), so users can review the RayCluster, the pods'
placement, volumes, environment and ports before applying. Missing are the ownerReferences (they
need the job's UID, which exists once the job is created), the Ray token Secret (its token is
derived from the operator's key) and, in the NetworkPolicy, the rule that admits the operator's
pods (where they run is the operator's setting). A job that names an AsyncGRPORuntime
is rendered as the operator renders it with `--runtime` and the runtime's manifest (the runtime
lives in the cluster: `kubectl get asyncgrporuntime <name> -o yaml`), and checked against it as
the webhook checks it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from asyncgrpo_api import runtime_rules
from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_operator import manifests, workload
from asyncgrpo_operator.manifests import Owner


def main(argv: list[str]) -> int:
    """Entry point of `asyncgrpo render`; returns the process exit code (0 ok, 1 invalid job)."""
    parser = argparse.ArgumentParser(
        prog="asyncgrpo render",
        description="Print the ConfigMap and RayCluster the operator creates for an AsyncGRPOJob.",
    )
    parser.add_argument("files", nargs="+", help="job manifests (YAML or JSON; '-' reads stdin)")
    parser.add_argument("-n", "--namespace", help="namespace to render into (default: the job's)")
    parser.add_argument("--attempt", type=int, default=0, help="attempt index (0 is the first run)")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.add_argument(
        "--runtime",
        type=Path,
        help="the AsyncGRPORuntime manifest the jobs name: check them against it, render what it fixes",
    )
    args = parser.parse_args(argv)
    runtime = yaml.safe_load(args.runtime.read_text()) if args.runtime else None
    return render_files(
        args.files, namespace=args.namespace, attempt=args.attempt, output=args.output, runtime=runtime
    )


def render_files(
    files: list[str],
    *,
    namespace: str | None,
    attempt: int,
    output: str,
    out: TextIO | None = None,
    runtime: Mapping[str, Any] | None = None,
) -> int:
    """Render every job document in `files`; print findings to stderr and return 1 on errors.
    `runtime` is the AsyncGRPORuntime a job that names one is checked against and rendered with
    (None: such a job is refused, as the webhook refuses a runtime that does not exist)."""
    out = out or sys.stdout
    rendered: list[dict[str, Any]] = []
    failed = False
    for source, document in _documents(files):
        if namespace:
            document.setdefault("metadata", {})["namespace"] = namespace
        report = validate_manifest(document)
        for warning in report.warnings:
            print(f"{source}: warning: {warning}", file=sys.stderr)
        admin, refusals = runtime_rules.check(report.job, runtime) if report.job else (None, [])
        if report.job is None or refusals:
            failed = True
            for error in [*report.errors, *refusals]:
                print(f"{source}: error: {error}", file=sys.stderr)
            continue
        rendered += objects(report.job, attempt=attempt, runtime=admin)
    if failed:
        return 1
    if output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": rendered}, out, indent=2)
        out.write("\n")
    else:
        out.write(
            "# ownerReferences to the AsyncGRPOJob are added by the operator at creation (and the\n"
            "# Workload's name and job-uid label, which need the job's UID; and its priority, read from\n"
            "# the priority class). The operator also creates the Secret <job>-ray-token, with a token\n"
            "# derived from its key, and admits its own pods to /progress in the NetworkPolicy.\n"
        )
        out.write(to_yaml(rendered))
    return 0


def objects(
    job: AsyncGRPOJob, *, attempt: int, owner: Owner | None = None, runtime: AsyncGRPORuntime | None = None
) -> list[dict[str, Any]]:
    """What the operator creates for a job: the spec ConfigMap, the NetworkPolicy and the attempt's
    RayCluster, and, for a job Kueue queues, its Workload (whose pod sets are the RayCluster's
    groups)."""
    rendered = manifests.objects(job, attempt=attempt, owner=owner, runtime=runtime)
    if job.kueue_queue_name is not None:
        cluster = manifests.ray_cluster(job, attempt, owner, runtime)
        rendered.append(workload.manifest(job, owner, cluster, None))
    return rendered


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML with multi-line strings (scripts, the job JSON) as literal blocks."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=110)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as `|` blocks, readable in a review."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _documents(files: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name in files:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
        for index, document in enumerate(yaml.safe_load_all(text)):
            if document is None:
                continue
            label = name if index == 0 else f"{name}[{index}]"
            if not isinstance(document, dict):
                raise SystemExit(f"{label}: not a YAML mapping")
            yield label, document


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
