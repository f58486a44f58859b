"""Leader election on a coordination.k8s.io Lease, for running more than one operator replica.

Only the holder of the Lease runs reconcile passes; the other replicas keep watching (their queues
stay warm) and keep serving the admission webhook, so a standby takes over within one lease
duration when the leader dies. This replaces kopf's peering (which needs its own CRDs and freezes
all replicas of equal priority) with the mechanism Kubernetes controllers use.

The reconcile itself stays safe without it (deterministic names, UID preconditions, optimistic
status writes); the Lease avoids duplicate work and duplicate events.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from asyncgrpo_operator import k8s, naming
from asyncgrpo_operator.observed import parse_time

log = logging.getLogger(__name__)

LEASE_NAME = "asyncgrpo-operator"


class LeaseElector:
    """Acquires and renews a Lease; `is_leader` says whether this replica may act."""

    def __init__(
        self,
        api: k8s.Api,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.is_leader = False

    async def run(self) -> None:
        """Try to acquire or renew every `renew_seconds`, until cancelled."""
        while True:
            try:
                leader = await self.try_acquire()
            except k8s.ApiError as err:
                log.warning("leader election failed; standing by", extra={"error": str(err)})
                leader = False
            if leader != self.is_leader:
                log.info("leadership changed", extra={"leader": leader, "identity": self.identity})
            self.is_leader = leader
            await asyncio.sleep(self.renew_seconds)

    async def try_acquire(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        now = datetime.now(UTC)
        lease = await self.api.get_lease(self.namespace, self.name)
        if lease is None:
            return await self.api.create_lease(self.namespace, self._lease(None, now, transitions=0))
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(spec.get("renewTime")) or datetime.min.replace(tzinfo=UTC)
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        expired = now > renewed + timedelta(seconds=duration)
        if holder not in ("", self.identity) and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquired = spec.get("acquireTime") if holder == self.identity else None
        body = self._lease(lease, now, transitions=transitions, acquired=acquired)
        try:
            await self.api.replace_lease(self.namespace, self.name, body)
        except k8s.ApiError as err:
            if err.status == 409:  # another replica renewed or took it first
                return False
            raise
        return True

    def _lease(
        self, current: dict[str, Any] | None, now: datetime, *, transitions: int, acquired: str | None = None
    ) -> dict[str, Any]:
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": naming.MANAGER},
        }
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": acquired or stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions,
            },
        }
