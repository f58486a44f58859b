"""The clipped policy-gradient loss with truncated importance-sampling (TIS) correction, and KL.

Inputs per token, shapes (B, T) with a 0/1 `mask` of response tokens:
- `logprobs`: log pi_theta (the only input with a gradient);
- `prev_logprobs`: log pi_old, the policy at the start of the RL step (the PPO ratio's
  denominator; with several optimizer steps per RL step, PPO mini-batches, it is the log-prob
  before the first of them, so from the second mini-batch on the ratio moves and clipping acts);
- `generation_logprobs`: log pi_gen as recorded by the generation worker when it sampled the token,
  possibly several versions older than pi_old, under the sampler's temperature, top-k and top-p;
- `importance_logprobs`: log pi_old under that same sampling filter (the engine's distribution of
  pi_old's weights), so that the importance weight compares one distribution on both sides;
  unset means `prev_logprobs` (right when the sampler does not filter);
- `reference_logprobs`: log pi_ref, only when the KL penalty is on.

loss_t = w_t * max(-A * r_t, -A * clip(r_t, 1 - eps_lo, 1 + eps_hi))  [dual clip: min with -c A, A<0]
         + beta * KL_t(pi_theta || pi_ref)
with r_t = exp(logprobs - prev_logprobs) and w_t = min(exp(importance_logprobs -
generation_logprobs), C), detached (nan/inf -> 0). The step's loss is the sum over all tokens
divided once by the global number of response tokens (token-level loss) or the per-sequence means
summed and divided by the number of sequences. The caller passes that global normalizer, so that
streaming a step in chunks and splitting it over data-parallel ranks gives exactly the loss of one
big batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.28
    ratio_clip_c: float | None = None
    use_importance_sampling_correction: bool = True
    truncated_importance_sampling_ratio: float | None = 2.0
    reference_policy_kl_penalty: float = 0.0
    kl_type: str = "k3"
    token_level_loss: bool = True


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman's k1/k2/k3)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        return (log_ratio.exp() - 1.0 - log_ratio).clamp(max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}")


def importance_weights(
    prev_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, cap: float | None
) -> torch.Tensor:
    """w = pi_old / pi_gen per token, truncated at `cap`, non-finite values zeroed; no gradient."""
    w = torch.exp(prev_logprobs.detach() - generation_logprobs.detach())
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    return w.clamp(max=cap) if cap is not None else w


def policy_loss_terms(
    *,
    logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    reference_logprobs: torch.Tensor | None = None,
    importance_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Unnormalized loss: sum over tokens (token-level) or sum of per-sequence means, and metrics.

    Divide the result by the global normalizer of the step (tokens or sequences), once.
    advantages may be (B,) per sequence or (B, T) per token. The metrics are 0-dim tensors on the
    inputs' device, so a caller can accumulate them without stalling the device queue; rows whose
    mask is all zero add nothing to the loss, its gradient or any metric.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    mask = mask.to(logprobs.dtype)
    behaviour = prev_logprobs if importance_logprobs is None else importance_logprobs
    ratio = torch.exp(logprobs - prev_logprobs.detach())
    clipped = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
    if cfg.ratio_clip_c is not None:
        dual = torch.minimum(per_token, -advantages * cfg.ratio_clip_c)
        per_token = torch.where(advantages < 0, dual, per_token)
    if cfg.use_importance_sampling_correction:
        weights = importance_weights(behaviour, generation_logprobs, cfg.truncated_importance_sampling_ratio)
    else:
        weights = torch.ones_like(per_token)
    per_token = weights * per_token
    kl = torch.zeros_like(per_token)
    if cfg.reference_policy_kl_penalty > 0:
        if reference_logprobs is None:
            raise ValueError("reference_logprobs are required when referencePolicyKlPenalty > 0")
        kl = kl_estimate(logprobs, reference_logprobs, cfg.kl_type)
        per_token = per_token + cfg.reference_policy_kl_penalty * kl
    if cfg.token_level_loss:
        total = (per_token * mask).sum()
    else:
        total = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        clip_hit = ((ratio < 1.0 - cfg.ratio_clip_min) | (ratio > 1.0 + cfg.ratio_clip_max)).to(mask.dtype)
        weighted = weights * mask  # weights are >= 0, so the max of an all-masked batch is 0
        metrics = {
            "tokens": mask.sum(),
            "is_weight_sum": weighted.sum(),
            "is_weight_max": weighted.amax() if weighted.numel() else weighted.new_zeros(()),
            "clip_fraction_sum": (clip_hit * mask).sum(),
            "kl_sum": (kl * mask).sum(),
            # A token the filter of pi_old cuts has log-weight -inf (weight 0): left out here.
            "gen_kl_sum": (torch.nan_to_num(behaviour - generation_logprobs, neginf=0.0) * mask).sum(),
            # NeMo-RL's token_mult_prob_error: exp|logp_pi_old - logp_engine|, 1 when they agree.
            "gen_logprob_error_sum": (
                torch.nan_to_num(behaviour - generation_logprobs, neginf=-20.0).abs().clamp(max=20.0).exp()
                * mask
            ).sum(),
            # -log pi of the sampled tokens: a Monte Carlo estimate of the per-token entropy.
            "entropy_sum": (-logprobs.detach() * mask).sum(),
            "ratio_mean": (ratio * mask).sum() / n,
        }
    return total, metrics
