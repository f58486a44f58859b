"""Who waits for whom on the generation side: each engine's busy time and its idle time behind the
staleness gate, measured on one clock.

An engine is busy while it holds at least one request (`serving`, around the awaited call in
`workers.GenerationGroup.generate`), and idle otherwise. Its idle time splits in two: behind the
gate, while the controller's rollout pump holds a group back (`gated`: the sampler's staleness
bound, the buffer's capacity, or a refit's closed gate), and with nothing to do, while it does
not (every dispatched group is on another engine, or none is left). The operator's elastic fleet
reads the split: an engine idle behind the gate would not be used by a larger fleet either
(`asyncgrpo_operator.elastic`).

Every transition first charges the seconds since the previous one to each engine's state then,
so a reading is exact whatever the timing, not a sample of it. The group is built in the driver
and handed to the controller actor; `restart` starts the clock in the process that measures.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """Cumulative seconds up to `at` (perf_counter of the measuring process), per engine."""

    at: float
    busy: tuple[float, ...]
    gated_idle: tuple[float, ...]


@dataclass(frozen=True)
class Shares:
    """The window between two readings, as shares of its length (each in [0, 1])."""

    idle: tuple[float, ...]
    """Per engine: the share it held no request."""
    gated_idle: tuple[float, ...]
    """Per engine: the share it held no request while the dispatch was gated (part of `idle`)."""


class Occupancy:
    """See the module docstring."""

    def __init__(self, engines: int) -> None:
        self.outstanding = [0] * engines
        """Requests each engine holds now (the group routes a new one to the least loaded)."""
        self._closed = 0
        self.restart()

    def restart(self) -> None:
        """Start the clock now, with nothing counted (in the process that measures)."""
        self._since = time.perf_counter()
        self._busy = [0.0] * len(self.outstanding)
        self._gated_idle = [0.0] * len(self.outstanding)

    def _advance(self) -> float:
        now = time.perf_counter()
        elapsed = now - self._since
        for i, held in enumerate(self.outstanding):
            if held:
                self._busy[i] += elapsed
            elif self._closed:
                self._gated_idle[i] += elapsed
        self._since = now
        return now

    @contextlib.contextmanager
    def serving(self, engine: int) -> Iterator[None]:
        """Engine `engine` holds one more request while inside."""
        self._advance()
        self.outstanding[engine] += 1
        try:
            yield
        finally:
            self._advance()
            self.outstanding[engine] -= 1

    @contextlib.contextmanager
    def gated(self) -> Iterator[None]:
        """The dispatch is held back by the gate while inside (nested holds count once)."""
        self._advance()
        self._closed += 1
        try:
            yield
        finally:
            self._advance()
            self._closed -= 1

    def reading(self) -> Reading:
        now = self._advance()
        return Reading(now, tuple(self._busy), tuple(self._gated_idle))


def shares(before: Reading, after: Reading) -> Shares:
    """Each engine's idle shares of the window from `before` to `after`."""
    window = after.at - before.at
    if window <= 0:
        return Shares((0.0,) * len(after.busy), (0.0,) * len(after.busy))

    def share(seconds: float) -> float:
        return min(max(seconds / window, 0.0), 1.0)

    return Shares(
        tuple(share(window - (a - b)) for a, b in zip(after.busy, before.busy, strict=True)),
        tuple(share(a - b) for a, b in zip(after.gated_idle, before.gated_idle, strict=True)),
    )
