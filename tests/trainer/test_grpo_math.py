"""GRPO advantages, the clipped PG loss with truncated IS, the policy worker's step (chunked,
micro-batched, normalized once) against direct computations, and the engine's prefix-cache age."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
import torch

from asyncgrpo_trainer.algorithms import advantages, losses
from asyncgrpo_trainer.backends import generation, policy, sampling
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tokenizer import CharTokenizer


def test_leave_one_out_baseline_excludes_the_own_reward() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv = advantages.group_relative(r, leave_one_out=True, normalize=False)
    assert torch.allclose(adv, torch.tensor([[1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3]]))


def test_normalization_divides_by_group_std_and_leaves_uniform_groups_at_zero() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = advantages.group_relative(r, leave_one_out=False, normalize=True)
    std = r[0].std()
    assert torch.allclose(adv[0], (r[0] - 0.5) / (std + advantages.EPS))
    assert torch.equal(adv[1], torch.zeros(4))


def test_importance_weights_are_truncated_and_non_finite_ones_zeroed() -> None:
    prev = torch.tensor([0.0, 0.0, 0.0])
    gen = torch.tensor([0.0, -2.0, float("-inf")])
    w, _ = losses.importance_weights(
        prev.unsqueeze(0),
        gen.unsqueeze(0),
        torch.ones(1, 3),
        losses.LossConfig(truncated_importance_sampling_ratio=2.0),
    )
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.0]]))


def test_clipped_loss_matches_a_hand_computation() -> None:
    cfg = losses.LossConfig(
        ratio_clip_min=0.2,
        ratio_clip_max=0.2,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_ratio=None,
    )
    logp = torch.tensor([[math.log(0.5), math.log(0.9)]], requires_grad=True)
    prev = torch.tensor([[math.log(0.25), math.log(0.9)]])
    gen = torch.tensor([[math.log(0.25), math.log(0.45)]])
    adv = torch.tensor([1.0])
    total, m = losses.policy_loss_terms(
        logprobs=logp,
        prev_logprobs=prev,
        generation_logprobs=gen,
        advantages=adv,
        mask=torch.ones(1, 2),
        cfg=cfg,
    )
    # token 0: ratio 2 clipped to 1.2 (A > 0 takes the pessimistic min), weight 1; token 1: ratio 1, weight 2
    assert total.item() == pytest.approx(-1.2 - 2.0, rel=1e-5)
    assert m["clip_fraction_sum"] == 1.0
    total.backward()
    assert logp.grad is not None and logp.grad[0, 0].item() == 0.0  # clipped token has no gradient


def test_the_log_prob_gate_counts_only_samples_of_the_weights_being_trained() -> None:
    """A stale row's engine log-probs came from older weights: the gate must not count the
    policy's own change since then as an engine error."""
    logp = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.5), math.log(0.5)]])
    gen = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.05), math.log(0.05)]])
    terms = dict(logprobs=logp, prev_logprobs=logp, generation_logprobs=gen, advantages=torch.ones(2))
    _, m = losses.policy_loss_terms(
        **terms, mask=torch.ones(2, 2), cfg=losses.LossConfig(), fresh=torch.tensor([1.0, 0.0])
    )
    assert m["fresh_tokens"] == 2.0
    assert m["gen_logprob_error_sum"].item() == pytest.approx(1.0 + 2.0)  # exp|0| + exp|log 2|, row 0 only
    _, everything = losses.policy_loss_terms(**terms, mask=torch.ones(2, 2), cfg=losses.LossConfig())
    assert everything["fresh_tokens"] == 4.0 and everything["gen_logprob_error_sum"].item() == pytest.approx(
        23.0
    )
    totals = policy.StepTotals({**{k: 0.0 for k in policy._SUMMED}, "tokens": 4.0}, 4.0)
    assert totals.metrics(grad_norm=0.0, lr=0.0)["gen_logprob_error"] is None  # no fresh row this step


def test_only_a_fresh_sample_is_weighted_unless_stale_data_is_weighted_too() -> None:
    """Issue 46: weighting one-step-old samples by pi_old / pi_gen halved the learning speed on the
    real-model case and made no difference on the calculator task (5 seeds each), so by default
    only the samples of the weights being trained are weighted; the setting weighs the stale too."""
    logp = torch.tensor([[math.log(0.5)], [math.log(0.5)]], requires_grad=True)
    gen = torch.tensor([[math.log(0.25)], [math.log(0.25)]])  # the engine's: weight 2 on both rows
    fresh = torch.tensor([1.0, 0.0])

    def gradient(cfg: losses.LossConfig) -> tuple[list[float], float]:
        logp.grad = None
        total, m = losses.policy_loss_terms(
            logprobs=logp, prev_logprobs=logp.detach(), generation_logprobs=gen,
            advantages=torch.ones(2), mask=torch.ones(2, 1), cfg=cfg, fresh=fresh,
        )  # fmt: skip
        total.backward()  # type: ignore[no-untyped-call]
        assert logp.grad is not None
        return logp.grad[:, 0].tolist(), float(m["is_weight_sum"])

    assert gradient(losses.LossConfig()) == ([-2.0, -1.0], 3.0)  # the fresh row weighted, the stale one not
    weighted = losses.LossConfig(importance_sampling_on_stale_data=True)
    assert gradient(weighted) == ([-2.0, -2.0], 4.0)
    assert gradient(losses.LossConfig(use_importance_sampling_correction=False)) == ([-1.0, -1.0], 2.0)


