"""Group-relative advantages (GRPO).

Every row of a prompt group is compared with the other rows of the same group: the baseline is
the group mean, or with leave-one-out the mean of the other N-1 rewards (an unbiased baseline:
it does not include the row's own reward). With normalization the result is divided by the
group's reward standard deviation, only where that is positive, so a group whose rows all got
the same reward gets zero advantage instead of a division blow-up.
"""

from __future__ import annotations

import torch

EPS = 1e-6


def group_relative(rewards: torch.Tensor, *, leave_one_out: bool, normalize: bool) -> torch.Tensor:
    """rewards (G, N) -> advantages (G, N), one per sample of each of G prompt groups."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (groups, samples), got shape {tuple(rewards.shape)}")
    n = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)
    loo = (rewards.sum(dim=1, keepdim=True) - rewards) / max(n - 1, 1)
    baseline = loo if leave_one_out and n > 1 else mean
    adv = rewards - baseline
    if normalize and n > 1:
        std = rewards.std(dim=1, keepdim=True)
        adv = torch.where(std > 0, adv / (std + EPS), adv)
    return adv
