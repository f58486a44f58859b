"""Checkpoints in a real S3 server: a checkpoint counts only once its manifest is written, a resume
restores the newest complete one byte for byte (checking every file), and keepLast deletes old
ones only after a newer one is complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncgrpo_trainer import checkpoint, durable_checkpoints
from asyncgrpo_trainer.durable_layout import CheckpointId, files_prefix
from asyncgrpo_trainer.object_store import ObjectStoreRefusedError, Store
from tests.objectstore.helpers import store_config, write_checkpoint
from tests.objectstore.s3server import S3Server


def _files(step_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(step_dir).as_posix(): p.read_bytes() for p in step_dir.rglob("*") if p.is_file()}


def test_a_resume_restores_the_newest_complete_checkpoint_byte_for_byte(store: Store, tmp_path: Path) -> None:
    for step in (10, 20):
        written = write_checkpoint(tmp_path / "run", step)
        durable_checkpoints.upload(store, written, CheckpointId(1, step))

    restored = durable_checkpoints.restore_newest(store, tmp_path / "fresh")

    assert restored == CheckpointId(1, 20)
    assert checkpoint.latest(tmp_path / "fresh") == 20
    assert _files(checkpoint.step_dir(tmp_path / "fresh", 20)) == _files(
        checkpoint.step_dir(tmp_path / "run", 20)
    )
    assert checkpoint.load(tmp_path / "fresh", 20)["step"] == 20


def test_an_upload_cut_off_before_its_manifest_is_never_resumed(store: Store, tmp_path: Path) -> None:
    durable_checkpoints.upload(store, write_checkpoint(tmp_path / "run", 10), CheckpointId(1, 10))
    cut = write_checkpoint(tmp_path / "run", 20)
    for path in sorted(cut.iterdir()):  # every file of step 20, but no manifest: the driver died
        store.upload_file(files_prefix(CheckpointId(1, 20)) + path.name, path)

    restored = durable_checkpoints.restore_newest(store, tmp_path / "fresh")

    assert restored == CheckpointId(1, 10)
    assert checkpoint.list_steps(tmp_path / "fresh") == [10]


def test_a_file_that_fails_its_checksum_is_refused_for_the_next_newest(store: Store, tmp_path: Path) -> None:
    for step in (10, 20):
        durable_checkpoints.upload(store, write_checkpoint(tmp_path / "run", step), CheckpointId(1, step))
    forged = tmp_path / "forged.pt"
    forged.write_bytes(b"not the weights the manifest names")
    store.upload_file(files_prefix(CheckpointId(1, 20)) + "policy.pt", forged)

    restored = durable_checkpoints.restore_newest(store, tmp_path / "fresh")

    assert restored == CheckpointId(1, 10)
    assert checkpoint.list_steps(tmp_path / "fresh") == [10]
    assert not [p for p in (tmp_path / "fresh").iterdir() if p.name.startswith(".tmp-")]


def test_keep_last_deletes_old_checkpoints_only_once_a_newer_one_is_complete(
    store: Store, tmp_path: Path
) -> None:
    for step in (1, 2):
        durable_checkpoints.upload(store, write_checkpoint(tmp_path / "run", step), CheckpointId(1, step))
    cut = write_checkpoint(tmp_path / "run", 3)
    store.upload_file(files_prefix(CheckpointId(1, 3)) + "policy.pt", cut / "policy.pt")

    durable_checkpoints.prune(store, own_attempt=1, keep_last=2)
    assert sorted(durable_checkpoints.complete_checkpoints(store)) == [CheckpointId(1, 1), CheckpointId(1, 2)]

    durable_checkpoints.upload(store, cut, CheckpointId(1, 3))
    durable_checkpoints.prune(store, own_attempt=1, keep_last=2)
    assert sorted(durable_checkpoints.complete_checkpoints(store)) == [CheckpointId(1, 2), CheckpointId(1, 3)]
    assert not list(store.list_keys(files_prefix(CheckpointId(1, 1))))


def test_a_local_checkpoint_at_or_past_the_durable_one_is_kept(store: Store, tmp_path: Path) -> None:
    durable_checkpoints.upload(store, write_checkpoint(tmp_path / "run", 10), CheckpointId(1, 10))
    write_checkpoint(tmp_path / "run", 12)

    assert durable_checkpoints.restore_newest(store, tmp_path / "run") is None
    assert checkpoint.latest(tmp_path / "run") == 12


def test_wrong_credentials_are_refused_with_what_to_fix(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")

    with pytest.raises(ObjectStoreRefusedError, match="credentials"):
        Store(store_config(s3_server, bucket)).check()


def test_a_missing_bucket_is_refused_with_what_to_fix(s3_server: S3Server, s3_env: None) -> None:
    with pytest.raises(ObjectStoreRefusedError, match="bucket"):
        Store(store_config(s3_server, "no-such-bucket")).check()
