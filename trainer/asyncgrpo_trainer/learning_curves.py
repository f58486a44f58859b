"""Sample efficiency read off held-out curves, and whether a mode's seeds learn as well as sync's.

A final accuracy says little once every mode has saturated (the learning test's 150 steps had every
mode at 1.0 from step 80-110). What can differ between modes is how many trained samples each
needs: the step at which held-out accuracy first reaches a threshold, and the area under held-out
accuracy against samples trained. One seed proves little about an RL recipe (a seed can stall where
the next learns: docs/guides/models.md, the seed sweep), so each figure is summarised over seeds by
its mean, its spread (sample standard deviation) and its worst seed. A mode passes against sync
when its mean and its worst seed are both within one of sync's standard deviations of sync's; the
verdict otherwise says by how much it is worse, so a benchmark reports it instead of hiding it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise


def steps_to(curve: Mapping[int, float], target: float) -> int | None:
    """The first validated step whose held-out accuracy reached `target` (None: never)."""
    return next((step for step, acc in sorted(curve.items()) if acc >= target), None)


def area_under(points: Sequence[tuple[float, float]]) -> float:
    """The mean held-out accuracy over training: the trapezoid area under (samples trained, accuracy)
    divided by the samples spanned. 1.0 is a model right from its first sample; a run that learns
    sooner scores higher at the same final accuracy, which is the difference a final value hides."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        raise ValueError(f"an area needs two or more points over a span of samples, got {points}")
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in pairwise(points))
    return area / (points[-1][0] - points[0][0])


def mean_curve(curves: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """Step by step, the mean held-out accuracy of runs validated at the same steps."""
    steps = sorted(curves[0])
    if any(sorted(curve) != steps for curve in curves):
        raise ValueError("the runs were validated at different steps")
    return {step: statistics.fmean(curve[step] for curve in curves) for step in steps}


@dataclass(frozen=True)
class Spread:
    """A figure over seeds where higher is better (an area, a final accuracy)."""

    mean: float
    std: float
    """Sample standard deviation over the seeds (0 for one seed)."""
    worst: float


def spread(values: Sequence[float]) -> Spread:
    return Spread(
        mean=statistics.fmean(values),
        std=statistics.stdev(values) if len(values) > 1 else 0.0,
        worst=min(values),
    )


@dataclass(frozen=True)
class Reached:
    """Steps to a held-out threshold over seeds, where fewer is better."""

    mean: float | None
    """Over the seeds that reached it (None: none did)."""
    worst: int | None
    """The slowest seed's steps; None when a seed never reached it."""
    missed: int
    """Seeds that never reached it."""


def reached(steps: Sequence[int | None]) -> Reached:
    hits = [s for s in steps if s is not None]
    missed = len(steps) - len(hits)
    return Reached(
        mean=statistics.fmean(hits) if hits else None,
        worst=max(hits) if hits and not missed else None,
        missed=missed,
    )


def verdict(mode: Spread, sync: Spread) -> str:
    """`mode` against sync on one figure (higher is better): within sync's seed spread when its mean
    and its worst seed both fall short of sync's by at most sync's standard deviation; otherwise by
    how much each falls short."""
    shortfalls = {"mean": sync.mean - mode.mean, "worst seed": sync.worst - mode.worst}
    worse = {name: gap for name, gap in shortfalls.items() if gap > sync.std}
    if not worse:
        return (
            f"within sync's seed spread ({sync.std:.3f}): mean {mode.mean - sync.mean:+.3f}, "
            f"worst seed {mode.worst - sync.worst:+.3f}"
        )
    gaps = ", ".join(f"{name} by {gap:.3f}" for name, gap in worse.items())
    return f"worse than sync beyond its seed spread ({sync.std:.3f}): {gaps}"
