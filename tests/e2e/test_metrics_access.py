"""/metrics answers only tokens RBAC lets read it, as the real API server judges them.

The chart installed by helm (metrics.secure, its default), the operator running as the chart's
ServiceAccount with only the chart's RBAC (tests/webhook/cluster_harness.py), serving /metrics
over HTTPS with the webhook's certificate: every review it asks for is a real TokenReview and
SubjectAccessReview of the local kube-apiserver, about real ServiceAccount tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.e2e.test_operator_hardening import samples_of, value
from tests.webhook.cluster_harness import METRICS_READER, Installation, running_chart
from tests.webhook.server import free_port

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    with running_chart(local_cluster, helm_bin, metrics_port=free_port()) as installation:
        yield installation


def test_a_scrape_without_a_token_the_api_server_knows_is_401(chart: Installation) -> None:
    assert chart.read_metrics(None)[0] == 401
    assert chart.read_metrics("not-a-token")[0] == 401
    real = chart.token("metrics-e2e-forger")
    assert chart.read_metrics(real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB"))[0] == 401, (
        "a token whose signature does not verify"
    )


def test_a_service_account_without_the_metrics_reader_binding_is_403(chart: Installation) -> None:
    status, text = chart.read_metrics(chart.token("not-prometheus"))
    assert status == 403, text


def test_the_service_account_bound_to_metrics_reader_gets_the_metrics_and_is_reviewed_once(
    chart: Installation,
) -> None:
    token = chart.token(METRICS_READER)
    scrapes = [chart.read_metrics(token) for _ in range(5)]
    assert [status for status, _ in scrapes] == [200] * 5, scrapes[0][1]
    first, last = samples_of(scrapes[0][1]), samples_of(scrapes[-1][1])
    assert value(last, "asyncgrpo_leader") == 1

    def reviews(samples: dict[str, list[tuple[dict[str, str], float]]], resource: str) -> float:
        return value(samples, "asyncgrpo_api_requests_total", verb="create", resource=resource)

    # The first scrape reviewed the token and its access (counted before the body was written);
    # the four after it were answered from the cache, without asking the API server again.
    assert reviews(first, "tokenreviews") >= 1 and reviews(first, "subjectaccessreviews") >= 1
    assert reviews(last, "tokenreviews") == reviews(first, "tokenreviews")
    assert reviews(last, "subjectaccessreviews") == reviews(first, "subjectaccessreviews")