def test_kl_penalty_needs_reference_logprobs_and_is_zero_at_the_reference() -> None:
    cfg = losses.LossConfig(reference_policy_kl_penalty=0.1, use_importance_sampling_correction=False)
    logp = torch.tensor([[-1.0, -2.0]])
    with pytest.raises(ValueError, match="reference_logprobs"):
        losses.policy_loss_terms(
            logprobs=logp,
            prev_logprobs=logp,
            generation_logprobs=logp,
            advantages=torch.zeros(1),
            mask=torch.ones(1, 2),
            cfg=cfg,
        )
    _, m = losses.policy_loss_terms(
        logprobs=logp,
        prev_logprobs=logp,
        generation_logprobs=logp,
        advantages=torch.zeros(1),
        mask=torch.ones(1, 2),
        cfg=cfg,
        reference_logprobs=logp,
    )
    assert m["kl_sum"] == 0.0


TOK = CharTokenizer("0123456789+=")
BUILD = recipe.tiny_build(
    TOK,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=None,
    max_sequence_length=24,
    position_embedding="rope",
    dtype="float32",
    seed=3,
)


def _rows(n: int) -> list[policy.TrainRow]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        prompt = TOK.encode(f"{i % 10}+{(3 * i) % 10}=")
        length = 1 + i % 4
        resp = torch.randint(3, TOK.vocab_size, (length,), generator=g).tolist()
        gen = (-torch.rand(length, generator=g) * 3).tolist()
        rows.append(policy.TrainRow(prompt, resp, gen, float(torch.randn(1, generator=g))))
    return rows


def _worker(micro: int) -> policy.TorchPolicyWorker:
    optim = policy.OptimConfig(
        learning_rate=1e-3,
        weight_decay=0.0,
        max_grad_norm=0.5,
        warmup_steps=0,
        micro_batch_size=micro,
        logprob_batch_size=micro,
        temperature=1.0,
    )
    return policy.TorchPolicyWorker(BUILD, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu")


def _direct_grad_norm(rows: list[policy.TrainRow]) -> float:
    """One forward/backward over all rows, loss divided by the global token count."""
    model = BUILD.instantiate()
    logp, mask = sampling.token_logprobs(
        model,
        [(r.prompt_ids, r.response_ids) for r in rows],
        pad_id=TOK.pad_id,
        temperature=1.0,
        device=torch.device("cpu"),
        grad=True,
    )
    gen = torch.zeros_like(mask)
    for i, r in enumerate(rows):
        gen[i, : len(r.generation_logprobs)] = torch.tensor(r.generation_logprobs)
    total, _ = losses.policy_loss_terms(
        logprobs=logp,
        prev_logprobs=logp.detach(),
        generation_logprobs=gen,
        advantages=torch.tensor([r.advantage for r in rows]),
        mask=mask,
        cfg=losses.LossConfig(),
    )
    (total / mask.sum()).backward()
    return float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None)))


def test_grad_norm_of_a_chunked_microbatched_step_equals_the_direct_global_gradient_norm() -> None:
    rows = _rows(12)
    expected = _direct_grad_norm(rows)
    worker = _worker(micro=5)
    worker.train_chunk(rows[:4])  # streaming: three chunks, micro-batches of 5 inside
    worker.train_chunk(rows[4:9])
    worker.train_chunk(rows[9:])
    out = worker.finish_step()
    assert out["grad_norm"] == pytest.approx(expected, rel=1e-4)
    assert out["grad_norm"] > 0.5  # so clipping (max 0.5) happened after the norm was taken
    assert out["train_tokens"] == sum(len(r.response_ids) for r in rows)


def test_an_optimizer_step_changes_the_weights_and_the_next_step_starts_from_zero_gradients() -> None:
    rows = _rows(6)
    worker = _worker(micro=6)
    before = {k: v.clone() for k, v in worker.weights().items()}
    worker.train_chunk(rows)
    first = worker.finish_step()["grad_norm"]
    assert any(not torch.equal(before[k], v) for k, v in worker.weights().items())
    worker.train_chunk(rows)
    second = worker.finish_step()["grad_norm"]
    assert second != first and second < 10 * first  # not accumulated on top of the previous step


def test_a_cached_prompt_is_prefilled_again_once_it_is_older_than_the_staleness_bound() -> None:
    engine = generation.TorchGenerationWorker(BUILD, device="cpu", max_prefix_age=1)
    params = sampling.SamplingParams(max_new_tokens=2)
    prompt = TOK.encode("1+2=")
    weights = BUILD.instantiate().state_dict()

    async def scenario() -> list[float]:
        hits = []
        for version in (0, 0, 1, 2, 2):
            await engine.load_weights(weights, version)
            await engine.generate(prompt, 2, params, seed=0)
            hits.append(engine.prefix_hits)
        return hits

    # v0 computes, v0 and v1 reuse (age <= 1), v2 recomputes (age 2), v2 reuses again
    assert asyncio.run(scenario()) == [0, 1, 2, 2, 3]


def test_the_learning_rate_warms_up_then_falls_down_a_half_cosine_to_its_floor() -> None:
    """Hand-computed: peak 1.0, 2 warm-up steps, 6 optimizer steps in all, floor 0.1. The cosine
    spans steps 2..5: step 3 is a third of the way, 0.1 + 0.9 x (1 + cos(pi/3)) / 2 = 0.775."""
    optim = policy.OptimConfig(
        learning_rate=1.0,
        weight_decay=0.0,
        max_grad_norm=None,
        warmup_steps=2,
        micro_batch_size=1,
        logprob_batch_size=1,
        temperature=1.0,
        schedule="cosine",
        min_lr_ratio=0.1,
        total_steps=6,
    )
    rates = [policy.learning_rate_at(optim, step) for step in range(7)]
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.325, 0.1, 0.1])
    constant = dataclasses.replace(optim, schedule="constant")
    assert [policy.learning_rate_at(constant, step) for step in range(4)] == [0.5, 1.0, 1.0, 1.0]
