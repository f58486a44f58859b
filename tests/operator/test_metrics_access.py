"""Who may read /metrics: the endpoint served over real HTTPS, with the API server's two reviews
(TokenReview, SubjectAccessReview) answered by a table here. That the real API server answers
them as expected, and that the chart's RBAC allows the calls, is tests/e2e/test_metrics_access.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from asyncgrpo_operator import certs
from asyncgrpo_operator.metrics import Metrics, serve
from asyncgrpo_operator.metrics_access import (
    ALLOWED_TTL_SECONDS,
    DENIED_TTL_SECONDS,
    MAX_ENTRIES,
    TOKEN_TTL_SECONDS,
    Identity,
    MetricsAccess,
    Verdict,
)
from asyncgrpo_operator.metrics_tls import serving_tls
from tests.webhook.server import free_port

READER = Identity("system:serviceaccount:monitoring:prometheus", "u1", ("system:serviceaccounts",))
STRANGER = Identity("system:serviceaccount:default:app", "u2", ("system:serviceaccounts",))


@dataclass
class ApiServer:
    """The two reviews as an API server would answer them, counted."""

    tokens: dict[str, Identity] = field(default_factory=lambda: {"reader": READER, "stranger": STRANGER})
    readers: set[Identity] = field(default_factory=lambda: {READER})
    token_reviews: int = 0
    access_reviews: int = 0
    down: bool = False

    async def review_token(self, token: str) -> Identity | None:
        self.token_reviews += 1
        if self.down:
            raise ConnectionError("the API server is down")
        return self.tokens.get(token)

    async def review_access(self, identity: Identity, path: str, verb: str) -> bool:
        self.access_reviews += 1
        return path == "/metrics" and verb == "get" and identity in self.readers


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def bearer(token: str) -> str:
    return f"Bearer {token}"


def judged(access: MetricsAccess, authorization: str | None) -> Verdict:
    return asyncio.run(access.check(authorization))


def test_a_scrape_without_a_bearer_token_is_unauthenticated_without_asking_the_api_server() -> None:
    api = ApiServer()
    access = MetricsAccess(api)
    for header in (None, "", "Bearer", "Bearer   ", "Basic cmVhZGVyOg==", "reader"):
        assert judged(access, header) == "unauthenticated"
    assert api.token_reviews == 0 and api.access_reviews == 0


def test_an_unknown_token_is_unauthenticated_a_known_one_is_judged_by_rbac() -> None:
    access = MetricsAccess(ApiServer())
    assert judged(access, bearer("forged")) == "unauthenticated"
    assert judged(access, bearer("stranger")) == "forbidden"
    assert judged(access, bearer("reader")) == "allowed"
    assert judged(access, "bearer reader") == "allowed"  # the scheme in any case (RFC 7235)


def test_scrapes_every_15_seconds_ask_the_api_server_a_few_times_an_hour() -> None:
    api, clock = ApiServer(), Clock()
    access = MetricsAccess(api, clock=clock)
    for _ in range(240):  # one hour
        assert judged(access, bearer("reader")) == "allowed"
        clock.now += 15
    assert api.token_reviews == 3600 // TOKEN_TTL_SECONDS
    assert api.access_reviews == 3600 // ALLOWED_TTL_SECONDS


def test_a_refusal_is_remembered_briefly_so_a_new_binding_takes_effect_within_30_seconds() -> None:
    api, clock = ApiServer(), Clock()
    access = MetricsAccess(api, clock=clock)
    assert judged(access, bearer("stranger")) == "forbidden"
    api.readers.add(STRANGER)  # someone binds the metrics-reader role
    clock.now += DENIED_TTL_SECONDS - 1
    assert judged(access, bearer("stranger")) == "forbidden"
    clock.now += 1
    assert judged(access, bearer("stranger")) == "allowed"


def test_an_unanswered_review_fails_that_scrape_and_the_next_one_asks_again() -> None:
    api = ApiServer(down=True)
    access = MetricsAccess(api)
    with pytest.raises(ConnectionError):
        judged(access, bearer("reader"))
    api.down = False
    assert judged(access, bearer("reader")) == "allowed"
    assert api.token_reviews == 2


def test_a_caller_sending_a_new_token_each_time_holds_at_most_max_entries_in_memory() -> None:
    access = MetricsAccess(ApiServer())
    for i in range(MAX_ENTRIES + 50):
        judged(access, bearer(f"random-{i}"))
    assert len(access.identities) == MAX_ENTRIES


# --- the endpoint ---------------------------------------------------------------------------------


@dataclass
class Endpoint:
    url: str
    ca: Path
    api: ApiServer

    async def get(self, token: str | None) -> int:
        """The status of one scrape; the body when it is 200."""
        headers = {"Authorization": bearer(token)} if token else {}
        context = ssl.create_default_context(cafile=str(self.ca))
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url, headers=headers, ssl=context) as response,
        ):
            self.last_body = await response.text()
            return response.status

    last_body: str = ""


@contextlib.asynccontextmanager
async def endpoint(tmp_path: Path) -> AsyncIterator[Endpoint]:
    """/metrics over HTTPS with a self-signed certificate, one admission counted."""
    files = certs.write_self_signed(hosts=["127.0.0.1"], directory=tmp_path / "tls")
    metrics, api, port = Metrics(), ApiServer(), free_port()
    metrics.admissions.labels("CREATE", "allowed").inc()
    runner = await serve(
        metrics, port, "127.0.0.1", tls=serving_tls(files.directory).context, access=MetricsAccess(api)
    )
    try:
        yield Endpoint(f"https://127.0.0.1:{port}/metrics", files.ca, api)
    finally:
        await runner.cleanup()


def test_the_endpoint_answers_401_403_or_the_metrics_over_https(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with endpoint(tmp_path) as metrics:
            assert await metrics.get(None) == 401
            assert await metrics.get("stranger") == 403
            assert await metrics.get("reader") == 200
            assert 'asyncgrpo_admission_requests_total{operation="CREATE",verdict="allowed"} 1.0' in (
                metrics.last_body
            )

    asyncio.run(scenario())


def test_the_endpoint_answers_500_while_the_api_server_cannot_review_and_recovers(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with endpoint(tmp_path) as metrics:
            metrics.api.down = True
            assert await metrics.get("reader") == 500
            metrics.api.down = False
            assert await metrics.get("reader") == 200

    asyncio.run(scenario())


def test_a_renewed_certificate_is_served_without_restarting_the_listener(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = certs.write_self_signed(hosts=["127.0.0.1"], directory=tmp_path / "tls")
        tls = serving_tls(first.directory)
        port = free_port()
        runner = await serve(Metrics(), port, "127.0.0.1", tls=tls.context)
        try:
            assert await served_certificate(port) == first.cert.read_bytes()
            renewed = certs.write_self_signed(hosts=["127.0.0.1"], directory=tmp_path / "tls")
            os.utime(renewed.cert, (time.time() + 5, time.time() + 5))  # a later modification time
            assert tls.reload_if_changed()
            assert await served_certificate(port) == renewed.cert.read_bytes()
            assert not tls.reload_if_changed()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


async def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()
