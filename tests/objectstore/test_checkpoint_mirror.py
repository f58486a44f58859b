"""The driver's background mirror against a real S3 server: each new local checkpoint becomes
durable without the training side waiting, keepLast holds in the store, and the logs follow."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncgrpo_api.object_store_keys import logs_prefix
from asyncgrpo_trainer import checkpoint, durable_checkpoints
from asyncgrpo_trainer.checkpoint_mirror import CheckpointMirror
from asyncgrpo_trainer.durable_layout import CheckpointId
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import write_checkpoint


def _wait(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_each_new_local_checkpoint_becomes_durable_in_the_background(store: Store, tmp_path: Path) -> None:
    local = tmp_path / "ckpt"
    log_file = tmp_path / "driver.log"
    log_file.write_text("step 1\n")
    durable: list[int] = []
    mirror = CheckpointMirror(
        store, local, attempt=1, keep_last=2, log_files=lambda: {"driver.log": log_file},
        log_interval_seconds=0.2, poll_seconds=0.1, on_durable=durable.append,
    ).start()  # fmt: skip
    try:
        for step in (1, 2, 3):
            started = time.monotonic()
            write_checkpoint(local, step, payload=bytes(8 * 2**20))  # 8 MiB of "weights"
            assert time.monotonic() - started < 5.0  # the writer never waits for the upload
            _wait(functools.partial(lambda s: mirror.state.durable_step == s, step))
        log_file.write_text("step 1\nstep 2\n")
    finally:
        state = mirror.close(deadline_seconds=30)

    assert durable == [1, 2, 3]
    assert state.durable_step == 3 and not state.fenced
    assert sorted(durable_checkpoints.complete_checkpoints(store)) == [CheckpointId(1, 2), CheckpointId(1, 3)]
    assert store.get_bytes(logs_prefix(1) + "driver.log") == b"step 1\nstep 2\n"
    assert not [p for p in local.iterdir() if p.name.startswith(".upload-")]


def test_a_durable_checkpoint_has_the_logs_up_to_it_in_the_store_before_the_log_interval(
    store: Store, tmp_path: Path
) -> None:
    """A driver killed right after a checkpoint became durable leaves its step records and log up
    to that checkpoint in the store, so the resumed attempt's curves and `asyncgrpo logs --attempt`
    have no gap, however long logUploadIntervalSeconds is."""
    local = tmp_path / "ckpt"
    log_file = tmp_path / "driver.log"
    mirror = CheckpointMirror(
        store, local, attempt=1, keep_last=2, log_files=lambda: {"driver.log": log_file},
        log_interval_seconds=3600, poll_seconds=0.1,
    ).start()  # fmt: skip
    try:
        for step in (1, 2):
            log_file.write_text("".join(f"trained step {s}\n" for s in range(1, step + 1)))
            write_checkpoint(local, step)
            _wait(functools.partial(lambda s: mirror.state.durable_step == s, step))
            assert store.get_bytes(logs_prefix(1) + "driver.log") == log_file.read_bytes()
    finally:
        mirror.close(deadline_seconds=30)


def test_a_checkpoint_pruned_locally_while_it_uploads_still_uploads_whole(
    store: Store, tmp_path: Path
) -> None:
    local = tmp_path / "ckpt"
    write_checkpoint(local, 1, payload=bytes(32 * 2**20))
    mirror = CheckpointMirror(store, local, attempt=1, keep_last=5, log_files=dict, poll_seconds=0.05).start()
    time.sleep(0.3)  # the upload of step 1 is under way
    shutil.rmtree(checkpoint.step_dir(local, 1))  # the controller's local retention removes it

    state = mirror.close(deadline_seconds=60)

    assert state.durable_step == 1
    assert durable_checkpoints.restore_newest(store, tmp_path / "fresh") == CheckpointId(1, 1)
    assert (checkpoint.step_dir(tmp_path / "fresh", 1) / "policy.pt").stat().st_size == 32 * 2**20


def test_an_error_no_one_expected_is_counted_and_retried_not_the_end_of_uploads(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mirror thread that died would leave training going on with nothing made durable."""
    real_upload = durable_checkpoints.upload
    calls: list[int] = []

    def upload_failing_once(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in some library")
        real_upload(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(durable_checkpoints, "upload", upload_failing_once)
    local = tmp_path / "ckpt"
    write_checkpoint(local, 1)
    mirror = CheckpointMirror(store, local, attempt=1, keep_last=2, log_files=dict, poll_seconds=0.05).start()
    try:
        _wait(lambda: mirror.state.durable_step == 1)  # after one backoff of 2 s
    finally:
        state = mirror.close(deadline_seconds=30)
    assert state.failures == 1 and "RuntimeError: a bug in some library" in state.last_error
    assert durable_checkpoints.complete_checkpoints(store) == [CheckpointId(1, 1)]
