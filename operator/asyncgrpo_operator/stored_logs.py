"""`asyncgrpo logs` once the pods are gone and the job names spec.storage.objectStore: the newest
attempt's driver log (or the one `--attempt N` names), read from the bucket the driver uploaded it to
(before each checkpoint, during the run and after its last line).

The key pair is the reader's own (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment,
AWS_CA_BUNDLE for a private CA), never read from the cluster: the CLI needs no access to Secrets.
boto3 comes with the trainer's extra (`pip install 'asyncgrpo[trainer]'` or `pip install boto3`).
"""

from __future__ import annotations

import re
from typing import Any

from asyncgrpo_api.object_store_keys import DRIVER_LOG, job_root
from asyncgrpo_api.v1alpha1.runtime import ObjectStoreSpec

_DRIVER_LOG_KEY = re.compile(rf"/logs/attempt-(\d+)/{re.escape(DRIVER_LOG)}$")


class StoredLogError(RuntimeError):
    """The log could not be read from the store (no boto3, refused, none uploaded)."""


def stored_driver_log(
    spec: ObjectStoreSpec, namespace: str, name: str, attempt: int | None = None
) -> tuple[int, bytes]:
    """(attempt, its driver log): that attempt's, or with None the newest attempt's that uploaded one."""
    try:
        import boto3  # noqa: PLC0415 (the operator's image has no boto3; only this command needs it)
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415
    except ImportError as exc:
        raise StoredLogError("reading logs from the object store needs boto3: pip install boto3") from exc
    client: Any = boto3.session.Session().client(
        "s3",
        endpoint_url=spec.endpoint,
        region_name=spec.region,
        verify=not spec.tls.insecure_skip_verify,
        config=boto3.session.Config(s3={"addressing_style": "path"}),
    )
    root = job_root(spec.prefix, namespace, name)
    where = f"s3://{spec.bucket}/{root}/logs/"
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=spec.bucket, Prefix=f"{root}/logs/")
        found = {
            int(m.group(1)): str(item["Key"])
            for page in pages
            for item in page.get("Contents", [])
            if (m := _DRIVER_LOG_KEY.search(str(item["Key"]))) is not None
        }
        if not found:
            raise StoredLogError(f"no driver log under {where} at {spec.endpoint}")
        if attempt is None:
            attempt = max(found)
        elif attempt not in found:
            stored = ", ".join(str(a) for a in sorted(found))
            raise StoredLogError(
                f"attempt {attempt} uploaded no driver log under {where}; the attempts stored: {stored}"
            )
        body: bytes = client.get_object(Bucket=spec.bucket, Key=found[attempt])["Body"].read()
    except (BotoCoreError, ClientError) as exc:
        raise StoredLogError(
            f"the object store {spec.endpoint} refused the read of {where}: {exc} "
            "(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to a key pair that may read the bucket)"
        ) from exc
    return attempt, body
