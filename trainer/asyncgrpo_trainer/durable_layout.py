"""Where durable checkpoints, fences and logs live in the object store, and the pure decisions on
them: which checkpoint a resume takes, which ones retention deletes.

Keys, relative to the job's root (`object_store.job_root`):

    fence/attempt-NNNNN                                   written when attempt N starts
    checkpoints/attempt-NNNNN/step-SSSSSSSS/<files>       the files of one checkpoint
    checkpoints/attempt-NNNNN/step-SSSSSSSS.manifest.json written last: the checkpoint counts
    logs/attempt-NNNNN/<driver.log, steps.jsonl, tensorboard/...>   (asyncgrpo_api.object_store_keys)

Why per attempt: an attempt writes only under its own number, so an old attempt that is still
alive (a pod the kubelet has not killed yet, a partitioned node) can never overwrite a newer
attempt's files, whatever it does; the fence stops it from writing manifests and deleting.
Why the manifest last, with every file's size and sha256: a checkpoint whose upload was cut off
has no manifest and is never resumed, and a resume checks each file it downloads against it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

CHECKPOINTS = "checkpoints/"
FENCES = "fence/"
MANIFEST_SUFFIX = ".manifest.json"
_MANIFEST_KEY = re.compile(r"^checkpoints/attempt-(\d+)/step-(\d+)\.manifest\.json$")
_FENCE_KEY = re.compile(r"^fence/attempt-(\d+)$")


@dataclass(frozen=True, order=True)
class CheckpointId:
    """One durable checkpoint. Ordered by attempt, then step: the newest attempt's line of
    checkpoints is the one a resume continues, even when a fenced older attempt got further."""

    attempt: int
    step: int


@dataclass(frozen=True)
class Entry:
    """One file of a checkpoint, relative to its step directory."""

    path: str
    size: int
    sha256: str


def fence_key(attempt: int) -> str:
    return f"{FENCES}attempt-{attempt:05d}"


def files_prefix(cid: CheckpointId) -> str:
    return f"{CHECKPOINTS}attempt-{cid.attempt:05d}/step-{cid.step:08d}/"


def manifest_key(cid: CheckpointId) -> str:
    return f"{CHECKPOINTS}attempt-{cid.attempt:05d}/step-{cid.step:08d}{MANIFEST_SUFFIX}"


def parse_manifest_key(rel: str) -> CheckpointId | None:
    match = _MANIFEST_KEY.match(rel)
    return CheckpointId(int(match.group(1)), int(match.group(2))) if match else None


def parse_fence_key(rel: str) -> int | None:
    match = _FENCE_KEY.match(rel)
    return int(match.group(1)) if match else None


def encode_manifest(cid: CheckpointId, entries: list[Entry]) -> bytes:
    files = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries]
    return json.dumps({"attempt": cid.attempt, "step": cid.step, "files": files}, indent=1).encode()


def decode_manifest(data: bytes) -> list[Entry]:
    doc = json.loads(data)
    return [Entry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in doc["files"]]


def newest_first(complete: list[CheckpointId]) -> list[CheckpointId]:
    """The order a resume tries checkpoints in (the next is tried when one turns out unreadable)."""
    return sorted(complete, reverse=True)


def retention(complete: list[CheckpointId], *, own_attempt: int, keep_last: int) -> list[CheckpointId]:
    """The complete checkpoints to delete: all but the newest `keep_last`, and only those of this
    attempt or older ones (a newer attempt's files are never touched)."""
    return [c for c in newest_first(complete)[keep_last:] if c.attempt <= own_attempt]


def is_abandoned(files_of: CheckpointId, complete: list[CheckpointId], own_attempt: int) -> bool:
    """Whether the files of a checkpoint without a manifest (an upload cut off) can go: they come
    before this attempt's newest complete checkpoint in resume order, so no resume would take them
    even if their manifest appeared (a fenced older attempt never writes one)."""
    mine = [c for c in complete if c.attempt == own_attempt]
    return files_of.attempt <= own_attempt and bool(mine) and files_of < max(mine)
