"""Who may read /metrics: the bearer token's owner, if RBAC lets them `get` the URL /metrics.

The same check as kube-rbac-proxy and controller-runtime's WithAuthenticationAndAuthorization
filter, so a Prometheus set up for those works unchanged: the token is sent to the API server in
a TokenReview (who is this?), then the identity in a SubjectAccessReview for the non-resource URL
/metrics, verb get (may they?). Without it the figures (job names' phases, the API server's error
codes, how busy the operator is) are readable by every pod that can reach the port.

Answers are cached briefly, with controller-runtime's lifetimes (a token's review a minute, an
allowed access five minutes, a refused one 30 s), so a scrape every 15 s costs the API server two
reviews a few times an hour. The cache keeps a digest of the token, never the token, and is
bounded, so a caller sending a new token every request costs memory for at most MAX_ENTRIES. A
review the API server does not answer is not cached: the scrape fails (500) and the next one asks
again.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

METRICS_PATH = "/metrics"
TOKEN_TTL_SECONDS = 60.0
ALLOWED_TTL_SECONDS = 300.0
DENIED_TTL_SECONDS = 30.0
MAX_ENTRIES = 1024

Verdict = Literal["allowed", "unauthenticated", "forbidden"]
"""allowed: serve; unauthenticated: 401 (no token, or the API server does not know it);
forbidden: 403 (a known identity RBAC does not let get /metrics)."""


@dataclass(frozen=True)
class Identity:
    """Who a token belongs to, as the TokenReview says: what the SubjectAccessReview asks about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class Reviews(Protocol):
    """The two API calls (k8s.Api implements them)."""

    async def review_token(self, token: str) -> Identity | None:
        """The token's identity, or None when the API server does not authenticate it."""
        ...

    async def review_access(self, identity: Identity, path: str, verb: str) -> bool:
        """Whether RBAC (or the cluster's authorizer) lets `identity` `verb` the URL `path`."""
        ...


K = TypeVar("K")
V = TypeVar("V")


@dataclass
class ExpiringCache(Generic[K, V]):
    """At most `max_entries` values, each until its own deadline; the oldest written goes first."""

    max_entries: int = MAX_ENTRIES
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[K, tuple[float, V]] = field(default_factory=OrderedDict)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        deadline, value = entry
        if self.clock() >= deadline:
            del self._entries[key]
            return None
        return value

    def put(self, key: K, value: V, ttl: float) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self.clock() + ttl, value)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class TokenOutcome:
    """A token's review as cached: its identity, or None when the API server did not know it."""

    identity: Identity | None


@dataclass
class MetricsAccess:
    """Decides one scrape from its Authorization header."""

    reviews: Reviews
    clock: Callable[[], float] = time.monotonic
    identities: ExpiringCache[str, TokenOutcome] = field(init=False)
    decisions: ExpiringCache[Identity, bool] = field(init=False)

    def __post_init__(self) -> None:
        self.identities = ExpiringCache(clock=self.clock)
        self.decisions = ExpiringCache(clock=self.clock)

    async def check(self, authorization: str | None) -> Verdict:
        """Raises what the reviews raise (the API server did not answer): nothing is cached then."""
        token = bearer_token(authorization)
        if token is None:
            return "unauthenticated"
        identity = await self._identity(token)
        if identity is None:
            return "unauthenticated"
        allowed = self.decisions.get(identity)
        if allowed is None:
            allowed = await self.reviews.review_access(identity, METRICS_PATH, "get")
            self.decisions.put(identity, allowed, ALLOWED_TTL_SECONDS if allowed else DENIED_TTL_SECONDS)
        return "allowed" if allowed else "forbidden"

    async def _identity(self, token: str) -> Identity | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        outcome = self.identities.get(key)
        if outcome is None:
            outcome = TokenOutcome(await self.reviews.review_token(token))
            self.identities.put(key, outcome, TOKEN_TTL_SECONDS)
        return outcome.identity


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>` (the scheme in any case), else None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def identity_from_review(status: Mapping[str, object]) -> Identity | None:
    """The identity in a TokenReview's status, or None when it is not authenticated."""
    if status.get("authenticated") is not True:
        return None
    user = status.get("user")
    user = user if isinstance(user, Mapping) else {}
    extra = user.get("extra")
    extra = extra if isinstance(extra, Mapping) else {}
    return Identity(
        username=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(str(v) for v in values or ())) for k, values in extra.items())),
    )
