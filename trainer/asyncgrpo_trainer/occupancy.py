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

Engines are keyed by an id that never changes, since an elastic fleet (`fleet`) adds and removes
engines while requests are in flight: an engine that joined during a window is measured over the
part of it since it joined, and one that left is no longer reported.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """Cumulative seconds up to `at` (perf_counter of the measuring process), per engine."""

    at: float
    busy: dict[int, float]
    gated_idle: dict[int, float]
    joined: dict[int, float]
    """When each engine joined (perf_counter), the start of its part of a window."""


@dataclass(frozen=True)
class Shares:
    """The window between two readings, as shares of its length (each in [0, 1])."""

    idle: tuple[float, ...]
    """Per engine: the share it held no request."""
    gated_idle: tuple[float, ...]
    """Per engine: the share it held no request while the dispatch was gated (part of `idle`)."""
    engines: tuple[int, ...] = ()
    """The engines' ids, in the order of the shares."""


class Occupancy:
    """See the module docstring."""

    def __init__(self, engines: Iterable[int]) -> None:
        self.outstanding: dict[int, int] = dict.fromkeys(engines, 0)
        """Requests each engine holds now (the group routes a new one to the least loaded)."""
        self.requests: dict[int, int] = dict.fromkeys(self.outstanding, 0)
        """Requests each engine was sent over the run, kept after it leaves (ids are not reused)."""
        self._closed = 0
        self.restart()

    def restart(self) -> None:
        """Start the clock now, with nothing counted (in the process that measures)."""
        self._since = time.perf_counter()
        self._busy = dict.fromkeys(self.outstanding, 0.0)
        self._gated_idle = dict.fromkeys(self.outstanding, 0.0)
        self._joined = dict.fromkeys(self.outstanding, self._since)

    def add(self, engine: int) -> None:
        """Engine `engine` joins now, holding nothing."""
        now = self._advance()
        self.outstanding[engine] = 0
        self._busy[engine] = self._gated_idle[engine] = 0.0
        self._joined[engine] = now

    def remove(self, engine: int) -> None:
        """Engine `engine` leaves (it holds no request)."""
        self._advance()
        for counts in (self.outstanding, self._busy, self._gated_idle, self._joined):
            del counts[engine]

    def _advance(self) -> float:
        now = time.perf_counter()
        elapsed = now - self._since
        for i, held in self.outstanding.items():
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
        self.requests[engine] = self.requests.get(engine, 0) + 1
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
        return Reading(now, dict(self._busy), dict(self._gated_idle), dict(self._joined))


def shares(before: Reading, after: Reading) -> Shares:
    """Each engine's idle shares of the window from `before` to `after`: the engines of `after`,
    each over the part of the window since it joined."""
    engines = tuple(after.busy)

    def part(engine: int) -> tuple[float, float, float]:
        start = max(before.at, after.joined[engine])
        window = after.at - start
        if window <= 0:
            return 0.0, 0.0, 0.0
        busy = after.busy[engine] - before.busy.get(engine, 0.0)
        gated = after.gated_idle[engine] - before.gated_idle.get(engine, 0.0)
        return window, busy, gated

    def share(seconds: float, window: float) -> float:
        return min(max(seconds / window, 0.0), 1.0) if window > 0 else 0.0

    parts = [part(e) for e in engines]
    return Shares(
        tuple(share(w - b, w) for w, b, _ in parts),
        tuple(share(g, w) for w, _, g in parts),
        engines,
    )
