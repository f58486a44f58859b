"""Admission rules of spec.storage.objectStore: TLS settings that fit the endpoint's scheme, and
the credential variables the operator sets left to it.

Why apart from rules.py: one concept (the object store's settings), and rules.py is long already.
"""

from __future__ import annotations

from collections.abc import Iterator

from asyncgrpo_api.object_store_env import CREDENTIAL_ENV
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob

STORE = "spec.storage.objectStore"


def object_store_problems(job: AsyncGRPOJob) -> Iterator[tuple[str, str]]:
    """Errors: TLS options on an http endpoint, a CA bundle together with insecureSkipVerify, and
    spec.env or spec.secrets setting a variable the object store's credentials are rendered as;
    each as (field path, message)."""
    store = job.spec.storage.object_store
    if store is None:
        return
    tls = store.tls
    if store.endpoint.startswith("http://") and (tls.ca_config_map is not None or tls.insecure_skip_verify):
        yield (
            f"{STORE}.tls",
            f"is set but the endpoint {store.endpoint} is plain http: use an https:// endpoint, or drop tls",
        )
    if tls.ca_config_map is not None and tls.insecure_skip_verify:
        yield (
            f"{STORE}.tls.insecureSkipVerify",
            "is true together with caConfigMap: set one (caConfigMap verifies against your CA; "
            "insecureSkipVerify verifies nothing)",
        )
    for i, var in enumerate(job.spec.env):
        if var.name in CREDENTIAL_ENV:
            yield (
                f"spec.env[{i}].name",
                f"{var.name} is set by the operator from {STORE}.credentials; remove it from spec.env",
            )
    for i, secret in enumerate(job.spec.secrets):
        for k, ref in enumerate(secret.keys):
            if ref.env in CREDENTIAL_ENV:
                yield (
                    f"spec.secrets[{i}].keys[{k}].env",
                    f"{ref.env} is set by the operator from {STORE}.credentials; name the Secret in "
                    f"{STORE}.credentials.secretName instead",
                )
