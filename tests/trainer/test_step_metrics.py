"""Per-step metrics of off-policy training (issue 46 item 6), on a hand-made batch: the KL between
the weights that generated the step's tokens and the weights trained (k3), and the share of tokens
whose importance weight the truncation changed."""

from __future__ import annotations

import math

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy


def test_the_behaviour_kl_and_the_truncated_share_of_a_hand_made_batch() -> None:
    # Three trained tokens whose pi_old / pi_gen is 1, 3 and 1/2, and a fourth masked out; TIS caps
    # the weight at 2, so only the second is truncated.
    gen = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    old = gen + torch.log(torch.tensor([[1.0, 3.0, 0.5, 7.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    _, metrics = losses.policy_loss_terms(
        logprobs=old.clone(),
        prev_logprobs=old,
        generation_logprobs=gen,
        advantages=torch.tensor([1.0]),
        mask=mask,
        cfg=losses.LossConfig(truncated_importance_sampling_ratio=2.0),
    )
    # k3 per token: r - 1 - log r, with r = pi_old / pi_gen on tokens pi_gen sampled.
    k3 = [0.0, 3.0 - 1.0 - math.log(3.0), 0.5 - 1.0 - math.log(0.5)]
    assert float(metrics["behaviour_kl_sum"]) == pytest.approx(sum(k3), rel=1e-5)
    assert float(metrics["is_out_of_bounds_sum"]) == 1.0
    sums = {k: 0.0 for k in policy._SUMMED} | {k: float(v) for k, v in metrics.items() if k in policy._SUMMED}
    step = policy.StepTotals(sums | {"loss_sum": 0.0, "sequences": 1.0}, 3.0).metrics(grad_norm=0.0, lr=0.0)
    assert step["behaviour_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert step["is_out_of_bounds"] == pytest.approx(1 / 3)
