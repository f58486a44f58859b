"""Watch AsyncGRPOJobs: any event on a job queues a reconcile pass for it.

`on.event` rather than on.create/update/resume: it keeps no per-object state (no progress or
diff-base annotations, no finalizer), and the pass reads the current object anyway.
"""

from __future__ import annotations

from typing import Any

import kopf

from asyncgrpo_api.v1alpha1 import GROUP, PLURAL, VERSION
from asyncgrpo_operator import naming, runtime


@kopf.on.event(GROUP, VERSION, PLURAL, id=naming.HANDLER_JOB_EVENT)
async def enqueue_job(*, namespace: str | None, name: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A job was added, changed or deleted: reconcile it."""
    runtime.of(memo).enqueue(namespace, name)
