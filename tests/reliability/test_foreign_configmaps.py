"""The whole operator beside many ConfigMaps that job authors labelled as a job's (issue 27 item 3).

Anyone who may create ConfigMaps in a watched namespace may label them `asyncgrpo.dev/job-name`,
and even copy every label the operator puts on its own spec ConfigMaps. The operator used to
cache every such ConfigMap in full, so a namespace of them could push it past its memory limit
(512 MiB in the chart) and take every job's reconciling down with it. It now selects only the
labels of its own spec ConfigMaps and caches metadata only, so what a foreign ConfigMap can cost
is its metadata, whatever its data.

The test starts the real operator process twice on one namespace and one job: first with no
foreign ConfigMap (the baseline), then after N foreign ConfigMaps of S KiB (half with the job-name
label alone, half with all of the operator's labels) were created, so that its start lists them.
Both times it waits until the job is reconciled (its status written, its spec ConfigMap made),
and samples the operator's resident memory throughout. CI-sized by default (100 x 512 KiB);
`ASYNCGRPO_RELIABILITY_FOREIGN_CONFIGMAPS` and `..._FOREIGN_CONFIGMAP_KIB` set the scale
(docs/reliability.md records 1,000 of 1023 KiB, the largest a ConfigMap may be).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from asyncgrpo_operator import naming
from tests.cluster.processes import RssSampler
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
"""What the foreign ConfigMaps may add to the operator's peak memory: their metadata, not data."""


def chart_memory_limit() -> int:
    """The operator container's memory limit in the chart's default values, in bytes."""
    limit = yaml.safe_load(CHART_VALUES.read_text())["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), f"{CHART_VALUES}: resources.limits.memory {limit!r} is not in Mi"
    return int(limit[:-2]) * MEBIBYTE


def peak_memory_until_reconciled(kubeconfig: Path, api: Api, ns: str, log: Path) -> int:
    """The operator's peak VmRSS from its start until the job `demo` is reconciled, plus two resync
    periods (5 s each in OperatorProcess) in which every cached ConfigMap is visited again."""
    op = OperatorProcess(kubeconfig, ns, log)
    op.start()
    assert op.proc is not None
    sampler = RssSampler(op.proc.pid).start()
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
    finally:
        peak = sampler.stop()
        op.stop()
    return peak


def test_foreign_configmaps_labelled_as_a_jobs_cost_the_operator_no_memory_for_their_data(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
) -> None:
    foreign, kib = count("foreign_configmaps", 100), count("foreign_configmap_kib", 512)
    create_job(kube_api, namespace, job_manifest("demo"))
    baseline = peak_memory_until_reconciled(kubeconfig, kube_api, namespace, tmp_path / "baseline.log")

    operator_labels = {
        "app.kubernetes.io/managed-by": naming.MANAGER,
        "app.kubernetes.io/component": naming.COMPONENT_SPEC,
    }
    blob = "x" * (kib << 10)
    started = time.monotonic()
    for i in range(foreign):
        labels = {naming.JOB_NAME_LABEL: "demo", **(operator_labels if i % 2 else {})}
        kube_api.create(
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"metadata": {"name": f"foreign-{i:04d}", "labels": labels}, "data": {"blob": blob}},
        )
    created_seconds = time.monotonic() - started
    beside_foreign = peak_memory_until_reconciled(kubeconfig, kube_api, namespace, tmp_path / "foreign.log")

    report = (
        f"{foreign} foreign ConfigMaps of {kib} KiB ({foreign * kib >> 10} MiB, created in "
        f"{created_seconds:.0f} s): operator peak {beside_foreign / MEBIBYTE:.0f} MiB, "
        f"{baseline / MEBIBYTE:.0f} MiB without them"
    )
    print("foreign configmaps:", report)
    assert beside_foreign < chart_memory_limit(), report
    assert beside_foreign - baseline < FOREIGN_ALLOWANCE, report
