"""`asyncgrpo run job.yaml`: the same job file `kubectl apply` takes, run on this machine.

Starts an embedded Ray (CPU by default; `--gpus` to use local GPUs), points checkpoints at
.asyncgrpo/<name>/checkpoints unless the job's path (usually a volume mount such as /checkpoints)
exists here as a writable directory or --checkpoint-dir is given,
and runs the driver in this process with the /progress server on DRIVER_PROGRESS_PORT.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import ray

from asyncgrpo_api.v1alpha1 import DRIVER_PROGRESS_PORT
from asyncgrpo_trainer import driver


def _usable(path: str) -> bool:
    """The job's checkpoint path is a volume mount inside the pod; here it is used only when it
    already exists as a writable directory (never created at the root of this machine)."""
    p = Path(path)
    return p.is_dir() and os.access(p, os.W_OK)


def localize(
    manifest: dict[str, Any],
    checkpoint_dir: str | None,
    max_steps: int | None,
    mounts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The manifest with a local checkpoint directory, an optional step cap and the trainer's paths
    under `mounts` (see `remap`) applied."""
    spec = manifest.setdefault("spec", {})
    ckpt = spec.setdefault("checkpoint", {})
    name = manifest.get("metadata", {}).get("name", "job")
    if checkpoint_dir is not None:
        ckpt["path"] = str(Path(checkpoint_dir).resolve())
    elif not _usable(ckpt.get("path", "/checkpoints")):
        ckpt["path"] = str((Path(".asyncgrpo") / name / "checkpoints").resolve())
        print(
            f"asyncgrpo: checkpoints go to {ckpt['path']} (the job's path is not a directory here)",
            file=sys.stderr,
        )
    if max_steps is not None:
        spec.setdefault("trainer", {}).setdefault("grpo", {})["maxNumSteps"] = max_steps
    if mounts:
        spec["trainer"] = remap(spec.get("trainer", {}), mounts)
    return manifest


def parse_mounts(values: list[str]) -> dict[str, str]:
    """--mount JOB_PATH=LOCAL_DIR values -> {job path: absolute local directory}."""
    mounts: dict[str, str] = {}
    for value in values:
        job_path, sep, local = value.partition("=")
        if not sep or not job_path.startswith("/") or not local:
            raise ValueError(f"--mount {value!r}: expected JOB_PATH=LOCAL_DIR with an absolute JOB_PATH")
        mounts[job_path.rstrip("/") or "/"] = str(Path(local).resolve())
    return mounts


def remap(value: Any, mounts: dict[str, str]) -> Any:
    """`value` (a spec subtree) with every path under a mounted job path moved to its local
    directory: a cluster-shaped job (model and data on volumes) runs here unchanged."""
    if isinstance(value, dict):
        return {k: remap(v, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [remap(v, mounts) for v in value]
    if isinstance(value, str):
        for job_path, local in mounts.items():
            if value == job_path or value.startswith(job_path + "/"):
                return local + value[len(job_path) :]
    return value


def required_cpus(manifest: dict[str, Any]) -> int:
    """Logical CPUs the job's actors reserve: one per policy and generation rank + the controller."""
    cluster = manifest.get("spec", {}).get("cluster", {})

    def ranks(pool: dict[str, Any]) -> int:
        return max(int(pool.get("replicas", 1)), 1) * max(int(pool.get("gpusPerReplica", 0)), 1)

    return ranks(cluster.get("policyWorkers", {})) + ranks(cluster.get("generationWorkers", {})) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgrpo run", description="Run an AsyncGRPOJob on this machine.")
    parser.add_argument("job", help="AsyncGRPOJob manifest (YAML or JSON)")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="local checkpoint directory (overrides the job)"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="override grpo.maxNumSteps")
    parser.add_argument(
        "--progress-port",
        type=int,
        default=DRIVER_PROGRESS_PORT,
        help="port of /progress and /metrics (0 picks a free one)",
    )
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="JOB_PATH=LOCAL_DIR",
        help="read the trainer's paths under JOB_PATH (a volume mount in the pods, e.g. /models) from "
        "LOCAL_DIR here; repeatable",
    )
    parser.add_argument("--num-cpus", type=int, default=None, help="logical CPUs of the embedded Ray")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs of the embedded Ray (default 0: CPU)")
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        manifest = localize(
            driver.read_manifest(ns.job), ns.checkpoint_dir, ns.max_steps, parse_mounts(ns.mount)
        )
    except (OSError, ValueError) as exc:
        print(f"asyncgrpo: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    cpus = ns.num_cpus or max(os.cpu_count() or 1, required_cpus(manifest))
    ray.init(num_cpus=cpus, num_gpus=ns.gpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        return driver.run_job(manifest, progress_port=ns.progress_port, grace_seconds=0)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
