"""List-then-watch loops that keep the cache's children (RayClusters, pods, ConfigMaps, Kueue
Workloads) current.

One loop per resource and watched namespace, as client-go's reflector does it: list, replace the
cache's copy with the list, then watch from the list's resourceVersion, applying each event; every
change queues the owning job. The watch ends every WATCH_SECONDS and is resumed from the last
version seen (bookmarks keep that version fresh while nothing changes). Only when the version is
gone (410 Gone: etcd compacted it, or a restarted API server no longer has it) does the loop list
again, and what the list lacks is dropped, so no deletion is missed even without its event. A
failed call is retried after a short backoff (the operator must catch up as soon as the API server
is back). A resource the API server does not serve (404, e.g. KubeRay's CRD is not installed, or
Kueue's) is recorded for the plan (KubeRayMissing, KueueMissing) and listed again every
MISSING_SECONDS.

What the loops read is written by others: anyone who may create pods in a watched namespace can
label a hundred of them with a job's name, each with a megabyte of environment. So no list is ever
held whole: each object is turned into the small view the cache keeps (observed.py) as it
arrives, and its body dropped. The list itself is streamed where the API server can (Kubernetes'
WatchList: one object at a time, then the watch on the same stream), else read in pages of
PAGE_SIZE (FULL_PAGE_SIZE for whole objects, whose size others choose).

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
from asyncgrpo_operator.cache import ADDED, DELETED, MODIFIED, Key

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
MISSING_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 5.0
PAGE_SIZE = k8s.LIST_PAGE_SIZE
FULL_PAGE_SIZE = 20
"""Objects per page of a paged list of whole objects (no streaming list): what one page may hold
in memory at once is 20 of the largest objects the API server stores (about 1.5 MiB each)."""
NOT_STREAMED = (400, 422)
"""How an API server without streaming lists refuses one (the parameters are invalid to it)."""


class Sink(Protocol):
    """Where the events go (cache.Index)."""

    missing: dict[str | None, str]

    def apply(self, kind: str, obj: dict[str, Any]) -> Key | None: ...

    def prune(self, listed: set[str], list_version: str, scope: str | None = None) -> set[Key]: ...


API_BASES = {
    naming.RAYCLUSTER_PLURAL: f"/apis/{naming.RAY_GROUP}/{naming.RAY_VERSION}",
    naming.WORKLOAD_PLURAL: k8s.KUEUE_BASE,
}
"""The API group of each watched resource that is not in the core group."""


def collection_path(resource: str, namespace: str | None) -> str:
    """The API path of pods, configmaps, rayclusters or workloads, in one namespace or in all."""
    base = API_BASES.get(resource, "/api/v1")
    return f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"


class _ExpiredError(Exception):
    """The watch's version is gone (410): list again."""


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
    streaming: bool = True
    """List by a streaming list; cleared for good once the API server refuses one."""

    async def run(self) -> None:
        path = collection_path(self.resource, self.scope)
        backoff = 0.5
        while True:
            try:
                version = await (self._stream(path) if self.streaming else self._list(path))
            except k8s.ApiError as err:
                if self.streaming and err.status in NOT_STREAMED:
                    log.info(
                        "streaming lists not served; listing in pages",
                        extra={"resource": self.resource, "error": err.message},
                    )
                    self.streaming = False
                    continue
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
            backoff = 0.5
            if version:
                await self._watch(path, version)

    async def _list(self, path: str) -> str:
        """A paged list into the sink, one page at a time; returns the list's resourceVersion."""
        listed: set[str] = set()
        version = ""
        page_size = PAGE_SIZE if self.metadata_only else FULL_PAGE_SIZE
        pages = self.api.list_pages(
            path, self.label_selector, metadata_only=self.metadata_only, page_size=page_size
        )
        async for page, at in pages:
            for obj in page:
                self._apply(ADDED, obj, listed)
            version = at
        self._listed_all(listed, version)
        return version

    async def _stream(self, path: str) -> str:
        """A streaming list into the sink, then the watch on the same stream until it ends;
        returns the version to watch on from ("" when the list must be done again)."""
        listed: set[str] | None = set()
        version = ""
        events = self.api.watch(
            path,
            self.label_selector,
            "",
            WATCH_SECONDS,
            metadata_only=self.metadata_only,
            initial_events=True,
        )
        try:
            async for event in events:
                if listed is not None and _ends_initial_events(event):
                    version = _version_of(event.get("object") or {}, version)
                    self._listed_all(listed, version)
                    listed = None
                    continue
                version = self._handle(event, version, listed)
        except _ExpiredError:
            return ""
        return "" if listed is not None else version

    def _listed_all(self, listed: set[str], version: str) -> None:
        was_missing = self.scope in self.sink.missing
        self.changed(self.sink.prune(listed, version, self.scope))
        self.listed()
        if was_missing:
            log.info("served again", extra={"resource": self.resource})
            self.found_again()

    def _apply(self, kind: str, obj: dict[str, Any], listed: set[str] | None = None) -> None:
        if listed is not None:
            listed.add(str((obj.get("metadata") or {}).get("uid") or ""))
        key = self.sink.apply(kind, obj)
        if key is not None:
            self.changed((key,))

    def _handle(self, event: dict[str, Any], version: str, listed: set[str] | None = None) -> str:
        """Apply one watch event; returns the version seen. Raises _ExpiredError on 410 Gone."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                log.info("watch expired (410 Gone); listing again", extra={"resource": self.resource})
                raise _ExpiredError
            raise k8s.ApiError(code, str(obj.get("message") or obj))
        if kind in (ADDED, MODIFIED, DELETED):
            self._apply(str(kind), obj, listed if kind == ADDED else None)
        return _version_of(obj, version)

    async def _watch(self, path: str, version: str) -> None:
        """Watch from `version` until it expires (then the caller lists again); resume after errors."""
        backoff = 0.5
        while True:
            try:
                async for event in self.api.watch(
                    path, self.label_selector, version, WATCH_SECONDS, metadata_only=self.metadata_only
                ):
                    version = self._handle(event, version)
                    backoff = 0.5
            except _ExpiredError:
                return
            except k8s.ApiError as err:
                if err.status in (404, 410):  # expired, or no longer served: list again
                    return
                log.warning(
                    "watch failed; resuming",
                    extra={"resource": self.resource, "error": str(err), "retry_in": backoff},
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def _version_of(obj: dict[str, Any], default: str) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or default)


def _ends_initial_events(event: dict[str, Any]) -> bool:
    """The BOOKMARK that ends a streaming list's initial events."""
    annotations = ((event.get("object") or {}).get("metadata") or {}).get("annotations") or {}
    return event.get("type") == "BOOKMARK" and annotations.get(k8s.INITIAL_EVENTS_END) == "true"
