"""The policy step's shapes and host syncs: on the compiled recipe ragged rows and short last
micro-batches are padded to a few fixed shapes, so each decoder-block / head graph compiles once
per length bucket; the padding rows change nothing; and the metrics summed on the device equal
the float-by-float sums the step used to read back after every micro-batch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.backends.cuda_train import Recipe, bucket_length, length_buckets
from tests.trainer.test_grpo_math import BUILD, TOK
from tests.trainer.test_policy_recipe import ADAM_ATOL

LONG = dataclasses.replace(BUILD, config=dataclasses.replace(BUILD.config, max_positions=96))
"""test_grpo_math's model with 96 positions: rows up to 64 positions share one bucket, longer
rows the capped one (96)."""

SEQUENCE_KL = losses.LossConfig(reference_policy_kl_penalty=0.1, token_level_loss=False)
CHUNKS = ([3, 10, 20, 5, 40, 2, 12], [70, 8, 1, 30, 60, 88])
"""Response lengths per chunk (4-token prompts): with micro-batches of 4, every micro-batch has
its own longest row and each chunk ends in a short one; chunk 1 fits the 64 bucket, chunk 2 not."""


def _worker(recipe: Recipe, loss: losses.LossConfig) -> policy.TorchPolicyWorker:
    optim = policy.OptimConfig(
        learning_rate=1e-3,
        weight_decay=0.0,
        max_grad_norm=0.5,
        warmup_steps=0,
        micro_batch_size=4,
        logprob_batch_size=3,
        temperature=1.0,
    )
    return policy.TorchPolicyWorker(LONG, optim, loss, rank=0, world_size=1, device="cpu", recipe=recipe)


def _rows(lengths: list[int], seed: int) -> list[policy.TrainRow]:
    g = torch.Generator().manual_seed(seed)
    return [
        policy.TrainRow(
            TOK.encode(f"{i % 10}+3="),
            torch.randint(3, TOK.vocab_size, (n,), generator=g).tolist(),
            (-torch.rand(n, generator=g) * 3).tolist(),
            float(torch.randn(1, generator=g)),
        )
        for i, n in enumerate(lengths)
    ]


def _with_reference(worker: policy.TorchPolicyWorker, rows: list[policy.TrainRow]) -> list[policy.TrainRow]:
    refs = worker.reference_logprobs([(r.prompt_ids, r.response_ids) for r in rows])
    return [dataclasses.replace(r, reference_logprobs=lp) for r, lp in zip(rows, refs, strict=True)]


def _train(worker: policy.TorchPolicyWorker) -> list[dict[str, float]]:
    """One step per chunk, the reference pass included (it runs its own batch size)."""
    out = []
    for seed, lengths in enumerate(CHUNKS):
        worker.train_chunk(_with_reference(worker, _rows(lengths, seed)))
        out.append(worker.finish_step())
    return out


@pytest.fixture(scope="module")
def eager_and_compiled() -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    compiled = _worker(Recipe(compile=True), SEQUENCE_KL)
    got = _train(compiled)
    graphs = counters["stats"]["unique_graphs"]
    eager = _worker(Recipe(), SEQUENCE_KL)
    return {
        "eager": (_train(eager), eager.weights()),
        "compiled": (got, compiled.weights()),
        "graphs": graphs,
    }


def test_buckets_are_multiples_of_64_within_25_percent_capped_at_the_positions() -> None:
    assert [bucket_length(n, 4096) for n in (1, 19, 64, 65, 511, 513, 1025, 4000)] == [
        64, 64, 64, 128, 512, 640, 1280, 4096,
    ]  # fmt: skip
    assert all(n <= bucket_length(n, 4096) <= max(n + 63, n * 1.25) for n in range(1, 4097))
    assert bucket_length(19, 24) == 24 and bucket_length(30, 24) == 30  # never below the row
    assert length_buckets(96) == [64, 96] and len(length_buckets(2048)) == 16


@pytest.mark.trainer
def test_each_graph_compiles_once_per_length_bucket(eager_and_compiled: dict[str, Any]) -> None:
    # Two buckets x (decoder block, head) x (training with gradients, reference pass without).
    # Padding each micro-batch to its own longest row, torch compiled 20 graphs here: every new
    # shape recompiled, first static, then dynamic in T, then in B for the short micro-batches.
    assert eager_and_compiled["graphs"] == 2 * 2 * 2


@pytest.mark.trainer
def test_padding_rows_change_nothing(eager_and_compiled: dict[str, Any]) -> None:
    """The compiled worker pads every micro-batch to 4 rows (3 for the reference pass) and 64 or 96
    positions; the eager one trains the tight batches. Sequence-level loss, so the step divides
    by the real rows only."""
    (eager, we), (compiled, wc) = eager_and_compiled["eager"], eager_and_compiled["compiled"]
    assert compiled[-1]["kl"] > 0  # the reference pass ran with padding rows too
    for e, c in zip(eager, compiled, strict=True):
        assert c.keys() == e.keys()
        for key in e:
            assert c[key] == pytest.approx(e[key], rel=1e-4, abs=1e-7), key
    assert all(torch.allclose(we[k], wc[k], atol=ADAM_ATOL) for k in we)


def test_fully_masked_rows_add_exactly_nothing_to_the_loss_metrics_or_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g) * 2
    gen, ref = logp - 0.3 * torch.rand(3, 5, generator=g), logp + 0.1
    mask = (torch.rand(3, 5, generator=g) < 0.7).float()
    adv = torch.tensor([0.5, -1.0, 2.0])
    pad = torch.randn(2, 5, generator=g) - 3  # arbitrary log-probs in the padding rows
    variants = [
        {"token_level_loss": True},
        {"token_level_loss": False},
        {"token_level_loss": False, "sequence_level_importance_ratios": True},
        {
            "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio_min": 0.9,
        },
        {"truncated_importance_sampling_type": "icepop", "truncated_importance_sampling_ratio_min": 0.9},
    ]
    for variant in variants:
        cfg = losses.LossConfig(reference_policy_kl_penalty=0.1, **variant)  # type: ignore[arg-type]
        x = logp.clone().requires_grad_(True)
        total, metrics = losses.policy_loss_terms(
            logprobs=x,
            prev_logprobs=logp,
            generation_logprobs=gen,
            advantages=adv,
            mask=mask,
            cfg=cfg,
            reference_logprobs=ref,
        )
        total.backward()  # type: ignore[no-untyped-call]
        xp = torch.cat([logp, pad]).requires_grad_(True)
        padded, padded_metrics = losses.policy_loss_terms(
            logprobs=xp,
            prev_logprobs=xp.detach(),
            generation_logprobs=torch.cat([gen, torch.zeros(2, 5)]),
            advantages=torch.cat([adv, torch.zeros(2)]),
            mask=torch.cat([mask, torch.zeros(2, 5)]),
            cfg=cfg,
            reference_logprobs=torch.cat([ref, torch.zeros(2, 5)]),
        )
        padded.backward()  # type: ignore[no-untyped-call]
        # Equal up to the order in which the reductions add up the (now longer) rows.
        assert padded.item() == pytest.approx(total.item(), rel=1e-6)
        assert padded_metrics.keys() == metrics.keys()
        for key, value in metrics.items():
            assert padded_metrics[key].item() == pytest.approx(value.item(), rel=1e-6), key
        assert xp.grad is not None and x.grad is not None
        assert torch.equal(xp.grad[:3], x.grad) and not xp.grad[3:].any()


def test_device_side_sums_equal_the_float_by_float_metrics() -> None:
    """The step's metrics against the host accumulation the worker did before (a float per
    metric and micro-batch), recomputed from the same forward passes; exactly equal."""
    worker = _worker(Recipe(), losses.LossConfig(reference_policy_kl_penalty=0.1))
    chunks = [_with_reference(worker, _rows(lengths, seed)) for seed, lengths in enumerate(CHUNKS)]
    worker.train_chunk(chunks[1])
    worker.finish_step()  # so that the policy has moved away from the reference (KL > 0)
    sums: dict[str, float] = {}
    for rows in chunks:
        for i in range(0, len(rows), 4):
            micro = rows[i : i + 4]
            with torch.no_grad():
                logp, mask = worker.logprobs(
                    worker.model, [(r.prompt_ids, r.response_ids) for r in micro], worker.device
                )
            total, metrics = losses.policy_loss_terms(
                logprobs=logp,
                prev_logprobs=logp,
                generation_logprobs=policy._padded([r.generation_logprobs for r in micro], mask),
                advantages=torch.tensor([r.advantage for r in micro]),
                mask=mask,
                cfg=worker.loss_cfg,
                reference_logprobs=policy._padded([r.reference_logprobs or [] for r in micro], mask),
            )
            metrics["loss_sum"] = total.detach()
            for key in ("loss_sum", "tokens", "is_weight_sum", "clip_fraction_sum", "kl_sum", "gen_kl_sum"):
                sums[key] = sums.get(key, 0.0) + float(metrics[key])
        worker.train_chunk(rows)
    tokens = sums["tokens"]
    got = worker.finish_step()
    assert set(got) == {
        "loss",
        "grad_norm",
        "lr",
        "train_tokens",
        "is_weight_mean",
        "is_weight_max",
        "is_out_of_bounds",
        "clip_fraction",
        "kl",
        "gen_kl_error",
        "behaviour_kl",
        "gen_logprob_error",
        "entropy",
    }
    assert got["loss"] == sums["loss_sum"] / tokens
    assert got["train_tokens"] == tokens
    assert got["is_weight_mean"] == sums["is_weight_sum"] / tokens
    assert got["clip_fraction"] == sums["clip_fraction_sum"] / tokens
    assert got["kl"] == sums["kl_sum"] / tokens and got["kl"] > 0
    assert got["gen_kl_error"] == sums["gen_kl_sum"] / tokens
