"""DAPO's soft overlong punishment: a reward penalty that grows over the last tokens of the budget.

A response cut at maxNewTokens usually scores 0, the same as a wrong answer of any length, so
GRPO cannot tell a policy that its answers run long until they are cut; and punishing a cut
response hard punishes its reasoning with it. DAPO adds a penalty that starts L_cache tokens
before the limit L_max and falls linearly to -1 at it (Yu et al. 2025, eq. 13), for response
length |y|:

    0                               if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
    -1                              if |y| > L_max

It is added to the environment's reward before advantages are computed (`rollout.RolloutManager`),
so a group's samples also compete on length near the limit. |y| counts every generated token,
end-of-sequence included, as generation.maxNewTokens does: a cut response has |y| = L_max.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OverlongPenalty:
    """The penalty of spec.trainer.grpo.overlongPenaltyTokens (band = L_cache, max_tokens = L_max)."""

    max_tokens: int
    band: int

    def __post_init__(self) -> None:
        if not 1 <= self.band <= self.max_tokens:
            raise ValueError(f"the penalty band ({self.band}) must be 1 to max_tokens ({self.max_tokens})")

    def __call__(self, length: int) -> float:
        """The penalty (0 to -1) of a response of `length` tokens."""
        start = self.max_tokens - self.band
        if length <= start:
            return 0.0
        if length <= self.max_tokens:
            return (start - length) / self.band
        return -1.0
