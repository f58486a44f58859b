"""Faults against the real S3 server: the server killed mid-upload (training goes on, the upload is
retried, no partial checkpoint is ever resumed), the driver killed mid-upload (the next attempt
resumes the previous complete checkpoint) and a full bucket quota (uploads are refused until it is
raised, then the waiting checkpoint becomes durable). docs/reliability.md records these runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncgrpo_trainer import checkpoint, durable_checkpoints
from asyncgrpo_trainer.checkpoint_mirror import CheckpointMirror
from asyncgrpo_trainer.durable_layout import CheckpointId
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import store_config, with_object_store, write_checkpoint
from tests.objectstore.s3server import S3Server
from tests.trainer import jobs

BIG = 160 * 2**20
"""Weights large enough that the upload takes a while (three multipart parts)."""


def _wait_until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)


def _enforced(s3_server: S3Server, change: str) -> Callable[[], bool]:
    """A predicate: apply the quotas and say whether the bucket's state changed to `change`."""

    def check() -> bool:
        if change in s3_server.enforce_quotas():
            return True
        time.sleep(1.0)  # the bucket's size reaches the master with the next heartbeat
        return False

    return check


def _wait_for_path(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize("kill_after", [0.0, 0.5, 1.5], ids=["at-start", "early", "late"])
def test_a_server_killed_mid_upload_costs_a_retry_not_the_run_nor_a_torn_checkpoint(
    s3_server: S3Server, bucket: str, tmp_path: Path, kill_after: float
) -> None:
    store = Store(store_config(s3_server, bucket), timeout_seconds=5.0)
    local = tmp_path / "ckpt"
    write_checkpoint(local, 1, payload=os.urandom(BIG))
    mirror = CheckpointMirror(store, local, attempt=1, keep_last=2, log_files=dict, poll_seconds=0.05).start()
    try:
        _wait_for_path(local / ".upload-00000001")
        time.sleep(kill_after)
        s3_server.kill()
        started = time.monotonic()
        write_checkpoint(local, 2, payload=os.urandom(BIG))  # training goes on meanwhile
        assert time.monotonic() - started < 30.0
        deadline = time.monotonic() + 120
        while mirror.state.failures == 0:
            assert time.monotonic() < deadline, "the mirror never noticed the server was gone"
            time.sleep(0.1)
    finally:
        s3_server.start()
    state = mirror.close(deadline_seconds=180)

    assert state.failures >= 1 and state.durable_step == 2
    complete = durable_checkpoints.complete_checkpoints(store)
    assert max(complete) == CheckpointId(1, 2)
    restored = durable_checkpoints.restore_newest(store, tmp_path / "fresh")  # checks every sha256
    assert restored == CheckpointId(1, 2)
    policy = checkpoint.step_dir(tmp_path / "fresh", 2) / "policy.pt"
    assert policy.read_bytes() == (checkpoint.step_dir(local, 2) / "policy.pt").read_bytes()


def test_a_driver_killed_mid_upload_leaves_the_previous_complete_checkpoint_to_resume(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    manifest = jobs.manifest("sync", steps=1000, checkpoint_dir=str(tmp_path / "pod-1"), name="killed")
    job = tmp_path / "job-1.json"
    job.write_text(json.dumps(with_object_store(manifest, s3_server, bucket)))
    argv = [sys.executable, "-m", "tests.objectstore.racing_driver", "--job", str(job), "--attempt", "1"]
    argv += ["--steps", "2", "--every", "8", "--payload-mib", "160"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    store = Store(store_config(s3_server, bucket, root="tests/killed"))
    try:
        _wait_for_path(tmp_path / "pod-1" / ".upload-00000002", timeout=120)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert durable_checkpoints.complete_checkpoints(store) == [CheckpointId(1, 1)]

    restored = durable_checkpoints.restore_newest(store, tmp_path / "pod-2")

    assert restored == CheckpointId(1, 1)
    assert (
        (checkpoint.step_dir(tmp_path / "pod-2", 1) / "policy.pt")
        .read_bytes()
        .startswith(b"attempt 1 step 1")
    )


def test_a_full_bucket_quota_holds_durability_back_until_it_is_raised_and_never_leaves_a_torn_checkpoint(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """The bucket fills up (its quota set below what it holds: SeaweedFS turns it read-only) while
    the driver writes its next checkpoint: the upload is refused and retried, training is not held
    up, the store keeps only the complete first checkpoint; once the quota is raised the retry makes
    the second durable, whole."""
    store = Store(store_config(s3_server, bucket), timeout_seconds=5.0)
    local = tmp_path / "ckpt"
    write_checkpoint(local, 1, payload=os.urandom(4 * 2**20))
    mirror = CheckpointMirror(store, local, attempt=1, keep_last=5, log_files=dict, poll_seconds=0.05).start()
    try:
        _wait_until("step 1 durable", lambda: mirror.state.durable_step == 1)
        s3_server.set_quota(bucket, size_mb=1)
        _wait_until("the bucket read-only", _enforced(s3_server, f"changing bucket {bucket} to read only"))
        started = time.monotonic()
        second = os.urandom(4 * 2**20)
        write_checkpoint(local, 2, payload=second)  # training goes on meanwhile
        assert time.monotonic() - started < 30.0
        _wait_until("a refused upload", lambda: mirror.state.failures >= 1)
        assert mirror.state.durable_step == 1
        assert durable_checkpoints.complete_checkpoints(store) == [CheckpointId(1, 1)]

        s3_server.set_quota(bucket, size_mb=1024)
        _wait_until("the bucket writable", _enforced(s3_server, f"changing bucket {bucket} to writable"))
        _wait_until("step 2 durable", lambda: mirror.state.durable_step == 2, timeout=90.0)  # backoff <= 30 s
    finally:
        state = mirror.close(deadline_seconds=60)

    assert state.failures >= 1 and "AccessDenied" in state.last_error
    assert sorted(durable_checkpoints.complete_checkpoints(store)) == [CheckpointId(1, 1), CheckpointId(1, 2)]
    assert durable_checkpoints.restore_newest(store, tmp_path / "fresh") == CheckpointId(1, 2)
    assert (checkpoint.step_dir(tmp_path / "fresh", 2) / "policy.pt").read_bytes() == second
