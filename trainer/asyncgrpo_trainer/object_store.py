"""The trainer's client of spec.storage.objectStore: one bucket, every key under the job's root.

The job's root is `<prefix>/<namespace>/<job name>/`, so jobs sharing a bucket and prefix never
share keys. The key pair comes from the environment the operator renders from the Secret
(`asyncgrpo_api.object_store_env`), never from the spec. Requests are retried by botocore
(standard mode, a few attempts); what still fails raises here and the caller decides (the
checkpoint mirror retries later; resume and the start-up check fail the attempt).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from asyncgrpo_api.object_store_env import ACCESS_KEY_ENV, CA_BUNDLE_ENV, SECRET_KEY_ENV
from asyncgrpo_api.object_store_keys import job_root
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob

TRANSFER = TransferConfig(multipart_threshold=64 * 2**20, multipart_chunksize=64 * 2**20, max_concurrency=4)
"""Multipart above 64 MiB: a lost connection costs one part, not a multi-gigabyte file."""
_REFUSED_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket", "403", "404"}
)
TransientError = (BotoCoreError, ClientError, S3UploadFailedError, OSError)
"""What a request may raise when the server is away, busy or refuses it (the mirror retries these).
`upload_file` reports a refused upload (AccessDenied from a bucket over its quota, say) as boto3's
S3UploadFailedError, not as the ClientError behind it."""


class ObjectStoreRefusedError(RuntimeError):
    """The store refused the credentials or has no such bucket: the same spec would fail again,
    so the driver exits with `exitcodes.OBJECT_STORE_REFUSED` (the job fails, never retried)."""


class MissingObjectError(FileNotFoundError):
    """A key that was listed is gone (deleted by retention between the listing and the read)."""


@dataclass(frozen=True)
class StoreConfig:
    """Where the job's keys live, and how to reach them."""

    endpoint: str
    bucket: str
    root: str
    region: str
    verify: bool | str
    """False (insecureSkipVerify), True (the system CAs), or a CA bundle's path (AWS_CA_BUNDLE)."""


def config_of(job: AsyncGRPOJob) -> StoreConfig | None:
    """The store the job names, or None when it names none."""
    spec = job.spec.storage.object_store
    if spec is None:
        return None
    verify: bool | str = not spec.tls.insecure_skip_verify
    if verify and os.environ.get(CA_BUNDLE_ENV):
        verify = os.environ[CA_BUNDLE_ENV]
    return StoreConfig(
        endpoint=spec.endpoint.rstrip("/"),
        bucket=spec.bucket,
        root=job_root(spec.prefix, job.metadata.namespace or "default", job.metadata.name or "asyncgrpo"),
        region=spec.region,
        verify=verify,
    )


class Store:
    """The job's keys in the bucket, named relative to the job's root."""

    def __init__(self, config: StoreConfig, *, timeout_seconds: float = 30.0) -> None:
        self.config = config
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint,
            region_name=config.region,
            aws_access_key_id=os.environ.get(ACCESS_KEY_ENV),
            aws_secret_access_key=os.environ.get(SECRET_KEY_ENV),
            verify=config.verify,
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=min(timeout_seconds, 5.0),
                read_timeout=timeout_seconds,
                s3={"addressing_style": "path"},
            ),
        )

    def key(self, rel: str) -> str:
        return f"{self.config.root}/{rel}"

    def check(self) -> None:
        """Fail fast, with what to fix, when the credentials or the bucket are wrong."""
        try:
            self._client.head_bucket(Bucket=self.config.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _REFUSED_CODES:
                raise ObjectStoreRefusedError(
                    f"the object store {self.config.endpoint} refused bucket {self.config.bucket!r} "
                    f"({code}): check the Secret named in spec.storage.objectStore.credentials "
                    f"and that the bucket exists"
                ) from exc
            raise
        if not (os.environ.get(ACCESS_KEY_ENV) and os.environ.get(SECRET_KEY_ENV)):
            raise ObjectStoreRefusedError(
                f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} are not set: the operator sets them from the "
                f"Secret named in spec.storage.objectStore.credentials"
            )

    def upload_file(self, rel: str, path: Path) -> None:
        self._client.upload_file(str(path), self.config.bucket, self.key(rel), Config=TRANSFER)

    def put_bytes(self, rel: str, data: bytes, *, only_if_absent: bool = False) -> None:
        """Write `data`; with `only_if_absent` the server refuses to replace an existing key
        (If-None-Match: *), so nothing written under that key is ever overwritten."""
        extra = {"IfNoneMatch": "*"} if only_if_absent else {}
        self._client.put_object(Bucket=self.config.bucket, Key=self.key(rel), Body=data, **extra)

    def get_bytes(self, rel: str) -> bytes:
        try:
            body = self._client.get_object(Bucket=self.config.bucket, Key=self.key(rel))["Body"]
        except ClientError as exc:
            if _missing(exc):
                raise MissingObjectError(self.key(rel)) from exc
            raise
        data: bytes = body.read()
        return data

    def download_file(self, rel: str, path: Path) -> None:
        try:
            self._client.download_file(self.config.bucket, self.key(rel), str(path), Config=TRANSFER)
        except ClientError as exc:
            if _missing(exc):
                raise MissingObjectError(self.key(rel)) from exc
            raise

    def list_keys(self, rel_prefix: str) -> Iterator[str]:
        """Keys under `rel_prefix`, relative to the job's root."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=self.key(rel_prefix)
        )
        start = len(self.config.root) + 1
        for page in pages:
            for item in page.get("Contents", []):
                yield str(item["Key"])[start:]

    def delete(self, rels: list[str]) -> None:
        for i in range(0, len(rels), 1000):
            batch = [{"Key": self.key(rel)} for rel in rels[i : i + 1000]]
            self._client.delete_objects(Bucket=self.config.bucket, Delete={"Objects": batch, "Quiet": True})


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in {"NoSuchKey", "404"}
