"""Cancelling an operator loop in the same event-loop turn as its wake-up.

Python 3.11's asyncio.wait_for returned the awaited result when a cancel arrived as the awaited
event fired, so a `while True` loop around it outlived its cancel. The Poller and the work
queue's dispatcher are such loops; their tests cancel them this way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


async def stops_when_cancelled_as_it_wakes(task: asyncio.Task[None], wake: Callable[[], None]) -> bool:
    """Whether `task` ends within 2 s of a cancel sent in the same loop turn as `wake()`. A task
    that outlives it is cancelled again (with no wake beside it, that lands) so the test ends."""
    await asyncio.sleep(0.1)  # the loop waits for its wake
    wake()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        async with asyncio.timeout(2.0):
            await task
    stopped = task.done()
    while not task.done():
        task.cancel()
        await asyncio.sleep(0.05)
    return stopped
