"""Operator lifecycle: start the work queue, stop it, and report liveness.

The liveness probe (`kopf run --liveness=http://0.0.0.0:8080/healthz`) fails when the queue's
dispatcher has not ticked for a while, or when a supervisor of one of the operator's loops is gone
(each loop that ends is restarted by its supervisor; a supervisor does not end), so a wedged
operator is restarted by the kubelet instead of silently doing nothing (the kopf "zombie" failure,
kopf#1276).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from asyncgrpo_operator import naming, runtime

STALE_AFTER_SECONDS = 60.0


@kopf.on.startup(id=naming.HANDLER_START_CONTROLLER)
async def start_controller(*, memo: kopf.Memo, **_: Any) -> None:
    await runtime.start(memo)


@kopf.on.cleanup(id=naming.HANDLER_STOP_CONTROLLER)
async def stop_controller(*, memo: kopf.Memo, **_: Any) -> None:
    await runtime.stop(memo)


@kopf.on.probe(id=naming.HANDLER_PROBE)
async def controller_alive(*, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Queue statistics; raises (HTTP 500) when a loop is no longer supervised or the queue is stuck."""
    rt = runtime.of(memo)
    gone = [task.get_name() for task in rt.loops() if task.done()]
    if gone:
        raise kopf.PermanentError(f"stopped: {', '.join(gone)}")
    stats = rt.controller.stats
    idle = asyncio.get_running_loop().time() - stats.last_beat
    if idle > STALE_AFTER_SECONDS:
        raise kopf.PermanentError(f"the reconcile queue has not ticked for {idle:.0f} s")
    return {
        "passes": stats.passes,
        "failures": stats.failures,
        "pending": rt.controller.pending(),
        "leader": rt.is_leader,
    }
