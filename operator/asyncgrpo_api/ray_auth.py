"""Ray's token authentication as every job runs with it: one definition for the operator (which
renders the RayCluster's `authOptions`, the job's token Secret and the driver's environment, and
sends the token when it reads /progress) and the trainer (whose /progress server asks for it).

Why: without it the head's dashboard (8265), GCS (6379) and Ray Client port (10001) run whatever
anyone who reaches them submits, in the job's pods, with their Secrets, ServiceAccount and volumes.
KubeRay's `authOptions: {mode: token, secretName}` puts RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (the
Secret's `auth_token`) on every Ray container; Ray then refuses a request without the token on
those ports. The driver's own server takes the same token, as `Authorization: Bearer <token>`, the
header Ray's dashboard takes too.
"""

from __future__ import annotations

from typing import Final

MODE_ENV: Final = "RAY_AUTH_MODE"
TOKEN_MODE: Final = "token"
TOKEN_ENV: Final = "RAY_AUTH_TOKEN"
SECRET_KEY: Final = "auth_token"
"""The key of the token in the job's Secret (the one KubeRay's `authOptions.secretName` names)."""
RESERVED_ENV: Final = frozenset({MODE_ENV, TOKEN_ENV, "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_K8S_TOKEN_AUTH"})
"""Variables that would turn Ray's token authentication off or replace the job's token: a job may
not set them (spec.env, spec.secrets' keys, a podTemplate's env)."""
MIN_RAY_VERSION: Final = (2, 52)
"""The first Ray with token authentication; KubeRay refuses `authOptions` for an older rayVersion."""
BEARER: Final = "Bearer "


def authorization(token: str) -> str:
    """The Authorization header's value that carries `token`."""
    return BEARER + token
