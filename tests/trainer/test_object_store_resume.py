"""A real run whose checkpoints and logs go to a real S3 server (SeaweedFS): its pod's volume is
lost, and the next attempt resumes from the object store, with the logs of both attempts there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asyncgrpo_api.object_store_keys import logs_prefix
from asyncgrpo_trainer import driver, durable_checkpoints
from asyncgrpo_trainer.durable_layout import CheckpointId
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import store_config, with_object_store
from tests.objectstore.s3server import S3Server
from tests.trainer import jobs

pytestmark = pytest.mark.trainer


def test_a_run_whose_volume_is_lost_resumes_from_the_object_store(
    ray_address: str, s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "pod-volume"
    first = jobs.manifest("sync", steps=2, checkpoint_dir=str(local), name="durable")
    first["spec"]["checkpoint"]["everySteps"] = 1
    first = with_object_store(first, s3_server, bucket, prefix="runs")
    store = Store(store_config(s3_server, bucket, root="runs/tests/durable"))

    monkeypatch.setenv("ASYNCGRPO_ATTEMPT", "1")
    assert driver.execute(first)["steps"] == 2
    shutil.rmtree(local)  # the pod and its emptyDir are gone

    second = json.loads(json.dumps(first))
    second["spec"]["trainer"]["grpo"]["maxNumSteps"] = 3
    monkeypatch.setenv("ASYNCGRPO_ATTEMPT", "2")
    summary = driver.execute(second)

    assert summary["steps"] == 3
    assert summary["counters"]["samples_trained"] > 0
    uploaded = store.get_bytes(logs_prefix(2) + "steps.jsonl").decode()
    trained = [r["step"] for r in map(json.loads, uploaded.splitlines()) if r["event"] == "step"]
    assert trained == [3]  # the second attempt trained only the step after the durable checkpoint
    complete = durable_checkpoints.complete_checkpoints(store)
    assert max(complete) == CheckpointId(2, 3)
    assert CheckpointId(1, 2) in complete  # keepLast 2: attempt 1's last stays beside attempt 2's
    assert any(k.startswith(logs_prefix(1) + "tensorboard/") for k in store.list_keys(logs_prefix(1)))
