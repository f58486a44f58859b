"""Watch AsyncGRPOJobs: any event on a job queues a reconcile pass for it, except the echo of
the operator's own status write.

`on.event` rather than on.create/update/resume: it keeps no per-object state (no progress or
diff-base annotations, no finalizer), and the pass reads the current object anyway. The echo
(a MODIFIED event whose resourceVersion is the one our last status patch returned) is skipped:
the pass that wrote it already acted on that state, and passes on it were most of the passes
that learned nothing (docs/benchmarks.md, operator vs KubeRay).
"""

from __future__ import annotations

from typing import Any

import kopf

from asyncgrpo_api.v1alpha1 import GROUP, PLURAL, VERSION
from asyncgrpo_operator import naming, runtime


@kopf.on.event(GROUP, VERSION, PLURAL, id=naming.HANDLER_JOB_EVENT)
async def enqueue_job(
    *,
    type: str | None,
    namespace: str | None,
    name: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A job was added, changed or deleted: reconcile it (unless it is our own write's echo)."""
    rt = runtime.of(memo)
    version = body.get("metadata", {}).get("resourceVersion")
    if type == "MODIFIED" and namespace and name and rt.reconciler.is_own_write((namespace, name), version):
        return
    rt.enqueue(namespace, name)
