"""The policy's CUDA recipe, checked on CPU where its parts run: the response log-probs it trains
on are the generation side's (`sampling.token_logprobs`), fp32 master weights keep the updates
that bf16 parameters lose, autocast and compiled blocks + head give the plain step's gradient, and
the device picks the recipe (fast on CUDA, plain on CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy, sampling
from asyncgrpo_trainer.backends.cuda_train import Recipe, ResponseLogprobs
from asyncgrpo_trainer.models import lora
from tests.trainer.test_grpo_math import BUILD, TOK, _direct_grad_norm, _rows

BF16 = dataclasses.replace(BUILD, dtype="bfloat16")
ADAM_ATOL = 1e-5
"""Weights after one AdamW step (lr 1e-3) agree to 1% of lr: the first update is lr * g / (|g| +
1e-8), so for the rare gradient element near 1e-8 a different summation order (compiled kernels,
padded shapes) moves the update by a visible fraction of lr while the gradients agree to 1e-4."""


def _worker(recipe: Recipe | None, *, build: object = BUILD, lr: float = 1e-3) -> policy.TorchPolicyWorker:
    optim = policy.OptimConfig(
        learning_rate=lr,
        weight_decay=0.0,
        max_grad_norm=0.5,
        warmup_steps=0,
        micro_batch_size=6,
        logprob_batch_size=6,
        temperature=1.0,
    )
    assert isinstance(build, type(BUILD))
    return policy.TorchPolicyWorker(
        build, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu", recipe=recipe
    )


def test_the_device_picks_the_recipe() -> None:
    fast = Recipe.for_device(torch.device("cuda"), torch.bfloat16)
    assert fast == Recipe(compile=True, master_fp32=True, autocast=torch.bfloat16, fused_adamw=True)
    assert Recipe.for_device(torch.device("cuda"), torch.float32).autocast is None  # float32 means fp32
    assert Recipe.for_device(torch.device("cpu"), torch.bfloat16) == Recipe()
    assert _worker(None).recipe == Recipe()


def test_response_logprobs_equal_the_generation_sides_token_logprobs() -> None:
    model = BUILD.instantiate()
    rows = [(r.prompt_ids, r.response_ids) for r in _rows(7)] + [(TOK.encode("1+1="), [])]
    got, mask = ResponseLogprobs(Recipe(), pad_id=TOK.pad_id, temperature=0.7)(
        model, rows, torch.device("cpu")
    )
    want, want_mask = sampling.token_logprobs(
        model, rows, pad_id=TOK.pad_id, temperature=0.7, device=torch.device("cpu")
    )
    assert torch.equal(mask, want_mask)
    assert torch.allclose(got, want, atol=1e-6)


def test_fp32_master_weights_keep_updates_that_bf16_parameters_lose() -> None:
    rows = _rows(6)
    plain = _worker(None, build=BF16, lr=1e-6)
    master = _worker(Recipe(master_fp32=True, autocast=torch.bfloat16), build=BF16, lr=1e-6)
    assert all(p.dtype == torch.float32 for p in master.model.parameters())
    before = plain.state()["model"]
    for w in (plain, master):
        w.train_chunk(rows)
        w.finish_step()
    assert _changed(before, plain.state()["model"]) < 0.1  # most updates are lost in rounding
    assert _changed(before, master.state()["model"]) > 0.8
    assert all(v.dtype == torch.bfloat16 for v in master.weights().values())  # what engines hold


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The fraction of parameter elements that moved."""
    moved = sum(int((before[k].float() != v.float()).sum()) for k, v in after.items())
    return moved / sum(v.numel() for v in after.values())


def test_autocast_over_fp32_masters_gives_the_plain_gradient() -> None:
    rows = _rows(12)
    worker = _worker(Recipe(master_fp32=True, autocast=torch.bfloat16), build=BF16)
    worker.train_chunk(rows)
    got = worker.finish_step()["grad_norm"]
    # The direct computation in fp32 from the same (bf16-rounded) initial weights.
    assert got == pytest.approx(_direct_grad_norm(rows), rel=3e-2)


def test_a_lora_policy_keeps_its_frozen_base_in_the_model_dtype_and_trains_fp32_adapters() -> None:
    """Under the CUDA recipe the frozen base stays bf16 (half the bytes of an fp32 copy); only the
    adapters are fp32 masters, and the step's gradient is the plain fp32 policy's."""
    adapters = lora.LoraConfig(rank=4, alpha=8.0)
    mixed = _worker(
        Recipe(master_fp32=True, autocast=torch.bfloat16), build=dataclasses.replace(BF16, lora=adapters)
    )
    plain = _worker(None, build=dataclasses.replace(BUILD, lora=adapters))
    params = dict(mixed.model.named_parameters())
    fp32 = {n for n, p in params.items() if p.dtype == torch.float32}
    assert fp32 == {n for n in params if lora.is_adapter(n)}
    assert {p.dtype for n, p in params.items() if not lora.is_adapter(n)} == {torch.bfloat16}
    before = {n: p.detach().clone() for n, p in params.items()}
    rows = _rows(12)
    out = []
    for w in (mixed, plain):
        w.train_chunk(rows)
        out.append(w.finish_step())
    assert out[0]["grad_norm"] == pytest.approx(out[1]["grad_norm"], rel=3e-2)
    moved = {n for n, p in mixed.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(lora.is_adapter(n) for n in moved)


@pytest.mark.trainer
def test_compiled_blocks_and_head_train_like_the_eager_step() -> None:
    rows = _rows(12)
    eager, compiled = _worker(None), _worker(Recipe(compile=True))
    out = []
    for w in (eager, compiled):
        w.train_chunk(rows)
        out.append(w.finish_step())
    assert out[1]["grad_norm"] == pytest.approx(out[0]["grad_norm"], rel=1e-4)
    assert out[1]["loss"] == pytest.approx(out[0]["loss"], rel=1e-4, abs=1e-7)
    we, wc = eager.weights(), compiled.weights()
    assert all(torch.allclose(we[k], wc[k], atol=ADAM_ATOL) for k in we)
