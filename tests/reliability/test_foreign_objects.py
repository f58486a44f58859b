"""The whole operator beside many large objects that others labelled as a job's (issue 27 item 3,
issue 47 item 5).

Anyone who may create ConfigMaps or pods in a watched namespace may label them
`asyncgrpo.dev/job-name`, even copy every label the operator puts on its own spec ConfigMaps, and
fill each with a megabyte (a ConfigMap's data, a pod's environment). The operator used to cache
every such ConfigMap in full, and to read its first list of such pods whole: a namespace of either
pushed it past its memory limit (512 MiB in the chart) on every start, a crash loop that took every
job's reconciling down with it. It now selects only the labels of its own spec ConfigMaps and
reads them as metadata; pods (whose status and node it must read) are listed as a stream, or in
small pages, each turned into a bounded view as it arrives. What such an object costs is its view,
whatever was written into it.

The test starts the real operator process twice on one namespace and one job: first with no
foreign object (the baseline), then after N foreign ConfigMaps of S KiB (half with the job-name
label alone, half with all of the operator's labels) and P pods with a Q KiB environment value
were created, so that its start lists them (kwok starts the pods, so its watch sees them change
too). Both times it waits until the job is reconciled (its status written, its spec ConfigMap
made) and reads the operator's peak resident memory (the kernel's VmHWM) before stopping it.
CI-sized by default (100 ConfigMaps of 512 KiB, 40 pods of 1 MiB);
`ASYNCGRPO_RELIABILITY_FOREIGN_CONFIGMAPS`, `..._FOREIGN_CONFIGMAP_KIB`, `..._FOREIGN_PODS` and
`..._FOREIGN_POD_KIB` set the scale (docs/reliability.md records 1,000 ConfigMaps of 1023 KiB, the
largest a ConfigMap may be).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from asyncgrpo_operator import naming
from tests.cluster.processes import rss_bytes
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import (
    OperatorProcess,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    get_job,
    job_manifest,
)
from tests.reliability.conftest import count

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHART_VALUES = Path(__file__).parents[2] / "charts/asyncgrpo-operator/values.yaml"
MEBIBYTE = 1 << 20
FOREIGN_ALLOWANCE = 32 * MEBIBYTE
"""What the foreign objects may add to the operator's peak memory: their views, and the one object
(or small page) being read, not what was written into them."""


def chart_memory_limit() -> int:
    """The operator container's memory limit in the chart's default values, in bytes."""
    limit = yaml.safe_load(CHART_VALUES.read_text())["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), f"{CHART_VALUES}: resources.limits.memory {limit!r} is not in Mi"
    return int(limit[:-2]) * MEBIBYTE


def peak_memory_until_reconciled(kubeconfig: Path, api: Api, ns: str, log: Path) -> int:
    """The operator's peak resident memory (VmHWM) from its start until the job `demo` is
    reconciled, plus two resync periods (5 s each in OperatorProcess) in which every cached child
    is visited again."""
    op = OperatorProcess(kubeconfig, ns, log)
    op.start()
    assert op.proc is not None
    try:
        op.wait_live()

        def reconciled() -> bool | None:
            status = get_job(api, ns, "demo").get("status") or {}
            try:
                api.get(f"/api/v1/namespaces/{ns}/configmaps/demo-spec")
            except ApiError as err:
                if err.status == 404:
                    return None
                raise
            return bool(status.get("phase")) or None

        wait_until(reconciled, "job demo reconciled", timeout=120)
        time.sleep(10)
        assert op.proc.poll() is None, op.tail()
        return rss_bytes(op.proc.pid, "VmHWM")
    finally:
        op.stop()


def large_pod(name: str, job: str, kib: int) -> JSON:
    """A pod of anyone's, labelled as `job`'s, with `kib` KiB of environment."""
    container = {"name": "main", "image": "registry.example/idle:1"}
    return {
        "metadata": {"name": name, "labels": {naming.JOB_NAME_LABEL: job}},
        "spec": {"containers": [{**container, "env": [{"name": "PADDING", "value": "x" * (kib << 10)}]}]},
    }


def test_foreign_configmaps_and_pods_labelled_as_a_jobs_cost_the_operator_no_memory_for_their_data(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
) -> None:
    configmaps, configmap_kib = count("foreign_configmaps", 100), count("foreign_configmap_kib", 512)
    pods, pod_kib = count("foreign_pods", 40), count("foreign_pod_kib", 1024)
    create_job(kube_api, namespace, job_manifest("demo"))
    baseline = peak_memory_until_reconciled(kubeconfig, kube_api, namespace, tmp_path / "baseline.log")

    operator_labels = {
        "app.kubernetes.io/managed-by": naming.MANAGER,
        "app.kubernetes.io/component": naming.COMPONENT_SPEC,
    }
    blob = "x" * (configmap_kib << 10)
    started = time.monotonic()
    for i in range(configmaps):
        labels = {naming.JOB_NAME_LABEL: "demo", **(operator_labels if i % 2 else {})}
        kube_api.create(
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"metadata": {"name": f"foreign-{i:04d}", "labels": labels}, "data": {"blob": blob}},
        )
    for i in range(pods):
        kube_api.create(
            f"/api/v1/namespaces/{namespace}/pods", large_pod(f"foreign-{i:04d}", "demo", pod_kib)
        )
    created_seconds = time.monotonic() - started
    beside_foreign = peak_memory_until_reconciled(kubeconfig, kube_api, namespace, tmp_path / "foreign.log")

    written = (configmaps * configmap_kib + pods * pod_kib) << 10
    report = (
        f"{configmaps} foreign ConfigMaps of {configmap_kib} KiB and {pods} pods with {pod_kib} KiB "
        f"of environment ({written / MEBIBYTE:.0f} MiB, created in {created_seconds:.0f} s): operator "
        f"peak {beside_foreign / MEBIBYTE:.0f} MiB, {baseline / MEBIBYTE:.0f} MiB without them"
    )
    print("foreign objects:", report)
    assert beside_foreign < chart_memory_limit(), report
    assert beside_foreign - baseline < FOREIGN_ALLOWANCE, report
