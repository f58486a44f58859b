"""The operator's in-memory copy of what it reconciles: the jobs, and their RayClusters, pods, spec
ConfigMaps and Kueue Workloads, indexed by the job that owns them.

A reconcile pass reads only from here (reconciler.py); the watches keep it current (informer.py
for the children, the kopf job watch for the jobs), and so do the answers to the operator's own
writes (a created RayCluster or ConfigMap, a written status), so the next pass does not act again
on what it just did before the watch shows it. Without it every pass re-read the job, its
RayClusters, pods and ConfigMap from the API server: 30-44 requests per job (docs/benchmarks.md),
and a job Kueue manages listed its Workloads on every pass.

Correctness does not rest on the cache being current:
- Order: an object is replaced only by a newer one. resourceVersions are compared as integers
  (what etcd-backed API servers hand out; Kubernetes documents them as comparable since KEP-5504);
  one that is not an integer always replaces.
- A watch that restarts lists again (`replace`): what the list lacks is dropped, unless it is newer
  than the list (an answer to our own write that the list predates).
- Staleness cannot duplicate anything: creates have deterministic names (a second one answers 409),
  deletes carry UID preconditions, and the status write carries the job's resourceVersion, so a
  decision made on an outdated job fails (409) before it acts.

Children are stored as the views the plan reads (observed.py), not as raw bodies: a pod's
view is a few hundred bytes, its body with managedFields several KiB; 1,000 jobs are 3,000 pods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from asyncgrpo_operator import naming
from asyncgrpo_operator.observed import ClusterView, ConfigMapView, PodView, WorkloadView

Key = tuple[str, str]
"""(namespace, name) of a job."""
Obj = dict[str, Any]
T = TypeVar("T")

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


def version(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as an integer, or None when it is not one."""
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except ValueError:
        return None


def newer(candidate: int | None, stored: int | None) -> bool:
    """Whether an object at version `candidate` may replace one at `stored` (an unknown order: yes)."""
    return candidate is None or stored is None or candidate > stored


def _in_scope(namespace: str, scope: str | None) -> bool:
    return scope is None or namespace == scope


class Tombstones:
    """UIDs deleted lately. A UID is never reused, so once its deletion is seen no later answer
    (a create's, sent before the delete but read after it) may bring the object back."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._uids: dict[str, None] = {}

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        if len(self._uids) > self.LIMIT:
            del self._uids[next(iter(self._uids))]

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


@dataclass
class _Entry(Generic[T]):
    version: int | None
    job: Key
    value: T


@dataclass
class Index(Generic[T]):
    """Objects of one kind, by UID, and which job each belongs to (its `asyncgrpo.dev/job-name`
    label: the watches select on it). Ownership itself is the plan's to check (ownerReferences)."""

    parse: Callable[[Obj], T]
    seen: Callable[[Key, Obj], None] | None = None
    """Called with every object an event or a list shows, deleted ones included (the last state of
    a deleted head pod is only in its watch event)."""
    missing: dict[str | None, str] = field(default_factory=dict)
    """Per watched scope (a namespace, None for all): the API server's answer while it does not
    serve this resource at all (404: e.g. KubeRay's CRD is not installed)."""
    _items: dict[str, _Entry[T]] = field(default_factory=dict)
    _by_job: dict[Key, dict[str, T]] = field(default_factory=dict)
    _gone: Tombstones = field(default_factory=Tombstones)

    def of(self, job: Key) -> tuple[T, ...]:
        """The job's objects."""
        return tuple((self._by_job.get(job) or {}).values())

    def __len__(self) -> int:
        return len(self._items)

    def apply(self, kind: str, obj: Obj) -> Key | None:
        """Apply one watch event (or the answer to a write); returns the job whose view changed."""
        meta = obj.get("metadata") or {}
        uid, job = str(meta.get("uid") or ""), _job_of(meta)
        if not uid or job is None:
            return None
        if self.seen is not None:
            self.seen(job, obj)
        stored = self._items.get(uid)
        if kind == DELETED:
            self._gone.add(uid)
            if stored is None:
                return None
            self._remove(uid)
            return stored.job
        at = version(obj)
        if uid in self._gone or (stored is not None and not newer(at, stored.version)):
            return None
        if stored is not None and stored.job != job:
            self._remove(uid)  # relabelled: it moved to another job's index
        self._items[uid] = _Entry(at, job, self.parse(obj))
        self._by_job.setdefault(job, {})[uid] = self._items[uid].value
        return job

    def prune(self, listed: set[str], list_version: str, scope: str | None = None) -> set[Key]:
        """The end of a list of `scope` whose objects (UIDs `listed`) were applied one by one as
        they came: drop what it lacked unless that is newer than the list. Returns the jobs whose
        view changed."""
        try:
            at: int | None = int(list_version)
        except ValueError:
            at = None
        gone = [
            uid
            for uid, entry in self._items.items()
            if uid not in listed
            and _in_scope(entry.job[0], scope)
            and (at is None or entry.version is None or entry.version <= at)
        ]
        changed: set[Key] = set()
        for uid in gone:
            changed.add(self._items[uid].job)
            self._remove(uid)
            self._gone.add(uid)
        self.missing.pop(scope, None)
        return changed

    def update(self, uid: str, change: Callable[[T], T]) -> None:
        """Change a stored view in place (e.g. mark a RayCluster deleting once we deleted it), at
        its stored version: the watch's next event for it replaces it."""
        entry = self._items.get(uid)
        if entry is not None:
            entry.value = change(entry.value)
            self._by_job[entry.job][uid] = entry.value

    def _remove(self, uid: str) -> None:
        entry = self._items.pop(uid)
        children = self._by_job.get(entry.job)
        if children is not None:
            children.pop(uid, None)
            if not children:
                del self._by_job[entry.job]


