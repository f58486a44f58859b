"""List-then-watch loops that keep the cache's children (RayClusters, pods, ConfigMaps, Kueue
Workloads) current.

One loop per resource and watched namespace, as client-go's reflector does it: list (in pages),
replace the cache's copy with the list, then watch from the list's resourceVersion, applying each
event; every change queues the owning job. The watch ends every WATCH_SECONDS and is resumed from
the last version seen (bookmarks keep that version fresh while nothing changes). Only when the
version is gone (410 Gone: etcd compacted it, or a restarted API server no longer has it) does the
loop list again, and the replace drops what was deleted meanwhile, so no deletion is missed even
without its event. A failed call is retried after a short backoff (the operator must catch up as
soon as the API server is back). A resource the API server does not serve (404, e.g. KubeRay's CRD
is not installed, or Kueue's) is recorded for the plan (KubeRayMissing, KueueMissing) and listed
again every MISSING_SECONDS.

These loops replace kopf's watches of pods and RayClusters: kopf's handlers could not see a list
end, so an object deleted while a watch was down would have stayed in the cache. Workloads were
read by every pass of a job Kueue manages, every 3 s while Kueue decided; watched, Kueue's decision
queues the job's pass the moment it is written, and a pass reads nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from asyncgrpo_operator import k8s, naming
from asyncgrpo_operator.cache import Key

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
MISSING_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 5.0


class Sink(Protocol):
    """Where the events go (cache.Index)."""

    missing: dict[str | None, str]

    def apply(self, kind: str, obj: dict[str, Any]) -> Key | None: ...

    def replace(
        self, objs: list[dict[str, Any]], list_version: str, scope: str | None = None
    ) -> set[Key]: ...


API_BASES = {
    naming.RAYCLUSTER_PLURAL: f"/apis/{naming.RAY_GROUP}/{naming.RAY_VERSION}",
    naming.WORKLOAD_PLURAL: k8s.KUEUE_BASE,
}
"""The API group of each watched resource that is not in the core group."""


def collection_path(resource: str, namespace: str | None) -> str:
    """The API path of pods, configmaps, rayclusters or workloads, in one namespace or in all."""
    base = API_BASES.get(resource, "/api/v1")
    return f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"


@dataclass
class Informer:
    """Keeps `sink` equal to the API server's `resource` objects labelled with a job name."""

    api: k8s.Api
    resource: str
    scope: str | None
    sink: Sink
    changed: Callable[[Iterable[Key]], None]
    """Told which jobs' children changed (the work queue)."""
    listed: Callable[[], None]
    """Told after each successful list."""
    found_again: Callable[[], None] = lambda: None
    """Told when a resource that was not served is served again (KubeRay installed)."""
    label_selector: str = naming.JOB_NAME_LABEL
    metadata_only: bool = False
    """Receive the objects' metadata only (the API server drops the rest)."""

    async def run(self) -> None:
        path = collection_path(self.resource, self.scope)
        backoff = 0.5
        while True:
            try:
                items, version = await self.api.list_all(
                    path, self.label_selector, metadata_only=self.metadata_only
                )
            except k8s.ApiError as err:
                if err.status == 404:
                    if self.scope not in self.sink.missing:
                        log.warning("not served", extra={"resource": self.resource, "error": err.message})
                    self.sink.missing[self.scope] = err.message or "404 Not Found"
                    self.listed()  # a known state: the plan reports it
                    await asyncio.sleep(MISSING_SECONDS)
                    continue
                log.warning("list failed; retrying", extra={"resource": self.resource, "error": str(err)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            was_missing = self.scope in self.sink.missing
            self.changed(self.sink.replace(items, version, self.scope))
            self.listed()
            if was_missing:
                log.info("served again", extra={"resource": self.resource})
                self.found_again()
            backoff = 0.5
            await self._watch(path, version)

    async def _watch(self, path: str, version: str) -> None:
        """Watch from `version` until it expires (then the caller lists again); resume after errors."""
        backoff = 0.5
        while True:
            try:
                async for event in self.api.watch(
                    path, self.label_selector, version, WATCH_SECONDS, metadata_only=self.metadata_only
                ):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        code = int(obj.get("code") or 0)
                        if code == 410:
                            log.info(
                                "watch expired (410 Gone); listing again", extra={"resource": self.resource}
                            )
                            return
                        raise k8s.ApiError(code, str(obj.get("message") or obj))
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        key = self.sink.apply(str(kind), obj)
                        if key is not None:
                            self.changed((key,))
                    backoff = 0.5
            except k8s.ApiError as err:
                if err.status in (404, 410):  # expired, or no longer served: list again
                    return
                log.warning(
                    "watch failed; resuming",
                    extra={"resource": self.resource, "error": str(err), "retry_in": backoff},
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
