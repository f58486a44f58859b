"""Watch AsyncGRPOJobs: every event updates the job cache (cache.py) and queues a reconcile pass
for the job, except the echo of the operator's own status write.

`on.event` rather than on.create/update/resume: it keeps no per-object state (no progress or
diff-base annotations, no finalizer), and the pass reads the job from the cache anyway. The echo
(a MODIFIED event whose resourceVersion is the one our last status patch returned) is skipped:
the pass that wrote it already acted on that state (and put it in the cache), and passes on it
were most of the passes that learned nothing (docs/benchmarks.md, operator vs KubeRay).

kopf cannot tell a handler that a re-list (after 410 Gone) ended, so a job deleted while the watch
was down would stay in the cache; the resync's list of all jobs (runtime.py, every
ASYNCGRPO_RESYNC_SECONDS) drops it.
"""

from __future__ import annotations

from typing import Any

import kopf

from asyncgrpo_api.v1alpha1 import GROUP, PLURAL, VERSION
from asyncgrpo_operator import cache, naming, runtime


@kopf.on.event(GROUP, VERSION, PLURAL, id=naming.HANDLER_JOB_EVENT)
async def enqueue_job(
    *,
    type: str | None,
    event: kopf.RawEvent,
    namespace: str | None,
    name: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A job was added, changed or deleted: cache it and reconcile it (unless it is our own write's
    echo). `type` is None for the objects of kopf's initial list."""
    rt = runtime.of(memo)
    raw: dict[str, Any] = dict(event["object"])
    rt.cache.jobs.apply(type or cache.ADDED, raw)
    version = (raw.get("metadata") or {}).get("resourceVersion")
    if type == "MODIFIED" and namespace and name and rt.reconciler.is_own_write((namespace, name), version):
        return
    rt.enqueue(namespace, name)
