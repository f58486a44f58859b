"""`asyncgrpo logs JOB [-f]`: the driver's log, from the head pod while it runs, and where its
files are once the pod is gone.

The head pod's `driver` container is the training driver; `kubectl logs` can read it only while
the pod exists, and cleanupPolicy deletes the pods with the RayCluster. The driver also writes its
log, step records and TensorBoard files under checkpoint.path (status.outputs), so this command
streams the container log when there is one, otherwise prints the newest attempt's log from
spec.storage.objectStore when the job names one (`stored_logs`), and otherwise says where those
files are and on which volume. `decide` is the pure part (tested without a cluster); `main` does
the API calls.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncgrpo_api.v1alpha1.runtime import ObjectStoreSpec
from asyncgrpo_operator import k8s, naming, stored_logs


@dataclass(frozen=True)
class Stream:
    """Read the driver container's log from this pod."""

    pod: str
    follow: bool


@dataclass(frozen=True)
class Files:
    """No container log to read: say why and where the files are."""

    text: str


@dataclass(frozen=True)
class Stored:
    """No container log to read, but the driver uploaded its log to spec.storage.objectStore."""

    why: str
    store: ObjectStoreSpec
    namespace: str


def decide(
    job: Mapping[str, Any], heads: Sequence[Mapping[str, Any]], *, follow: bool
) -> Stream | Files | Stored:
    """What `asyncgrpo logs` shows for a job, given its head pods (those of status.rayClusterName)."""
    status = job.get("status") or {}
    name = job["metadata"]["name"]
    for pod in heads:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        driver = _driver_state(pod)
        if "running" in driver:
            return Stream(pod["metadata"]["name"], follow)
        if "terminated" in driver:
            return Stream(pod["metadata"]["name"], False)  # nothing more will come
    phase = status.get("phase") or "Pending"
    why = f": {status.get('reason')}" if status.get("reason") else ""
    if phase in ("Queued", "Pending", "Provisioning", "Suspended"):
        head = f"job {name} is {phase}{why}; its driver has not started yet"
    elif status.get("rayClusterName"):
        head = f"job {name} is {phase}{why}; its head pod is gone"
    else:
        head = f"job {name} is {phase}{why}; its RayCluster is gone (cleanupPolicy)"
    store = ((job.get("spec") or {}).get("storage") or {}).get("objectStore")
    if store and phase not in ("Queued", "Pending", "Provisioning", "Suspended"):
        namespace = str(job["metadata"].get("namespace") or "default")
        return Stored(head, ObjectStoreSpec.model_validate(store), namespace)
    outputs = status.get("outputs")
    if not outputs:
        return Files(f"{head}, and the operator has not recorded where its files are")
    lines = [
        f"{head}. The driver's files are on the {outputs.get('volume')}:",
        f"  driver log    {outputs.get('driverLog')}",
        f"  step records  {outputs.get('steps')}",
        f"  TensorBoard   {outputs.get('tensorboard')}",
    ]
    return Files("\n".join(lines))


def _driver_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == naming.DRIVER_CONTAINER:
            state: Mapping[str, Any] = status.get("state") or {}
            return state
    return {}


async def _run(name: str, namespace: str | None, follow: bool) -> int:
    api = await k8s.Api.connect()
    try:
        ns = namespace or api.current_namespace()
        job = await api.get_job(ns, name)
        if job is None:
            print(f"asyncgrpo logs: no AsyncGRPOJob {name} in namespace {ns}", file=sys.stderr)
            return 1
        cluster = (job.get("status") or {}).get("rayClusterName")
        heads = []
        if cluster:
            selector = f"{naming.RAY_CLUSTER_LABEL}={cluster},{naming.RAY_NODE_TYPE_LABEL}=head"
            heads = await api.list_items(f"/api/v1/namespaces/{ns}/pods", selector)
        outcome = decide(job, heads, follow=follow)
        if isinstance(outcome, Files):
            print(outcome.text)
            return 0
        if isinstance(outcome, Stored):
            return _print_stored(name, outcome)
        out = sys.stdout.buffer
        async for chunk in api.stream_pod_log(
            ns, outcome.pod, naming.DRIVER_CONTAINER, follow=outcome.follow
        ):
            out.write(chunk)
            out.flush()
        return 0
    except k8s.ApiError as err:
        print(f"asyncgrpo logs: {err}", file=sys.stderr)
        return 1
    finally:
        await api.close()


def _print_stored(name: str, outcome: Stored) -> int:
    print(f"{outcome.why}; its driver log from the object store:", file=sys.stderr)
    try:
        attempt, text = stored_logs.newest_driver_log(outcome.store, outcome.namespace, name)
    except stored_logs.StoredLogError as exc:
        print(f"asyncgrpo logs: {exc}", file=sys.stderr)
        return 1
    print(f"(attempt {attempt})", file=sys.stderr)
    sys.stdout.buffer.write(text)
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgrpo logs", description=__doc__.split("\n")[0])
    parser.add_argument("job", help="the AsyncGRPOJob's name")
    parser.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming while the driver runs")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args.job, args.namespace, args.follow))
    except KeyboardInterrupt:
        return 130
