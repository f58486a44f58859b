"""Fixtures shared by the reliability tests: one `helm install` of the chart per test session.

The installation is the webhook e2e harness (tests/webhook/cluster_harness.py): the chart installed
into the local control plane, the operator run locally as the chart's ServiceAccount, serving the
webhook on 127.0.0.1 in URL mode. Sharing one per session keeps the suite inside the CI budget
(an install plus operator start costs ~15 s on the 2-core CI machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.webhook.cluster_harness import Installation


def count(name: str, default: int) -> int:
    """How many cases/rounds a test runs: `ASYNCGRPO_RELIABILITY_<NAME>`, else the CI-sized default."""
    return int(os.environ.get(f"ASYNCGRPO_RELIABILITY_{name.upper()}", default))


@pytest.fixture(scope="session")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    """The chart installed, the operator serving its webhook and reconciling `chart.jobs_ns`."""
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    installation = Installation(local_cluster, helm_bin)
    installation.install()
    try:
        installation.start_operator()
        yield installation
    finally:
        print(f"operator log {installation.log}:\n{installation.log_tail(20)}")
        installation.uninstall()
