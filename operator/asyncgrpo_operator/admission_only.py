"""The kopf module of a replica that only serves admission (`python -m asyncgrpo_operator --role
webhook`): the two webhooks, and a startup that builds what they share (runtime.start_admission)
instead of the reconciler.

Why a replica of its own: the reconciler watches pods, RayClusters and ConfigMaps that anyone in a
watched namespace may write; whatever takes it down (its memory limit, a bug) must not take
admission with it, since the webhook's failurePolicy Fail then refuses every job write. The chart
runs this role as the Deployment `<fullname>-webhook`, behind the webhook Service, and the
reconciler's Deployment with `--role reconciler`, which serves no admission.
"""

from __future__ import annotations

from typing import Any

import kopf

from asyncgrpo_operator import kueue_admission, naming, runtime, settings, webhook

__all__ = ["kueue_admission", "settings", "webhook"]


@kopf.on.startup(id=naming.HANDLER_START_ADMISSION)
async def start_admission(*, memo: kopf.Memo, **_: Any) -> None:
    await runtime.start_admission(memo)


@kopf.on.cleanup(id=naming.HANDLER_STOP_ADMISSION)
async def stop_admission(*, memo: kopf.Memo, **_: Any) -> None:
    await runtime.stop(memo)
