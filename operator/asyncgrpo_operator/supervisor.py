"""Keeps the operator's long-lived loops running: a loop that ends restarts, after a backoff.

The operator is a handful of endless loops on one event loop (the work queue, one informer per
watched resource and namespace, the /progress poller, the leader election, the metrics
certificate's reload). Each catches the failures it expects, but one that ends anyway (a bug, an
answer nobody foresaw, a cancel from inside a library) used to stay ended: an informer that died
left its cache frozen, so the operator stayed alive, its liveness probe green, and blind to every
change of that resource. Supervised, such a loop is started again (a restarted informer lists
afresh, so nothing it missed is lost), each restart is logged and counted
(`asyncgrpo_task_restarts_total`), and the liveness probe fails only if a supervisor itself is gone.

The backoff doubles from MIN_BACKOFF_SECONDS to MAX_BACKOFF_SECONDS while the loop keeps dying
soon after each start, and starts over once a run lasted HEALTHY_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

MIN_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
HEALTHY_SECONDS = 60.0

Loop = Callable[[], Coroutine[Any, Any, None]]
"""A long-lived loop: a coroutine function meant never to return."""


async def supervise(
    name: str,
    run: Loop,
    restarted: Callable[[str], None] = lambda _: None,
) -> None:
    """Run `run()` as task `name` until this supervisor is cancelled; whenever it ends otherwise
    (returned, raised, or was cancelled by someone else), tell `restarted` and start it again."""
    loop = asyncio.get_running_loop()
    this = asyncio.current_task()
    backoff = MIN_BACKOFF_SECONDS
    while True:
        started = loop.time()
        task = asyncio.create_task(run(), name=name)
        try:
            await task  # cancelling the supervisor cancels the task it awaits
            log.error("task ended; restarting it", extra={"task": name, "retry_in": backoff})
        except asyncio.CancelledError:
            if this is not None and this.cancelling():
                raise  # the supervisor is being stopped
            log.error("task was cancelled from elsewhere; restarting it", extra={"task": name})
        except Exception:
            log.exception("task failed; restarting it", extra={"task": name, "retry_in": backoff})
        restarted(name)
        if loop.time() - started >= HEALTHY_SECONDS:
            backoff = MIN_BACKOFF_SECONDS
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
