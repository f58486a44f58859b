"""pytest plugin (registered in tests/conftest.py) for the whole-path e2e modules: the chart
installed by helm with the operator reading /progress from the drivers run here, the kubelet
stand-in that runs each head pod's driver container (tests/e2e/whole_path.py), and `run_job`,
which applies a job and runs every attempt's driver until the job is terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.e2e.test_operator import ProgressServer
from tests.e2e.whole_path import AgjWatch, DriverKubelet, LocalDriver, drive, job_status, wait_with_watch
from tests.webhook.cluster_harness import Installation, running_chart

SCENARIO_TIMEOUT = 600.0  # generous: the driver's Ray start-up alone takes 20-70 s on 2 busy cores
STEPS = 120  # long enough that a 1 s progress poll sees several steps even on an idle machine


@pytest.fixture(scope="module")
def pod_network() -> Iterator[ProgressServer]:
    """Where the operator reads the drivers' /progress: forwarded to each local driver's port."""
    server = ProgressServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster, pod_network: ProgressServer) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    with running_chart(local_cluster, helm_bin, progress_url_template=pod_network.template) as installation:
        yield installation


@pytest.fixture
def kubelet(chart: Installation, tmp_path: Path, pod_network: ProgressServer) -> DriverKubelet:
    return DriverKubelet(chart.api, tmp_path, pod_network)


def apply(chart: Installation, manifest: dict[str, object]) -> None:
    outcome = chart.kubectl.apply(chart.jobs_ns, manifest)
    assert outcome.returncode == 0, outcome.stderr
    assert "created" in outcome.stdout, outcome.stdout


def show(driver: LocalDriver) -> None:
    """Shown only when the test fails (captured output)."""
    sys.stdout.write(f"\n--- {driver.pod} driver log ({driver.log}) ---\n{driver.log_tail(15)}\n")


def run_job(
    chart: Installation,
    kubelet: DriverKubelet,
    manifest: dict[str, Any],
    on_start: Callable[[LocalDriver, AgjWatch], None] | None = None,
) -> tuple[AgjWatch, list[tuple[LocalDriver, int]]]:
    """kubectl apply the job, run every attempt's driver until the job is terminal while watching
    `kubectl get agj` (`on_start` sees each driver as it starts); returns the watch and (driver,
    exit code) per attempt (their logs are shown when the test fails)."""
    apply(chart, manifest)
    watch = AgjWatch(chart.kubectl, chart.jobs_ns, manifest["metadata"]["name"], every=0.5)
    started = None if on_start is None else (lambda driver: on_start(driver, watch))
    runs = list(drive(kubelet, watch, timeout=SCENARIO_TIMEOUT, on_start=started))
    for driver, _ in runs:
        show(driver)
    return watch, runs


def progress_shown(chart: Installation, name: str, field: str) -> int:
    """A status.progress field of the job as the operator last read it from /progress (0 while
    unset): lastCheckpointStep is `kubectl get agj`'s Checkpoint, durableCheckpointStep -o wide's
    Durable-Ckpt."""
    progress = job_status(chart.api, chart.jobs_ns, name).get("progress") or {}
    return int(progress.get(field) or 0)


def wait_for_progress(
    chart: Installation, watch: AgjWatch, driver: LocalDriver, field: str, at_least: int
) -> int:
    """Wait (watching `kubectl get agj`) until the job's status shows `field` at `at_least` or
    later, as a user would see it; returns what it shows. A driver that exits first (its Ray did
    not start, say) ends the wait, and the test's exit-code assertions say so."""
    wait_with_watch(
        watch,
        lambda: progress_shown(chart, watch.job, field) >= at_least or not driver.running(),
        f"{field} {at_least} or later in the job's status",
        timeout=SCENARIO_TIMEOUT,
        interval=0.2,
    )
    return progress_shown(chart, watch.job, field)
