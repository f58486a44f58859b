"""What the object-store tests share: a store's settings for the test server, a local checkpoint
written the way the controller writes one, and a job manifest that names the test bucket."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.object_store import StoreConfig
from tests.objectstore.s3server import S3Server


def store_config(server: S3Server, bucket: str, root: str = "ns/job") -> StoreConfig:
    return StoreConfig(endpoint=server.endpoint, bucket=bucket, root=root, region="us-east-1", verify=True)


def write_checkpoint(root: Path, step: int, payload: bytes = b"") -> Path:
    """A complete local checkpoint directory as `checkpoint.commit` leaves it (a policy file,
    state.pt and meta.json), with `payload` bytes of weights."""
    tmp = checkpoint.begin(root, step)
    (tmp / "policy.pt").write_bytes(payload or f"weights of step {step}".encode() * 1000)
    return checkpoint.commit(tmp, step, {"step": step}, keep_last=100)


def with_object_store(
    manifest: dict[str, Any], server: S3Server, bucket: str, **store: Any
) -> dict[str, Any]:
    """`manifest` with spec.storage.objectStore naming the test server and `bucket`."""
    job = copy.deepcopy(manifest)
    job["metadata"].setdefault("namespace", "tests")
    spec = {"endpoint": server.endpoint, "bucket": bucket, "credentials": {"secretName": "s3"}, **store}
    job["spec"].setdefault("storage", {})["objectStore"] = spec
    return job
