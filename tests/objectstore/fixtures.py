"""pytest plugin (registered in tests/conftest.py, so tests/trainer's driver runs use it too): one
real S3 server per session (s3server.py), a fresh bucket per test, and the key pair in the
environment as the operator renders it from the job's Secret. boto3 and the trainer are imported
inside the fixtures, so sessions that never use them do not pay for the import."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.objectstore.s3server import ACCESS_KEY, SECRET_KEY, S3Server

if TYPE_CHECKING:
    from asyncgrpo_trainer.object_store import Store


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)


@pytest.fixture
def bucket(s3_server: S3Server, s3_env: None) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def store(s3_server: S3Server, bucket: str) -> Store:
    from asyncgrpo_trainer.object_store import Store  # noqa: PLC0415 (boto3: only when used)
    from tests.objectstore.helpers import store_config  # noqa: PLC0415 (torch: only when used)

    return Store(store_config(s3_server, bucket))
