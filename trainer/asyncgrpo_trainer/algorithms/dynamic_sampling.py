"""DAPO's dynamic sampling: keep only prompt groups that carry a gradient, within a per-step cap.

A group whose N samples all got the same reward has zero advantage (`advantages.group_relative`),
so it adds no policy gradient, yet it takes one of the step's P places and its tokens still count
in the loss's normalizer. Late in training most groups are all right, early most are all wrong, and
the effective batch shrinks with them. DAPO (Yu et al. 2025, section 3.2) drops such groups and
samples more prompts until the batch is full of informative ones.

`DynamicSampling.keep` is the one decision the controller asks for every scored group, in every
async mode (the rollout side, before a group enters the replay buffer): a dropped group is
replaced by the loader's next prompt for the same step, as a group whose scoring failed is. Each
step may replace at most `max_extra_groups`; after that its uninformative groups are kept as they
are (plain GRPO for the rest of the step) rather than generating without bound while a policy that
answers every prompt the same way stalls the run, and the step's record says the cap was hit.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field


def informative(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ, so its advantages are not all zero."""
    return max(rewards) != min(rewards)


@dataclass(frozen=True)
class StepReport:
    """What dynamic sampling did for one step, for its step record."""

    dropped: int
    """Uninformative groups dropped (each replaced by a newly generated group)."""
    cap_hit: bool
    """Whether an uninformative group was kept because the step had used up its replacements."""


@dataclass
class DynamicSampling:
    """Per-step accounting of dropped groups; `max_extra_groups` None turns the filter off."""

    max_extra_groups: int | None
    dropped: collections.Counter[int] = field(default_factory=collections.Counter)
    capped: set[int] = field(default_factory=set)

    def keep(self, step: int, rewards: Sequence[float]) -> bool:
        """Whether the group scored for `step` is trained on; False: drop it and generate another."""
        if self.max_extra_groups is None or informative(rewards):
            return True
        if self.dropped[step] < self.max_extra_groups:
            self.dropped[step] += 1
            return False
        self.capped.add(step)
        return True

    def report(self, step: int) -> StepReport:
        """The step's figures, forgotten once read (the step is trained)."""
        capped = step in self.capped
        self.capped.discard(step)
        return StepReport(dropped=self.dropped.pop(step, 0), cap_hit=capped)
