"""The GRPO variants of `loss`, each against a computation done by hand: Dr. GRPO's constant
normaliser, GSPO's sequence-level ratio and weight, NeMo-RL's three truncations of the importance
weight (tis, icepop, seq-mask-tis) per token and per sequence, and the entropy estimate."""

from __future__ import annotations

import math

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from tests.trainer.test_grpo_math import _rows, _worker

LOG = math.log


def _row(advantage: float, generation: list[float]) -> policy.TrainRow:
    return policy.TrainRow([1], [2] * len(generation), generation, advantage)


def test_dr_grpo_divides_by_samples_times_the_length_budget_not_by_the_tokens() -> None:
    """Two samples of 3 and 1 tokens, budget 5: the gradient of each token is -A w / (2 x 5);
    with the token mean it would be -A w / 4."""
    gen = [[LOG(0.5), LOG(0.5), LOG(0.5)], [LOG(0.25)]]
    rows = [_row(1.0, gen[0]), _row(-2.0, gen[1])]
    logp = torch.tensor([[LOG(0.5)] * 3, [LOG(0.5), 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # weights pi_old / pi_gen: 1 for row 0, 2 for row 1 (under the cap of 2)
    expected = torch.tensor([[-1.0, -1.0, -1.0], [4.0, 0.0, 0.0]])
    for cfg, count in (
        (losses.LossConfig(constant_normalizer=5), 10.0),
        (losses.LossConfig(), 4.0),
    ):
        x = torch.nn.Parameter(logp.clone())
        acc = policy.StepAccumulator(cfg, torch.device("cpu"))
        acc.backward(rows, x, mask)
        totals = acc.reduce([x], None)
        assert totals.count == count
        assert x.grad is not None and torch.allclose(x.grad, expected / count)
        assert totals.metrics(grad_norm=0.0, lr=0.0)["loss"] == pytest.approx((-3.0 + 4.0) / count)


def test_dr_grpo_in_the_policy_worker_scales_the_global_gradient_by_tokens_over_the_budget() -> None:
    rows = _rows(8)
    tokens = sum(len(r.response_ids) for r in rows)
    plain, constant = _worker(micro=3), _worker(micro=3)
    constant.loss_cfg = losses.LossConfig(constant_normalizer=6)
    constant._reset_step()
    for w in (plain, constant):
        w.train_chunk(rows)
    mean_norm = plain.finish_step()["grad_norm"]
    dr_norm = constant.finish_step()["grad_norm"]
    assert mean_norm is not None and dr_norm is not None
    assert dr_norm == pytest.approx(mean_norm * tokens / (8 * 6), rel=1e-5)


def _terms(
    cfg: losses.LossConfig, logp: torch.Tensor, **kw: torch.Tensor
) -> tuple[torch.Tensor, dict, torch.Tensor]:
    x = logp.clone().requires_grad_(True)
    total, metrics = losses.policy_loss_terms(
        logprobs=x,
        prev_logprobs=kw.get("prev", logp),
        generation_logprobs=kw.get("gen", logp),
        advantages=kw.get("adv", torch.ones(logp.shape[0])),
        mask=kw.get("mask", torch.ones_like(logp)),
        cfg=cfg,
    )
    total.backward()  # type: ignore[no-untyped-call]
    assert x.grad is not None
    return total, metrics, x.grad


def test_gspo_clips_the_geometric_mean_of_the_token_ratios_and_spreads_its_gradient() -> None:
    """Token ratios 2 and 0.5, A = 1, clip [0.8, 1.2]. GSPO: the sequence ratio is sqrt(2 x 0.5) = 1,
    inside the clip, so the loss is -1 and each token gets -A x 1 / 2. Per token: the first ratio is
    clipped at 1.2 (no gradient), the second gives -0.5; the sequence mean is (-1.2 - 0.5) / 2."""
    logp = torch.tensor([[LOG(0.5), LOG(0.2)]])
    prev = torch.tensor([[LOG(0.25), LOG(0.4)]])
    base = dict(
        ratio_clip_min=0.2,
        ratio_clip_max=0.2,
        token_level_loss=False,
        use_importance_sampling_correction=False,
    )
    total, m, grad = _terms(losses.LossConfig(**base, sequence_level_importance_ratios=True), logp, prev=prev)
    assert total.item() == pytest.approx(-1.0)
    assert torch.allclose(grad, torch.tensor([[-0.5, -0.5]]))
    assert m["clip_fraction_sum"].item() == 0.0
    total, m, grad = _terms(losses.LossConfig(**base), logp, prev=prev)
    assert total.item() == pytest.approx(-0.85)
    assert torch.allclose(grad, torch.tensor([[0.0, -0.25]]))
    assert m["clip_fraction_sum"].item() == 2.0  # both token ratios are outside [0.8, 1.2]
    # Both token ratios 2: the sequence ratio 2 is clipped as a whole, both tokens lose their gradient.
    total, m, grad = _terms(
        losses.LossConfig(**base, sequence_level_importance_ratios=True), logp, prev=logp - LOG(2.0)
    )
    assert total.item() == pytest.approx(-1.2)
    assert not grad.any() and m["clip_fraction_sum"].item() == 2.0


# Rows of token weights pi_old / pi_gen and what each truncation makes of them, bounds [0.5, 2].
TOKEN_WEIGHTS = [[3.0, 1.0, 0.2], [4.0, 4.0, 1.0]]
TRUNCATED = {
    # clamp each token into [0.5, 2]
    ("tis", False): [[2.0, 1.0, 0.5], [2.0, 2.0, 1.0]],
    # zero each token outside [0.5, 2]
    ("icepop", False): [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
    # geometric means (0.6)^(1/3) = 0.84 (kept, untruncated) and 16^(1/3) = 2.52 (dropped)
    ("seq-mask-tis", False): [[3.0, 1.0, 0.2], [0.0, 0.0, 0.0]],
    # sequence weights (products) 0.6 and 16: clamped to 0.6 and 2
    ("tis", True): [[0.6] * 3, [2.0] * 3],
    # sequence weights 0.6 (kept) and 16 (zeroed)
    ("icepop", True): [[0.6] * 3, [0.0] * 3],
}
OUT_OF_BOUNDS = {
    ("tis", False): [[1, 0, 1], [1, 1, 0]],
    ("icepop", False): [[1, 0, 1], [1, 1, 0]],
    ("seq-mask-tis", False): [[0, 0, 0], [1, 1, 1]],
    ("tis", True): [[0, 0, 0], [1, 1, 1]],
    ("icepop", True): [[0, 0, 0], [1, 1, 1]],
}


@pytest.mark.parametrize(
    ("kind", "sequence"), list(TRUNCATED), ids=[f"{k}-{'seq' if s else 'tok'}" for k, s in TRUNCATED]
)
def test_each_truncation_of_the_importance_weight_matches_nemo_rl_by_hand(kind: str, sequence: bool) -> None:
    gen = torch.full((2, 3), LOG(0.1))
    prev = gen + torch.tensor(TOKEN_WEIGHTS).log()
    cfg = losses.LossConfig(
        truncated_importance_sampling_type=kind,
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
        sequence_level_importance_ratios=sequence,
    )
    w, out = losses.importance_weights(prev, gen, torch.ones(2, 3), cfg)
    assert torch.allclose(w, torch.tensor(TRUNCATED[kind, sequence]), rtol=1e-5)
    assert torch.equal(out, torch.tensor(OUT_OF_BOUNDS[kind, sequence], dtype=torch.float32))
    # In the loss (A = 1, ratio 1): each token's loss is -w, its gradient -w.
    total, m, grad = _terms(cfg, prev, gen=gen)
    assert torch.allclose(grad, -w) and total.item() == pytest.approx(-w.sum().item(), rel=1e-5)
    assert m["is_out_of_bounds_sum"].item() == out.sum().item()


def test_the_lower_bound_and_an_uncapped_weight_with_tis() -> None:
    gen = torch.full((1, 3), LOG(0.1))
    prev = gen + torch.tensor([[50.0, 1.0, 0.1]]).log()
    uncapped = losses.LossConfig(
        truncated_importance_sampling_ratio=None, truncated_importance_sampling_ratio_min=0.5
    )
    w, out = losses.importance_weights(prev, gen, torch.ones(1, 3), uncapped)
    assert torch.allclose(w, torch.tensor([[50.0, 1.0, 0.5]]), rtol=1e-5)
    assert out.tolist() == [[0.0, 0.0, 1.0]]


def test_a_masked_token_weighs_nothing_in_a_sequence_weight_and_a_token_cut_by_the_filter_zeroes_it() -> None:
    gen = torch.tensor([[LOG(0.1), LOG(0.1), 0.0], [LOG(0.1), LOG(0.1), LOG(0.1)]])
    prev = torch.tensor([[LOG(0.2), LOG(0.1), float("-inf")], [LOG(0.2), float("-inf"), LOG(0.1)]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    cfg = losses.LossConfig(sequence_level_importance_ratios=True, truncated_importance_sampling_ratio=None)
    w, _ = losses.importance_weights(prev, gen, mask, cfg)
    assert torch.allclose(w, torch.tensor([[2.0] * 3, [0.0] * 3]))


def test_the_entropy_estimate_is_the_importance_weighted_surprise_by_hand() -> None:
    logp = torch.tensor([[LOG(0.5), LOG(0.25)]])
    gen = torch.tensor([[LOG(0.25), LOG(0.25)]])
    est = losses.entropy_estimate(logp, gen)
    assert torch.allclose(est, torch.tensor([[2 * LOG(2.0), LOG(4.0)]]))
    _, m, _ = _terms(losses.LossConfig(), logp, gen=gen)
    assert m["entropy_sum"].item() == pytest.approx(2 * LOG(2.0) + LOG(4.0))


def test_the_entropy_estimate_recovers_the_policys_entropy_from_another_policys_samples() -> None:
    """Tokens drawn from pi_gen, scored by pi_theta: the mean estimate is H(pi_theta); the plain
    mean surprise -log pi_theta is not (it weighs the tokens as pi_gen chose them)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.7, 0.1, 0.1, 0.1])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    tokens = torch.multinomial(q, 200_000, replacement=True, generator=g)
    logp, gen = p.log()[tokens].unsqueeze(0), q.log()[tokens].unsqueeze(0)
    exact = -(p * p.log()).sum().item()
    assert losses.entropy_estimate(logp, gen).mean().item() == pytest.approx(exact, rel=0.02)
    assert (-logp).mean().item() > 1.3 * exact
