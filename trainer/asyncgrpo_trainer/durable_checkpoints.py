"""Checkpoints in the object store: upload one (files, then the manifest), restore the newest
complete one into the local checkpoint directory, and apply retention; all fenced by attempt.

The layout and the decisions are in `durable_layout`; this module does the I/O. A resume does not
change: `restore_newest` leaves a complete `step-NNNNNNNN` directory where `checkpoint.latest`
finds it, made the same way a local checkpoint is (a temporary directory renamed into place).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.durable_layout import (
    CHECKPOINTS,
    FENCES,
    MANIFEST_SUFFIX,
    CheckpointId,
    Entry,
    decode_manifest,
    encode_manifest,
    fence_key,
    files_prefix,
    is_abandoned,
    manifest_key,
    newest_first,
    parse_fence_key,
    parse_manifest_key,
    retention,
)
from asyncgrpo_trainer.object_store import MissingObjectError, Store

log = logging.getLogger(__name__)


class FencedError(RuntimeError):
    """A newer attempt has started: this one must neither complete a checkpoint nor delete one."""


class CorruptCheckpointError(RuntimeError):
    """A downloaded file does not match the manifest's size or sha256."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(4 * 2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def register_attempt(store: Store, attempt: int) -> None:
    """Raise the fence: from now on older attempts stop writing manifests and deleting."""
    store.put_bytes(fence_key(attempt), b"")


def newest_attempt(store: Store) -> int | None:
    attempts = [a for a in (parse_fence_key(k) for k in store.list_keys(FENCES)) if a is not None]
    return max(attempts) if attempts else None


def check_fence(store: Store, attempt: int) -> None:
    newest = newest_attempt(store)
    if newest is not None and newest > attempt:
        raise FencedError(f"attempt {newest} has started; attempt {attempt} stops writing to the store")


def complete_checkpoints(store: Store) -> list[CheckpointId]:
    found = (parse_manifest_key(k) for k in store.list_keys(CHECKPOINTS) if k.endswith(MANIFEST_SUFFIX))
    return [c for c in found if c is not None]


def upload(store: Store, step_dir: Path, cid: CheckpointId) -> list[Entry]:
    """Upload every file of `step_dir`, then (unless fenced) the manifest naming them: the
    checkpoint counts from that last write on. The manifest is written only if absent, so a
    complete checkpoint is never replaced."""
    entries = []
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(step_dir).as_posix()
        entries.append(Entry(rel, path.stat().st_size, sha256_of(path)))
        store.upload_file(files_prefix(cid) + rel, path)
    check_fence(store, cid.attempt)
    store.put_bytes(manifest_key(cid), encode_manifest(cid, entries), only_if_absent=True)
    return entries


def prune(store: Store, *, own_attempt: int, keep_last: int) -> list[CheckpointId]:
    """Delete the checkpoints retention lets go (manifest first, so a half-deleted one no longer
    counts) and the files of cut-off uploads; returns the deleted checkpoints. Fenced: raises
    before deleting anything once a newer attempt has started."""
    complete = complete_checkpoints(store)
    doomed = retention(complete, own_attempt=own_attempt, keep_last=keep_last)
    check_fence(store, own_attempt)
    for cid in doomed:
        store.delete([manifest_key(cid)])
        store.delete(list(store.list_keys(files_prefix(cid))))
    kept = [c for c in complete if c not in doomed]
    orphans = []
    for rel in store.list_keys(CHECKPOINTS):
        owner = _files_owner(rel)
        if (
            owner is not None
            and owner not in kept
            and owner not in doomed
            and is_abandoned(owner, kept, own_attempt)
        ):
            orphans.append(rel)
    store.delete(orphans)
    return doomed


def _files_owner(rel: str) -> CheckpointId | None:
    """The checkpoint a file key belongs to (None for manifests and foreign keys)."""
    parts = rel.split("/")
    if len(parts) < 4 or not parts[1].startswith("attempt-") or not parts[2].startswith("step-"):
        return None
    try:
        return CheckpointId(int(parts[1][len("attempt-") :]), int(parts[2][len("step-") :]))
    except ValueError:
        return None


def restore_newest(store: Store, local_root: Path) -> CheckpointId | None:
    """Download the newest complete checkpoint into `local_root/step-NNNNNNNN`, each file checked
    against the manifest; a checkpoint that turns out unreadable (deleted meanwhile, corrupt) is
    skipped for the next newest. None when there is none. A local checkpoint at or beyond the
    durable one's step (a volume that kept it) is left to `checkpoint.latest` to pick."""
    local = checkpoint.latest(local_root)
    for cid in newest_first(complete_checkpoints(store)):
        if local is not None and local >= cid.step:
            log.info("the local checkpoint of step %d is at or past the durable one (%s)", local, cid)
            return None
        try:
            _download(store, cid, local_root)
        except (MissingObjectError, CorruptCheckpointError) as exc:
            log.warning("skipping the durable checkpoint %s: %s", cid, exc)
            continue
        log.info("restored the durable checkpoint of step %d (attempt %d)", cid.step, cid.attempt)
        return cid
    return None


def _download(store: Store, cid: CheckpointId, local_root: Path) -> None:
    entries = decode_manifest(store.get_bytes(manifest_key(cid)))
    local_root.mkdir(parents=True, exist_ok=True)
    tmp = local_root / f".tmp-restore-{uuid.uuid4().hex[:8]}"
    try:
        for entry in entries:
            target = tmp / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            store.download_file(files_prefix(cid) + entry.path, target)
            if target.stat().st_size != entry.size or sha256_of(target) != entry.sha256:
                raise CorruptCheckpointError(f"{entry.path} does not match the manifest's size and sha256")
        final = checkpoint.step_dir(local_root, cid.step)
        if final.exists():
            os.replace(final, local_root / f".tmp-replaced-{uuid.uuid4().hex[:8]}")
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
