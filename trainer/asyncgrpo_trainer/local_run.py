"""`asyncgrpo run job.yaml`: the same job file `kubectl apply` takes, run on this machine.

Starts its own Ray node (`start_own_ray`: never the cluster RAY_ADDRESS names or a `ray start` one
on this machine) and runs the driver in this process. A job that asks for GPUs
(gpusPerReplica > 0) gets them without `--gpus` when this machine has as many (torch's device
count); when it has fewer, or fewer than `--gpus N`, the run fails at once (`choose_gpus`) rather
than wait for a placement group Ray cannot place.

What it prints is for a person: where checkpoints and /progress are, a progress bar and a
summary; `--jsonl FILE` writes the driver's JSON step lines as well ("-": stdout, and the bar goes
to stderr). /progress and /metrics are served on 127.0.0.1 and a free port (`--progress-port`).

Checkpoints go to the job's checkpoint.path only if it exists here as a writable directory (in a
pod it is a volume mount such as /checkpoints); otherwise to .asyncgrpo/<name>/checkpoints, or
--checkpoint-dir. Either local directory then stands in for the job's checkpoint volume
(storage.checkpoints), as a hostPath mounted at itself: it is this machine's disk, so the warning
that checkpoints would miss a durable volume does not apply.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import ray
import torch
from ray._private.authentication import authentication_token_setup as ray_auth

from asyncgrpo_api import rules
from asyncgrpo_trainer import driver, progress
from asyncgrpo_trainer.console import HumanProgress

log = logging.getLogger(__name__)


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
    local = None
    if checkpoint_dir is not None:
        local = str(Path(checkpoint_dir).resolve())
    elif not _usable(ckpt.get("path", "/checkpoints")):
        local = str((Path(".asyncgrpo") / name / "checkpoints").resolve())
    if local is not None:
        ckpt["path"] = local
        spec.setdefault("storage", {})["checkpoints"] = {"hostPath": {"path": local}, "mountPath": local}
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


def required_gpus(manifest: dict[str, Any]) -> int:
    """GPUs the job's placement groups reserve: both pools' replicas x gpusPerReplica (colocated,
    the generation pool has no replicas). 0 for a spec that does not validate: the driver names
    its errors."""
    job = rules.validate_manifest(manifest).job
    if job is None:
        return 0
    return job.spec.cluster.policy_workers.total_gpus + job.spec.cluster.generation_workers.total_gpus


class GpuError(ValueError):
    """The job cannot be placed on this machine's GPUs."""


def choose_gpus(requested: int | None, needed: int, available: int) -> int:
    """The embedded Ray's GPUs: `--gpus` (`requested`) if given, else what the job needs when the
    machine has that many (`available`, torch.cuda.device_count()). GpuError, at once, where Ray
    would wait for a placement group it cannot place."""
    has = f"this machine has {available} GPU{'' if available == 1 else 's'}"
    asks = (
        f"the job asks for {needed} GPU{'' if needed == 1 else 's'} "
        "(replicas x gpusPerReplica of spec.cluster's pools)"
    )
    if requested is None:
        if needed <= available:
            return needed
        raise GpuError(
            f"{asks} and {has}; run it where the GPUs are, or give the job gpusPerReplica: 0 for CPU "
            f"(--gpus N uses N local GPUs)"
        )
    if requested > available:
        raise GpuError(f"--gpus {requested} but {has}; {asks}")
    if requested < needed:
        raise GpuError(f"--gpus {requested} is fewer than the job needs: {asks}; {has}")
    return requested


RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def start_own_ray(*, num_cpus: int, num_gpus: int) -> None:
    """Start this process's own Ray node, always: never join the cluster RAY_ADDRESS names or one
    that `ray start` left running on this machine, as a bare ray.init() does (and then refuses the
    num_cpus and num_gpus given here). `asyncgrpo run` runs a job on this machine; a cluster runs
    it through the operator (`kubectl apply`).

    The Ray is its own, so it picks the auth mode: token, Ray's default for a new local cluster,
    said explicitly, which spares every run Ray's "Token authentication is enabled for this Ray
    cluster" warning. A user's RAY_AUTH_MODE wins. Ray 2.60 reads the mode into its C++ config when
    it is imported, so setting the variable now is not enough: this is Ray's own switch for a new
    cluster (environment, then a config reload). The in-cluster driver joins its pod's Ray and
    leaves its auth alone (driver.execute)."""
    if RAY_AUTH_MODE_ENV not in os.environ:
        ray_auth._enable_token_auth()
    driver.init_ray(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        _temp_dir=ray_temp_dir(os.environ),
    )


RAY_SOCKET_TAIL = len("/session_2026-12-07_05-50-12_123456_4194304/sockets/plasma_store")
"""What Ray appends to its temp folder for its longest unix socket: a session folder named by the
date to the microsecond and the pid (at most 7 digits), its sockets folder and the socket's name
(`plasma_store`; a second node of one session would add ".1", and a local run starts one)."""
UNIX_SOCKET_MAX = 107
"""A unix socket's path may hold 107 bytes on Linux (108 with the terminating NUL); Ray refuses a
longer one, and every Ray test of a suite run under a long TMPDIR failed on it."""


