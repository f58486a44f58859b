"""PPO mini-batches, the dual clip and top-k / top-p importance weights: the torch policy step
against hand computations with plain torch (the same model, loss function and AdamW, stepped by
hand), so that no knob of the loss is accepted and then left without effect."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import generation, policy, sampling
from asyncgrpo_trainer.models import recipe as modelspec
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

TOK = CharTokenizer("0123456789=")
BUILD = modelspec.tiny_build(
    TOK,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=None,
    max_sequence_length=24,
    position_embedding="learned",
    dtype="float32",
    seed=3,
)
CPU = torch.device("cpu")
LR = 0.05
"""Large, so that the second mini-batch sees ratios far from 1 (at 1e-3 the ratios stay within
1e-5 of 1 and pi_old from after the first update would look the same)."""
LOSS = losses.LossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28, truncated_importance_sampling_ratio=2.0)


def _rows(n: int, seed: int = 0) -> list[policy.TrainRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        prompt = TOK.encode(f"{i % 10}{(3 * i) % 10}{(7 * i) % 10}=")
        length = 1 + i % 4
        resp = torch.randint(3, TOK.vocab_size, (length,), generator=g).tolist()
        gen = (-torch.rand(length, generator=g) * 3).tolist()
        rows.append(policy.TrainRow(prompt, resp, gen, float(torch.randn(1, generator=g))))
    return rows


def _optim(**changes: object) -> policy.OptimConfig:
    base: dict[str, object] = {
        "learning_rate": LR,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "warmup_steps": 0,
        "micro_batch_size": 4,
        "logprob_batch_size": 4,
        "temperature": 1.0,
    }
    return policy.OptimConfig(**{**base, **changes})  # type: ignore[arg-type]


def _worker(optim: policy.OptimConfig, loss: losses.LossConfig = LOSS) -> policy.TorchPolicyWorker:
    return policy.TorchPolicyWorker(BUILD, optim, loss, rank=0, world_size=1, device="cpu")


def _logprobs(
    model: torch.nn.Module, rows: list[policy.TrainRow], *, grad: bool = False, params: object = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return sampling.token_logprobs(
        model,  # type: ignore[arg-type]
        [(r.prompt_ids, r.response_ids) for r in rows],
        pad_id=TOK.pad_id,
        device=CPU,
        params=params,  # type: ignore[arg-type]
        grad=grad,
    )


def _ragged(values: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(mask.shape)
    for i, row in enumerate(values):
        out[i, : len(row)] = torch.tensor(row)
    return out


def test_mini_batches_take_one_optimizer_step_each_with_pi_old_from_before_the_first() -> None:
    rows = _rows(12)
    worker = _worker(_optim(minibatches=2))
    worker.train_chunk(rows[:5])  # streamed in two chunks; the updates wait for finish_step
    worker.train_chunk(rows[5:])
    assert worker.steps_taken == 0
    got = worker.finish_step()

    # By hand: pi_old of every row under the initial weights, then two AdamW steps, each on one
    # half of the rows in arrival order, with the loss normalized by that half's token count.
    model = BUILD.instantiate()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    old, _ = _logprobs(model, rows)
    losses_, clipped, tokens = [], 0.0, 0.0
    for part in (slice(0, 6), slice(6, 12)):
        logp, mask = _logprobs(model, rows[part], grad=True)
        total, m = losses.policy_loss_terms(
            logprobs=logp,
            prev_logprobs=old[part, : mask.shape[1]],
            generation_logprobs=_ragged([r.generation_logprobs for r in rows[part]], mask),
            advantages=torch.tensor([r.advantage for r in rows[part]]),
            mask=mask,
            cfg=LOSS,
        )
        (total / m["tokens"]).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses_.append(float(total.detach() / m["tokens"]))
        clipped += float(m["clip_fraction_sum"])
        tokens += float(m["tokens"])

    assert worker.steps_taken == 2 and got["optimizer_steps"] == 2
    # Equal up to float noise that Adam scales up where a gradient is near 0 (the micro-batch and
    # chunk shapes differ); pi_old taken after the first update would change the second update.
    for name, value in model.state_dict().items():
        # measured: at most LR / 20 apart; pi_old after the first update: 1.7 x LR
        assert torch.allclose(worker.model.state_dict()[name], value, rtol=0, atol=LR / 10), name
    assert got["loss"] == pytest.approx(sum(losses_) / 2, rel=1e-3)
    assert got["clip_fraction"] == pytest.approx(clipped / tokens, abs=1.01 / tokens) and clipped > 0
    assert got["train_tokens"] == tokens


def test_only_a_second_mini_batch_can_clip() -> None:
    rows = _rows(12)
    single, split = _worker(_optim()), _worker(_optim(minibatches=2))
    single.train_chunk(rows)
    out = single.finish_step()
    assert out["clip_fraction"] == 0.0 and "optimizer_steps" not in out  # ratio 1: nothing to clip
    split.train_chunk(rows)
    assert split.finish_step()["clip_fraction"] > 0
    assert any(
        not torch.equal(a, b)
        for a, b in zip(single.weights().values(), split.weights().values(), strict=True)
    )


def test_the_dual_clip_caps_the_loss_of_a_negative_advantage_at_c_times_its_size() -> None:
    # ratio 5 on a token with advantage -1: the clipped objective keeps -A * 5 = 5 (the pessimistic
    # max), the dual clip with c = 3 caps it at 3 and stops its gradient.
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    prev = torch.tensor([[math.log(0.1)]])
    terms = {
        "logprobs": logp,
        "prev_logprobs": prev,
        "generation_logprobs": prev,
        "advantages": torch.tensor([-1.0]),
        "mask": torch.ones(1, 1),
    }
    plain, _ = losses.policy_loss_terms(**terms, cfg=losses.LossConfig())  # type: ignore[arg-type]
    assert plain.item() == pytest.approx(5.0)
    dual, m = losses.policy_loss_terms(**terms, cfg=losses.LossConfig(ratio_clip_c=3.0))  # type: ignore[arg-type]
    assert dual.item() == pytest.approx(3.0) and m["clip_fraction_sum"] == 1.0
    dual.backward()
    assert logp.grad is not None and logp.grad.item() == 0.0
    positive, _ = losses.policy_loss_terms(  # type: ignore[arg-type]
        **{**terms, "advantages": torch.tensor([1.0])}, cfg=losses.LossConfig(ratio_clip_c=3.0)
    )
    assert positive.item() == pytest.approx(-1.28)  # A > 0: only the upper clip, 1 + 0.28


@pytest.mark.parametrize(("top_p", "top_k"), [(0.7, None), (1.0, 3), (0.8, 5)])
def test_with_top_k_or_top_p_the_importance_weight_is_one_when_the_weights_are_equal(
    top_p: float, top_k: int | None
) -> None:
    """The engine records log-probs of the filtered, renormalized distribution; the policy scores
    pi_old under the same filter, so data from the current weights gets weight exactly 1. (Compared
    with the unfiltered pi_old, every weight would be below 1.)"""
    model = BUILD.instantiate()
    sampler = sampling.Filter(1.0, top_p, top_k)
    engine = generation.TorchGenerationWorker(BUILD, device="cpu")  # the initial weights too
    rows = []
    for i in range(6):
        prompt = TOK.encode(f"{i}{i + 1}{i + 2}=")
        out = asyncio.run(engine.generate(prompt, 3, sampling.SamplingParams(4, 1.0, top_p, top_k), seed=i))
        rows += [
            policy.TrainRow(prompt, r, lp, 1.0) for r, lp in zip(out.response_ids, out.logprobs, strict=True)
        ]
    filtered = _worker(_optim(top_p=top_p, top_k=top_k, learning_rate=1e-3))
    filtered.train_chunk(rows)
    assert filtered.finish_step()["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    unfiltered = _worker(_optim(learning_rate=1e-3))
    unfiltered.train_chunk(rows)
    assert unfiltered.finish_step()["is_weight_mean"] < 0.99
    plain, _ = _logprobs(model, rows)
    cut, _ = _logprobs(model, rows, params=sampler)
    assert (cut >= plain).all()  # renormalizing over fewer tokens only raises a kept token's log-prob


def test_the_step_reports_the_importance_weighted_entropy_and_the_largest_importance_weight() -> None:
    rows = _rows(8)
    worker = _worker(_optim(learning_rate=1e-3))
    model = BUILD.instantiate()
    logp, mask = _logprobs(model, rows)
    gen = _ragged([r.generation_logprobs for r in rows], mask)
    weights = torch.exp(logp - gen).clamp(max=2.0) * mask
    worker.train_chunk(rows)
    got = worker.finish_step()
    # -(pi_theta / pi_gen) log pi_theta per sampled token (the weight untruncated), over the tokens
    entropy = -torch.exp(logp - gen) * logp * mask
    assert got["entropy"] == pytest.approx(float(entropy.sum() / mask.sum()), rel=1e-5)
    assert got["is_weight_max"] == pytest.approx(float(weights.max()), rel=1e-5)
