"""spec.storage.objectStore at admission: what it accepts, and each refusal naming the field and
the fix; checkpoints in the store are durable, so the emptyDir warning no longer applies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncgrpo_api.rules import validate_manifest

from .conftest import BASE_JOB

STORE = "spec.storage.objectStore"


def _job(store: dict[str, Any], **spec: Any) -> dict[str, Any]:
    job = copy.deepcopy(BASE_JOB)
    base = {"endpoint": "https://s3.example.com", "bucket": "ckpts", "credentials": {"secretName": "s3"}}
    job["spec"]["storage"] = {"objectStore": {**base, **store}}
    job["spec"].update(spec)
    return job


def _messages(job: dict[str, Any]) -> list[str]:
    return [str(f) for f in validate_manifest(job).errors]


def test_a_store_with_an_endpoint_bucket_and_secret_is_accepted_without_the_durability_warning() -> None:
    report = validate_manifest(_job({"prefix": "team/runs", "tls": {"caConfigMap": "s3-ca"}}))

    assert report.ok, report.errors
    assert not [w for w in report.warnings if w.path == "spec.storage.checkpoints"]


@pytest.mark.parametrize(
    ("store", "spec", "path", "text"),
    [
        ({"endpoint": "http://s3", "tls": {"insecureSkipVerify": True}}, {}, f"{STORE}.tls", "plain http"),
        (
            {"tls": {"caConfigMap": "ca", "insecureSkipVerify": True}},
            {},
            f"{STORE}.tls.insecureSkipVerify",
            "set one",
        ),
        ({}, {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}, "spec.env[0].name", "remove it"),
        (
            {},
            {"secrets": [{"name": "other", "keys": [{"key": "k", "env": "AWS_ACCESS_KEY_ID"}]}]},
            "spec.secrets[0].keys[0].env",
            "credentials.secretName",
        ),
        ({"endpoint": "s3.example.com"}, {}, f"{STORE}.endpoint", ""),
        ({"endpoint": "https://s3.example.com/bucket"}, {}, f"{STORE}.endpoint", ""),
        ({"bucket": "Has_Capitals"}, {}, f"{STORE}.bucket", ""),
        ({"prefix": "/leading/slash"}, {}, f"{STORE}.prefix", ""),
        ({"credentials": {}}, {}, f"{STORE}.credentials.secretName", ""),
    ],
    ids=[
        "tls-on-http",
        "ca-and-insecure",
        "env-sets-a-credential",
        "secret-sets-a-credential",
        "endpoint-without-scheme",
        "endpoint-with-a-path",
        "bucket-not-dns",
        "prefix-leading-slash",
        "no-secret-name",
    ],
)
def test_a_store_setting_that_cannot_work_is_refused_naming_the_field(
    store: dict[str, Any], spec: dict[str, Any], path: str, text: str
) -> None:
    messages = _messages(_job(store, **spec))

    assert any(m.startswith(path) and text in m for m in messages), messages
