"""pytest plugin: the local control plane as session fixtures (registered in tests/conftest.py).

`local_cluster` brings the control plane up once per test run, or attaches to a live one (the state
folder in ASYNCGRPO_CLUSTER_STATE, else the default one). Sessions register in the state folder, so
two pytest runs on one machine share a cluster safely: a cluster started by a session is stopped by
the last session to finish (one started with `python -m tests.cluster up` is never stopped);
ASYNCGRPO_KEEP_CLUSTER=1 leaves it running for a faster next run. Every test gets its own
namespace, deleted afterwards. When a test that uses the cluster fails, its report names the log
folder and shows what each component logged during that test.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.cluster.build import build
from tests.cluster.cluster import LocalCluster
from tests.cluster.images import Built, build_all
from tests.cluster.rest import Api, ApiError

TEST_NS_LABEL = "asyncgrpo.dev/test-namespace"
_FAILED_WITH_CLUSTER: list[str] = []


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """The running control plane: attached to if live, else started here (building if needed)."""
    cluster = LocalCluster.from_env()
    cluster.join(build)
    yield cluster
    cluster.leave(keep=os.environ.get("ASYNCGRPO_KEEP_CLUSTER", "") not in ("", "0"))


@pytest.fixture(scope="session")
def built_images(pytestconfig: pytest.Config) -> dict[str, Built]:
    """The operator and CPU trainer images by name, built when their archives are missing. A cold
    build takes 7-13 minutes: its output goes to the console as it runs, where pytest's capture
    would hold it until the test ended and the run would sit silent (issue 34)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")  # None with `-p no:capture`
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        return {b.name: b for b in build_all()}


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: LocalCluster) -> Path:
    """Path of an admin kubeconfig for the control plane (client certs, system:masters)."""
    return local_cluster.kubeconfig


@pytest.fixture(scope="session")
def kube_api(local_cluster: LocalCluster) -> Api:
    """A small typed REST client acting as cluster admin (see tests/cluster/rest.py)."""
    return local_cluster.api


def wait_for_default_service_account(api: Api, namespace: str, timeout: float = 30.0) -> None:
    """The ServiceAccount admission plugin rejects pods until KCM created `default`: wait for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except ApiError as err:
            if err.status != 404:
                raise
        time.sleep(0.1)
    raise TimeoutError(f"no default ServiceAccount in {namespace} after {timeout} s (is KCM running?)")


@pytest.fixture
def namespace(kube_api: Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (not awaited) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{secrets.token_hex(3)}"
    kube_api.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": {TEST_NS_LABEL: "true"}}})
    wait_for_default_service_account(kube_api, name)
    yield name
    try:
        kube_api.delete(f"/api/v1/namespaces/{name}")
    except ApiError as err:
        if err.status != 404:
            raise


_LOG_SIZES = pytest.StashKey[dict[str, int]]()
LOG_LINES_PER_COMPONENT = 40


def log_sizes(logs: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in logs.glob("*.log")} if logs.is_dir() else {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note how long each component log is before a cluster test, so its report can show what the
    components logged during the test and nothing from the rest of the session."""
    if "local_cluster" in getattr(item, "fixturenames", ()):
        item.stash[_LOG_SIZES] = log_sizes(LocalCluster.from_env().logs)


def logged_during(logs: Path, before: dict[str, int], lines: int = LOG_LINES_PER_COMPONENT) -> dict[str, str]:
    """The last `lines` lines each component logged since `before` (a log that shrank, i.e. was
    restarted, from its start); components that logged nothing are left out."""
    out: dict[str, str] = {}
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        start = before.get(log.name, 0)
        with log.open("rb") as fh:
            fh.seek(start if start <= log.stat().st_size else 0)
            gained = fh.read().decode(errors="replace").splitlines()
        if gained:
            out[log.stem] = "\n".join(gained[-lines:])
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed cluster test's report shows what each component logged during it (pytest prints it
    under the failure), so CI need not dump every log of the session."""
    report = yield
    if report.failed and "local_cluster" in getattr(item, "fixturenames", ()):
        logs = LocalCluster.from_env().logs
        report.sections.append(("control plane", f"component logs: {logs}"))
        for name, text in logged_during(logs, item.stash.get(_LOG_SIZES, {})).items():
            report.sections.append((f"{name} during this test (last {LOG_LINES_PER_COMPONENT} lines)", text))
        _FAILED_WITH_CLUSTER.append(item.nodeid)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One greppable line for CI: where the control-plane logs are."""
    if _FAILED_WITH_CLUSTER:
        logs = LocalCluster.from_env().logs
        terminalreporter.write_line(
            f"CONTROL PLANE LOGS: {logs} ({len(_FAILED_WITH_CLUSTER)} failed test(s) used the cluster)"
        )
