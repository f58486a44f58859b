"""Each job's Ray token, derived from one key of the operator's.

The token is HMAC-SHA256(key, "<namespace>/<job>/<job UID>"): the operator writes it into the
job's Secret (manifests.ray_token_secret) before the job's first RayCluster and sends it with every
/progress read, and it never reads a Secret to know it. So:
- RBAC: the operator may create Secrets and read none (a reader of Secrets cluster-wide would hold
  every tenant's credentials).
- Memory: the key, nothing per job; a restarted operator, or the other replica taking the Lease
  over, derives the same tokens.
- Every job instance has its own token: the UID differs for a job deleted and created again under
  the same name, so a token read from one job is no key to its namesake.
The key is the chart's Secret, mounted into every replica (ASYNCGRPO_RAY_TOKEN_KEY_FILE). Without
one (an operator run outside the chart) a key is drawn at start, and the tokens of the jobs it
started are lost with the process: their drivers refuse its successor's reads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

KEY_FILE_ENV = "ASYNCGRPO_RAY_TOKEN_KEY_FILE"
MIN_KEY_BYTES = 32


def derive(key: bytes, namespace: str, job: str, uid: str) -> str:
    """The job's token: 43 URL-safe characters (256 bits)."""
    digest = hmac.new(key, f"{namespace}/{job}/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def load_key(path: str | None = None) -> bytes:
    """The key in the file `path` (default: $ASYNCGRPO_RAY_TOKEN_KEY_FILE), or a new random one
    when no file is named. A file named but missing, or shorter than MIN_KEY_BYTES, is an error:
    tokens derived from a guessable key would protect nothing."""
    path = path or os.environ.get(KEY_FILE_ENV)
    if not path:
        log.warning(
            "%s is not set: the Ray tokens of the jobs this operator starts cannot be derived again "
            "after it restarts (their /progress reads will be refused)",
            KEY_FILE_ENV,
        )
        return new_key()
    key = Path(path).read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{KEY_FILE_ENV}: {path} holds {len(key)} bytes; the key needs at least {MIN_KEY_BYTES}"
        )
    return key


def new_key() -> bytes:
    """A random key, for an operator run without the chart's."""
    return secrets.token_bytes(MIN_KEY_BYTES)
