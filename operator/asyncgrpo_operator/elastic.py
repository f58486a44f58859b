"""The elastic generation fleet's rule, as a pure function: (the job's generation pool, the driver's
recent step windows, the fleet's size now, its last change, the time) -> the size it should have.

The windows are the driver's measurements (`observed.FleetWindow`, trainer `occupancy.py`): in each
step, the share of the time the policy waited for rollouts, and the share the generation engines
sat idle while the staleness gate held groups back.

- Grow by one, below maxReplicas, when the policy waited for more than `policyIdleAbove` of each of
  the last `windowSteps` windows: generation is the bottleneck.
- Shrink by one, above minReplicas, when the engines sat idle behind the gate for more than
  `generationGatedAbove` of each of them while the policy waited less than half of
  `policyIdleAbove`: the engines wait for the trainer, and one fewer would too.

What keeps it from flapping: the two rules read different signals, and between "starved" (above
policyIdleAbove) and "fed with room to spare" (below half of it) is a band where neither acts; every
one of `windowSteps` consecutive windows must agree, and only windows that began after the last
change count, so a change is judged on the fleet it made; and no two changes come within
`cooldownSeconds`. A load that sits at a threshold therefore changes the fleet at most once
(tests/operator/test_elastic_fleet.py replays such traces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from asyncgrpo_api.v1alpha1.placement import GenerationWorkerGroup
from asyncgrpo_operator.observed import FleetWindow

Direction = Literal["up", "down"]

SCALED_UP = "GenerationScaledUp"
DRAIN_REQUESTED = "GenerationDrainRequested"
SCALED_DOWN = "GenerationScaledDown"
DRAIN_REFUSED = "GenerationDrainRefused"
"""A Warning: the driver answered the drain request with a 4xx (the answer is quoted)."""


@dataclass(frozen=True)
class LastChange:
    """When the fleet last changed, and the driver's step then."""

    at: datetime
    step: int


@dataclass(frozen=True)
class Change:
    """The fleet's next size and why, with the numbers that decided it."""

    direction: Direction
    replicas: int
    message: str


def decide(
    pool: GenerationWorkerGroup,
    windows: Sequence[FleetWindow],
    current: int,
    last: LastChange | None,
    now: datetime,
) -> Change | None:
    """The change the rule makes now, or None to keep the fleet as it is (see the module docstring).
    `windows` are oldest first; `current` is the generation group's replicas."""
    if not pool.elastic:
        return None
    rule = pool.autoscaling
    if last is not None and (now - last.at).total_seconds() < rule.cooldown_seconds:
        return None
    fresh = [w for w in windows if last is None or w.step > last.step]
    if len(fresh) < rule.window_steps:
        return None
    recent = fresh[-rule.window_steps :]
    steps = f"step {recent[0].step}" if len(recent) == 1 else f"steps {recent[0].step}-{recent[-1].step}"
    policy = ", ".join(f"{w.policy_idle_share:.0%}" for w in recent)
    if all(w.policy_idle_share > rule.policy_idle_above for w in recent):
        if current >= pool.most:
            return None
        return Change(
            "up",
            current + 1,
            f"the policy waited for rollouts {policy} of {steps}, above autoscaling.policyIdleAbove "
            f"{rule.policy_idle_above:.0%}: generation workers {current} -> {current + 1} "
            f"(maxReplicas {pool.most})",
        )
    fed = rule.policy_idle_above / 2
    gate = rule.generation_gated_above
    if all(w.generation_gated_share > gate and w.policy_idle_share < fed for w in recent):
        if current <= pool.fewest:
            return None
        gated = ", ".join(f"{w.generation_gated_share:.0%}" for w in recent)
        return Change(
            "down",
            current - 1,
            f"the generation engines sat idle behind the staleness gate {gated} of {steps}, above "
            f"autoscaling.generationGatedAbove {rule.generation_gated_above:.0%}, while the policy waited "
            f"{policy}, below half of policyIdleAbove ({fed:.0%}): generation workers {current} -> "
            f"{current - 1} (minReplicas {pool.fewest})",
        )
    return None