def _job_of(meta: Mapping[str, Any]) -> Key | None:
    namespace = meta.get("namespace")
    name = (meta.get("labels") or {}).get(naming.JOB_NAME_LABEL)
    return (str(namespace), str(name)) if namespace and name else None


@dataclass
class Jobs:
    """The AsyncGRPOJobs, by (namespace, name), as the job watch and the resync's list show them."""

    _items: dict[Key, Obj] = field(default_factory=dict)
    _gone: Tombstones = field(default_factory=Tombstones)
    listed: set[str | None] = field(default_factory=set)
    """The scopes listed at least once: before that, a missing job may only be unseen yet."""

    def get(self, key: Key) -> Obj | None:
        return self._items.get(key)

    def keys(self) -> list[Key]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def apply(self, kind: str, obj: Obj) -> bool:
        """Apply a watch event or the answer to a status write; True when the stored job changed."""
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        uid = str(meta.get("uid") or "")
        stored = self._items.get(key)
        same = stored is not None and (stored.get("metadata") or {}).get("uid") == uid
        if kind == DELETED:
            self._gone.add(uid)
            if same:
                del self._items[key]
            return same
        if uid in self._gone or (same and not newer(version(obj), version(stored or {}))):
            return False
        if stored is not None and not same:  # the name was reused: the older job is gone
            self._gone.add(str((stored.get("metadata") or {}).get("uid") or ""))
        self._items[key] = _slim(obj)
        return True

    def replace(self, objs: list[Obj], list_version: str, scope: str | None = None) -> set[Key]:
        """A fresh list of `scope`: store it, and drop the jobs it lacks that are not newer.
        Returns the dropped jobs (deleted while their DELETE event went unseen)."""
        listed = set()
        for obj in objs:
            self.apply(MODIFIED, obj)
            meta = obj.get("metadata") or {}
            listed.add((str(meta.get("namespace") or ""), str(meta.get("name") or "")))
        try:
            at: int | None = int(list_version)
        except ValueError:
            at = None
        dropped: set[Key] = set()
        for key in [k for k in self._items if k not in listed and _in_scope(k[0], scope)]:
            stored = version(self._items[key])
            if at is None or stored is None or stored <= at:
                self._gone.add(str(self._items.pop(key)["metadata"].get("uid") or ""))
                dropped.add(key)
        self.listed.add(scope)
        return dropped


def _slim(obj: Obj) -> Obj:
    """The job without metadata.managedFields (often the largest part, never read)."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


CHILD_RESOURCES = (naming.RAYCLUSTER_PLURAL, "pods", "configmaps", naming.WORKLOAD_PLURAL)
"""What the informers watch besides the jobs (one informer per resource and watched namespace)."""


@dataclass
class Cache:
    """Everything a pass reads. `synced` once every watch has listed once (like client-go's
    WaitForCacheSync): until then no pass runs, since a job whose pods are not listed yet would
    look as if it had none."""

    jobs: Jobs = field(default_factory=Jobs)
    clusters: Index[ClusterView] = field(default_factory=lambda: Index(ClusterView.from_dict))
    pods: Index[PodView] = field(default_factory=lambda: Index(PodView.from_dict))
    configmaps: Index[ConfigMapView] = field(default_factory=lambda: Index(ConfigMapView.from_dict))
    workloads: Index[WorkloadView] = field(default_factory=lambda: Index(WorkloadView.from_dict))
    """Kueue's Workloads labelled with a job's name: the ones the operator creates, and on a
    MultiKueue worker the prebuilt ones (MultiKueue copies the manager's labels)."""
    scopes: tuple[str | None, ...] = (None,)
    """The namespaces watched (None: all)."""
    children_listed: set[tuple[str, str | None]] = field(default_factory=set)
    """(resource, scope) pairs whose watch has listed at least once."""

    def synced(self) -> bool:
        scopes = set(self.scopes)
        listed = {(r, s) for r in CHILD_RESOURCES for s in scopes}
        return scopes <= self.jobs.listed and listed <= self.children_listed

    def kuberay_missing(self) -> str | None:
        """The API server's answer when it does not serve RayClusters (KubeRay not installed)."""
        return next(iter(self.clusters.missing.values()), None)

    def kueue_missing(self) -> str | None:
        """The API server's answer when it does not serve Workloads (Kueue not installed)."""
        return next(iter(self.workloads.missing.values()), None)

    def configmap(self, job: Key, name: str) -> ConfigMapView | None:
        return next((c for c in self.configmaps.of(job) if c.name == name), None)

    def mark_deleting(self, uid: str) -> None:
        """We deleted this RayCluster: until the watch shows it gone, it is on its way out."""
        self.clusters.update(uid, lambda view: dataclasses.replace(view, deleting=True))
