"""Fixtures shared by the reliability tests: one `helm install` of the chart per test session.

The installation is tests/reliability/proxied.py's: the chart installed into the local control
plane, the operator run locally as the chart's ServiceAccount behind a recording proxy in front of
the API server (tests/reliability/apiproxy.py), so the permissions test sees every call it made
since it started. One installation is shared by the whole session, which keeps the suite inside
the CI budget (an install plus operator start costs ~15 s on 2 cores).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster.cluster import LocalCluster
from tests.e2e.test_operator import ProgressServer
from tests.reliability.proxied import ProxiedInstallation, proxied_chart
from tests.webhook.server import free_port


def count(name: str, default: int) -> int:
    """How many cases/rounds a test runs: `ASYNCGRPO_RELIABILITY_<NAME>`, else the CI-sized default."""
    return int(os.environ.get(f"ASYNCGRPO_RELIABILITY_{name.upper()}", default))


@pytest.fixture(scope="session")
def progress_server() -> Iterator[ProgressServer]:
    """The drivers' /progress for every operator of the session (reset per test by `progress`)."""
    server = ProgressServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def chart(local_cluster: LocalCluster, progress_server: ProgressServer) -> Iterator[ProxiedInstallation]:
    """The chart installed for one watched namespace, `chart.jobs_ns` (the operator's rights there
    are a Role), the operator serving its webhook and reconciling that namespace."""
    with proxied_chart(local_cluster, progress_server.template, metrics_port=free_port()) as installation:
        yield installation


@pytest.fixture
def progress(progress_server: ProgressServer) -> ProgressServer:
    """Every driver's /progress in mid-run (step 3 of 20), as the operator under test polls it."""
    progress_server.doc = {"step": 3, "maxSteps": 20, "policyVersion": 3, "state": "running"}
    progress_server.docs.clear()
    progress_server.routes.clear()
    return progress_server
