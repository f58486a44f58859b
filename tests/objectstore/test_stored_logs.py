"""`asyncgrpo logs` once the pods are gone: the newest attempt's driver log, or the one `--attempt`
names, read from a real S3 server with the reader's own key pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncgrpo_api.object_store_keys import logs_prefix
from asyncgrpo_api.v1alpha1.runtime import ObjectStoreSpec
from asyncgrpo_operator.stored_logs import StoredLogError, stored_driver_log
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import store_config
from tests.objectstore.s3server import S3Server


def _spec(server: S3Server, bucket: str) -> ObjectStoreSpec:
    return ObjectStoreSpec.model_validate(
        {"endpoint": server.endpoint, "bucket": bucket, "prefix": "runs", "credentials": {"secretName": "s3"}}
    )


def test_the_newest_attempts_driver_log_is_read_from_the_store(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    store = Store(store_config(s3_server, bucket, root="runs/rl/demo"))
    for attempt in (1, 2):
        log = tmp_path / f"driver-{attempt}.log"
        log.write_text(f"attempt {attempt} trained\n")
        store.upload_file(logs_prefix(attempt) + "driver.log", log)

    assert stored_driver_log(_spec(s3_server, bucket), "rl", "demo") == (2, b"attempt 2 trained\n")
    assert stored_driver_log(_spec(s3_server, bucket), "rl", "demo", 1) == (1, b"attempt 1 trained\n")
    with pytest.raises(
        StoredLogError, match=r"attempt 3 uploaded no driver log .*; the attempts stored: 1, 2"
    ):
        stored_driver_log(_spec(s3_server, bucket), "rl", "demo", 3)


def test_a_job_that_uploaded_no_log_says_where_it_looked(s3_server: S3Server, bucket: str) -> None:
    with pytest.raises(StoredLogError, match=f"s3://{bucket}/runs/rl/other/logs/"):
        stored_driver_log(_spec(s3_server, bucket), "rl", "other")


def test_a_reader_without_a_valid_key_pair_is_told_what_to_set(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")

    with pytest.raises(StoredLogError, match="AWS_ACCESS_KEY_ID"):
        stored_driver_log(_spec(s3_server, bucket), "rl", "demo")
