"""Which failures are the infrastructure's and which are the job's.

A Ray worker, actor or node that dies under the run is an infrastructure failure: the driver exits
RAY_WORKER_LOST and the operator retries from the last checkpoint. Anything else is a training
error, never retried. The controller runs in an actor of its own, and Ray pickles an actor's
exception without its `__cause__`: an error raised *because of* a lost worker (a prompt group that
failed every attempt on a dead engine) would reach the driver as a training error. So the controller
actor's `run` (`reports_lost_workers`) raises such an error as `WorkerLostError`, a type the driver
recognises on its own.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import ray

from asyncgrpo_trainer.backends.generation import EngineLostError

P = ParamSpec("P")
T = TypeVar("T")


class WorkerLostError(RuntimeError):
    """An error whose cause was a lost Ray worker, actor or node, raised under this type so that
    the loss survives the trip out of an actor (see the module docstring)."""


INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    EngineLostError,
    WorkerLostError,
    ray.exceptions.RayActorError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
)


def lost_ray_worker(exc: BaseException) -> bool:
    """Whether the run failed because a Ray worker, actor or node died, not because of the job.

    Ray wraps a remote failure in RayTaskError (whose `cause` is the original), possibly several
    levels deep, so the whole chain is searched, through `cause` and `__cause__`.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, INFRASTRUCTURE_ERRORS):
            return True
        nested = getattr(current, "cause", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return False


def reports_lost_workers(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """An actor's async method that raises an error whose cause chain shows a lost worker as a
    WorkerLostError naming it (the chain itself would not survive the pickling); any other error,
    and a lost worker's own error, as it is."""

    @functools.wraps(method)
    async def reporting(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except Exception as exc:
            if isinstance(exc, INFRASTRUCTURE_ERRORS) or not lost_ray_worker(exc):
                raise
            raise WorkerLostError(f"{type(exc).__name__}: {exc}") from exc

    return reporting