def ray_temp_dir(environ: Mapping[str, str]) -> str:
    """The folder Ray's session goes under: Ray's own choice (RAY_TMPDIR, else TMPDIR, else /tmp,
    plus "ray") when its sockets' paths fit a unix socket's limit; else /tmp/ray, logged, for a
    TMPDIR that is merely long. A RAY_TMPDIR the user chose and that cannot fit is an error that
    names it and the fix, rather than Ray's failure deep in the node's start."""
    chosen = environ.get("RAY_TMPDIR")
    base = chosen or environ.get("TMPDIR") or "/tmp"
    wanted = os.path.join(base, "ray")
    if len(wanted.encode()) + RAY_SOCKET_TAIL <= UNIX_SOCKET_MAX:
        return wanted
    limit = UNIX_SOCKET_MAX - RAY_SOCKET_TAIL - len("/ray")
    if chosen:
        raise ValueError(
            f"RAY_TMPDIR={chosen} is {len(chosen.encode())} bytes long; Ray's unix sockets under it "
            f"would pass the {UNIX_SOCKET_MAX}-byte limit: set RAY_TMPDIR to a folder of at most "
            f"{limit} bytes (e.g. /tmp)"
        )
    log.info("TMPDIR=%s is too long for Ray's unix sockets (at most %d bytes); Ray's session goes "
             "under /tmp/ray", base, limit)  # fmt: skip
    return "/tmp/ray"


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
        default=0,
        help="port of /progress and /metrics on 127.0.0.1 (default 0: a free one, printed at start)",
    )
    parser.add_argument(
        "--jsonl",
        metavar="FILE",
        default=None,
        help="also write one JSON line per step and a JSON summary to FILE ('-': stdout)",
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
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs of the embedded Ray (default: the GPUs the job asks for, if this machine has them)",
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="asyncgrpo: %(message)s", stream=sys.stderr)
    logging.getLogger("asyncgrpo_trainer").setLevel(logging.INFO)
    try:
        manifest = localize(
            driver.read_manifest(ns.job), ns.checkpoint_dir, ns.max_steps, parse_mounts(ns.mount)
        )
    except (OSError, ValueError) as exc:
        print(f"asyncgrpo: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        gpus = choose_gpus(ns.gpus, required_gpus(manifest), torch.cuda.device_count())
    except GpuError as exc:
        print(f"asyncgrpo: cannot run here: {exc}", file=sys.stderr)
        return 1
    human = sys.stderr if ns.jsonl == "-" else sys.stdout
    with contextlib.ExitStack() as stack:
        reporters = reporters_for(ns.jsonl, human, manifest["spec"]["checkpoint"].get("path"), stack)
        cpus = ns.num_cpus or max(os.cpu_count() or 1, required_cpus(manifest))
        server = progress.ProgressServer(ns.progress_port, host="127.0.0.1")
        _banner(human, manifest, cpus, gpus, server.port, chosen=ns.gpus is None)
        try:
            start_own_ray(num_cpus=cpus, num_gpus=gpus)
            return driver.run_job(manifest, server=server, reporters=reporters, grace_seconds=0)
        finally:
            ray.shutdown()


def reporters_for(
    jsonl: str | None, human: TextIO, checkpoints: str | None, stack: contextlib.ExitStack
) -> list[progress.Reporter]:
    """The bar and summary on `human`; with `jsonl`, the JSON step lines too (to the file, which
    `stack` closes, or to stdout for "-")."""
    out: list[progress.Reporter] = [HumanProgress(human, checkpoints=checkpoints)]
    if jsonl is not None:
        # The file is closed by `stack`, the caller's ExitStack.
        stream: TextIO = sys.stdout if jsonl == "-" else stack.enter_context(Path(jsonl).open("w"))  # noqa: SIM115
        out.append(progress.JsonLines(stream))
    return out


def _banner(
    out: TextIO, manifest: dict[str, Any], cpus: int, gpus: int, port: int, *, chosen: bool = False
) -> None:
    """What runs, and where to look: the checkpoint directory and the /progress URL; with
    RAY_ADDRESS set, that the run does not train there (`start_own_ray`). `chosen`: the GPUs were
    taken from the job, not from --gpus."""
    spec = manifest.get("spec", {})
    name = manifest.get("metadata", {}).get("name", "job")
    steps = spec.get("trainer", {}).get("grpo", {}).get("maxNumSteps")
    devices = f"{cpus} CPUs" + (f", {gpus} GPUs" if gpus else "")
    if gpus and chosen:
        devices += " the job asks for, found on this machine"
    out.write(
        f"asyncgrpo run {name}: {f'{steps} steps ' if steps else ''}on an embedded Ray ({devices})\n"
        f"  checkpoints  {spec.get('checkpoint', {}).get('path')}\n"
        f"  progress     http://127.0.0.1:{port}/progress (and /metrics)\n"
    )
    address = os.environ.get(RAY_ADDRESS_ENV)
    if address:
        out.write(f"  ray          its own on this machine; {RAY_ADDRESS_ENV}={address} is not joined\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
