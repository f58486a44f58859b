"""The webhook over HTTPS, through kopf's admission engine, as the API server calls it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

from asyncgrpo_operator import certs
from asyncgrpo_operator.webhook import (
    DEFAULT_CERT_DIR,
    DEFAULT_PORT,
    MAX_REVIEW_BYTES,
    WEBHOOK_PATH,
    WebhookConfig,
    WebhookConfigError,
    configure_admission,
)
from tests.cluster import pki
from tests.webhook.jobs import INVALID_COMBINATIONS, SYNC_WITH_FORCE_IN_ORDER, VALID_MODES
from tests.webhook.server import admission_review, free_port, post, serving

CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


def tls_config(tmp_path: Path, *, check_seconds: float = 60.0) -> WebhookConfig:
    files = certs.write_self_signed(["127.0.0.1", "localhost"], tmp_path / "tls")
    return WebhookConfig(
        addr="127.0.0.1", port=free_port(), cert_dir=files.directory, cert_check_seconds=check_seconds
    )


def url(config: WebhookConfig) -> str:
    return f"https://{config.addr}:{config.port}{WEBHOOK_PATH}"


def test_a_denial_carries_every_finding_with_code_422(tmp_path: Path) -> None:
    config = tls_config(tmp_path)
    bad = INVALID_COMBINATIONS[0]

    async def scenario() -> dict[str, Any]:
        async with serving(config):
            return await post(
                url(config), config.cert_dir / "ca.crt", admission_review("CREATE", bad.manifest)
            )

    response = asyncio.run(scenario())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert f"- {bad.path}: " in response["status"]["message"]


def test_a_denial_is_logged_at_info_not_as_a_handler_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tls_config(tmp_path)
    bad = INVALID_COMBINATIONS[0]

    async def scenario() -> None:
        async with serving(config):
            await post(url(config), config.cert_dir / "ca.crt", admission_review("CREATE", bad.manifest))

    with caplog.at_level(logging.INFO, logger="kopf"):
        asyncio.run(scenario())
    mine = [r for r in caplog.records if "validate-asyncgrpojob" in r.getMessage()]
    assert mine and all(r.levelno < logging.WARNING for r in mine), [
        (r.levelname, r.getMessage()) for r in mine
    ]
    assert any(r.getMessage().startswith("Webhook 'validate-asyncgrpojob' denied: ") for r in mine)


def test_a_valid_job_is_allowed_and_its_warnings_returned(tmp_path: Path) -> None:
    config = tls_config(tmp_path)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with serving(config):
            ca = config.cert_dir / "ca.crt"
            plain = await post(url(config), ca, admission_review("CREATE", VALID_MODES[1].manifest))
            warned = await post(url(config), ca, admission_review("CREATE", SYNC_WITH_FORCE_IN_ORDER))
            return plain["response"], warned["response"]

    plain, warned = asyncio.run(scenario())
    assert plain["allowed"] is True and "status" not in plain
    assert warned["allowed"] is True
    assert any(str(w).startswith("spec.trainer.asyncRL.forceInOrder: is ignored") for w in warned["warnings"])


def padded(manifest: dict[str, Any], kib: int) -> dict[str, Any]:
    """The job with annotations adding about `kib` KiB (the API server allows 256 KiB of them)."""
    chunks = {f"pad.example.com/{i}": "x" * 200 * 1024 for i in range(kib // 200)}
    return {**manifest, "metadata": {**manifest["metadata"], "annotations": chunks}}


def test_the_update_review_of_a_600_kib_job_is_answered_not_refused_as_too_large(tmp_path: Path) -> None:
    """An UPDATE's review carries the job twice (object and oldObject): over aiohttp's default 1 MiB
    body limit for a job over about 512 KiB, which made the webhook answer 413 and the operator's
    own suspend patch fail, so a preempted job never stopped. The server takes what the API server
    can send: each of the two objects up to its own 3 MiB request limit."""
    config = tls_config(tmp_path)
    big = padded(VALID_MODES[1].manifest, 600)
    suspended = {**big, "spec": {**big["spec"], "suspend": True}}

    async def scenario() -> dict[str, Any]:
        async with serving(config):
            review = admission_review("UPDATE", suspended, big)
            return await post(url(config), config.cert_dir / "ca.crt", review)

    assert asyncio.run(scenario())["response"]["allowed"] is True


def test_a_review_larger_than_the_api_server_can_send_is_refused_unread(tmp_path: Path) -> None:
    config = tls_config(tmp_path)
    huge = padded(VALID_MODES[1].manifest, MAX_REVIEW_BYTES // 1024 // 2 + 200)

    async def scenario() -> int:
        async with serving(config):
            context = ssl.create_default_context(cafile=str(config.cert_dir / "ca.crt"))
            review = admission_review("UPDATE", huge, huge)
            async with (
                aiohttp.ClientSession() as session,
                session.post(url(config), json=review, ssl=context) as resp,
            ):
                return resp.status

    assert asyncio.run(scenario()) == 413


def test_rotated_certificate_files_are_served_without_a_restart(tmp_path: Path) -> None:
    config = tls_config(tmp_path, check_seconds=0.2)
    new_ca = certs.generate_ca("rotated-ca")

    async def scenario() -> None:
        async with serving(config):
            old_ca = tmp_path / "old-ca.crt"
            old_ca.write_bytes((config.cert_dir / "ca.crt").read_bytes())
            review = admission_review("CREATE", VALID_MODES[0].manifest)
            await post(url(config), old_ca, review)
            certs.write_tls_dir(config.cert_dir, new_ca, certs.issue_serving_cert(new_ca, ["127.0.0.1"]))
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # the listener restarts within ~cert_check_seconds
                try:
                    await post(url(config), config.cert_dir / "ca.crt", review)
                    break
                except Exception:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            with pytest.raises(Exception, match="certificate verify failed"):
                await post(url(config), old_ca, review)

    asyncio.run(scenario())


def test_with_a_client_ca_only_a_caller_with_a_certificate_it_signed_is_answered(tmp_path: Path) -> None:
    """Issue 47 item 9: anyone who reached the port could make the webhook dry-run RayClusters
    under the operator's account. With `client_ca` (the CA of the API server's client certificate
    for webhooks) the TLS handshake itself refuses every other caller."""
    callers = pki.create(tmp_path / "callers")  # the API server's CA, and its client certificate
    api_server = pki.issue(callers, "apiserver-webhook-client", cn="kube-apiserver", usage=CLIENT_AUTH)
    strangers = pki.create(tmp_path / "strangers")
    stranger = pki.issue(strangers, "stranger", cn="kube-apiserver", usage=CLIENT_AUTH)
    config = dataclasses.replace(tls_config(tmp_path), client_ca=callers.ca_crt)
    review = admission_review("CREATE", VALID_MODES[0].manifest)

    async def answer(client: tuple[Path, Path] | None) -> str:
        context = ssl.create_default_context(cafile=str(config.cert_dir / "ca.crt"))
        if client is not None:
            context.load_cert_chain(*client)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(url(config), json=review, ssl=context) as resp,
            ):
                return "allowed" if (await resp.json())["response"]["allowed"] else "denied"
        except aiohttp.ClientError:
            return "refused"

    async def scenario() -> list[str]:
        async with serving(config):
            return [await answer(client) for client in (None, stranger, api_server)]

    assert asyncio.run(scenario()) == ["refused", "refused", "allowed"]


def test_a_client_ca_that_is_not_there_fails_at_startup_with_the_fix(tmp_path: Path) -> None:
    config = dataclasses.replace(tls_config(tmp_path), client_ca=tmp_path / "missing-ca.crt")
    with pytest.raises(WebhookConfigError, match=r"ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE=.*: no such file"):
        configure_admission(kopf.OperatorSettings(), config)


def test_missing_certificate_files_fail_at_startup_with_the_fix(tmp_path: Path) -> None:
    settings = kopf.OperatorSettings()
    with pytest.raises(WebhookConfigError, match=r"Mount a kubernetes\.io/tls Secret"):
        configure_admission(settings, WebhookConfig(cert_dir=tmp_path / "nothing"))


def test_self_signed_mode_serves_tls_for_local_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its throwaway folder, removed with tmp_path
    settings = kopf.OperatorSettings()
    config = configure_admission(
        settings, WebhookConfig(addr="127.0.0.1", port=free_port(), self_signed=True)
    )
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    assert server.certfile is not None
    ssl.create_default_context().load_cert_chain(server.certfile, server.pkeyfile)
    assert config.port == server.port


def test_the_chart_owns_the_webhook_configuration(tmp_path: Path) -> None:
    settings = kopf.OperatorSettings()
    settings.admission.managed = "left-over.example.com"
    configure_admission(settings, tls_config(tmp_path))
    assert settings.admission.managed is None


def test_config_from_environment_and_defaults() -> None:
    assert WebhookConfig.from_env({}) == WebhookConfig(
        addr="0.0.0.0", port=DEFAULT_PORT, cert_dir=DEFAULT_CERT_DIR
    )
    env = {
        "ASYNCGRPO_WEBHOOK_ADDR": "127.0.0.1",
        "ASYNCGRPO_WEBHOOK_PORT": "19443",
        "ASYNCGRPO_WEBHOOK_CERT_DIR": "/tmp/tls",
        "ASYNCGRPO_WEBHOOK_CERT_CHECK_SECONDS": "5",
        "ASYNCGRPO_WEBHOOK_SELF_SIGNED": "true",
        "ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE": "/etc/client-ca/ca.crt",
    }
    assert WebhookConfig.from_env(env) == WebhookConfig(
        "127.0.0.1", 19443, Path("/tmp/tls"), 5.0, True, Path("/etc/client-ca/ca.crt")
    )
