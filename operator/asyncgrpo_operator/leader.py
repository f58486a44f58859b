"""Leader election on a coordination.k8s.io Lease, for running more than one operator replica.

Only the holder of the Lease runs reconcile passes; the other replicas keep watching (their queues
stay warm) and keep serving the admission webhook. The semantics are client-go's
(k8s.io/client-go/tools/leaderelection), with its defaults for controllers:

- leaseDuration 15 s: a standby takes over once the Lease's record has not changed for this long.
  "Not changed" is measured with the standby's own monotonic clock from the moment it saw the
  record change, never by comparing the leader's renewTime with the local wall clock, so clocks
  that disagree across machines cannot make a live leader look expired (or a dead one alive).
- renewDeadline 10 s: a leader that has not renewed for this long stops acting at once, even
  while a renewal request still hangs, and so always before a standby can take over.
- retryPeriod 2 s: how often every replica tries to acquire or renew.
- Release on shutdown: a leader that stops clears the holder (and sets leaseDurationSeconds 1),
  so a standby takes over within one retryPeriod instead of one leaseDuration.

The reconcile itself stays safe without it (deterministic names, UID preconditions, optimistic
status writes); the Lease avoids duplicate work and duplicate events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from asyncgrpo_operator import k8s, naming

log = logging.getLogger(__name__)

LEASE_NAME = "asyncgrpo-operator"


@dataclass(frozen=True)
class Timing:
    """The three durations of client-go's LeaderElectionConfig, in seconds."""

    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renewDeadline < leaseDuration; got "
                f"{self.retry_seconds}, {self.renew_deadline_seconds}, {self.lease_seconds}"
            )


class LeaseElector:
    """Acquires and renews a Lease; `is_leader` says whether this replica may act right now."""

    def __init__(
        self,
        api: k8s.Api,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.timing = timing or Timing()
        self.clock = clock
        self._observed: dict[str, Any] | None = None
        """The Lease spec as last seen (client-go's observedRecord)."""
        self._observed_at = 0.0
        """Local monotonic time at which `_observed` was first seen (client-go's observedTime)."""
        self._leading = False
        self._renewed_at = float("-inf")

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the Lease and renewed it within the renew deadline."""
        return self._leading and self.clock() - self._renewed_at < self.timing.renew_deadline_seconds

    async def run(self) -> None:
        """Try to acquire or renew every retryPeriod, until cancelled."""
        while True:
            await self.step()
            await asyncio.sleep(self.timing.retry_seconds)

    async def step(self) -> bool:
        """One round: try to acquire or renew (bounded by the renew deadline); whether it leads now."""
        try:
            renewed = await asyncio.wait_for(
                self.try_acquire_or_renew(), timeout=self.timing.renew_deadline_seconds
            )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure is a round without a renewal; the loop must go on
            log.warning("leader election round failed", extra={"error": str(err) or type(err).__name__})
            renewed = False
        was = self._leading
        if renewed:
            self._leading, self._renewed_at = True, self.clock()
        elif self._leading and not self.is_leader:
            self._leading = False  # could not renew within the deadline: stop acting
        if was != self._leading:
            log.info("leadership changed", extra={"leader": self._leading, "identity": self.identity})
        return self.is_leader

    async def try_acquire_or_renew(self) -> bool:
        """client-go's tryAcquireOrRenew: True when this replica holds the Lease afterwards."""
        lease = await self.api.get_lease(self.namespace, self.name)
        now = self.clock()
        if lease is None:
            first = self._lease(None, {}, acquired=True)
            created = await self.api.create_lease(self.namespace, first)
            if created:
                self._observe(first["spec"], now)
            return created
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        if spec != self._observed:
            self._observe(spec, now)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_seconds)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # held by another replica, and its record changed within the duration
        body = self._lease(lease, spec, acquired=holder != self.identity)
        try:
            await self.api.replace_lease(self.namespace, self.name, body)
        except k8s.ApiError as err:
            if err.status == 409:  # another replica renewed or took it first
                return False
            raise
        self._observe(body["spec"], self.clock())
        return True

    async def release(self) -> None:
        """Give the Lease up if this replica holds it: a standby takes over at its next retry.

        Call after this replica has stopped acting (the controller is stopped)."""
        if not self._leading:
            return
        self._leading = False
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            body = self._lease(lease, spec, acquired=False)
            body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            await self.api.replace_lease(self.namespace, self.name, body)
            log.info("released the lease", extra={"identity": self.identity})
        except k8s.ApiError as err:  # it expires by itself then
            log.warning("could not release the lease", extra={"error": str(err)})

    def _observe(self, spec: dict[str, Any], at: float) -> None:
        self._observed, self._observed_at = spec, at

    def _lease(
        self, current: dict[str, Any] | None, spec: dict[str, Any], *, acquired: bool
    ) -> dict[str, Any]:
        """The Lease this replica writes: renewTime now; a new acquireTime and one more transition
        when it takes the Lease over, the old ones when it renews."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": naming.MANAGER},
        }
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        transitions = int(spec.get("leaseTransitions") or 0)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.timing.lease_seconds),
                "acquireTime": stamp if acquired else spec.get("acquireTime") or stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions + 1 if acquired and current is not None else transitions,
            },
        }
