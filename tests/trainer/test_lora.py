"""LoRA (policy.lora) on CPU: the adapted model, the policy that trains only its adapters, the torch
engine that merges them at a refit, and the PEFT export that `peft` loads.

A tiny random Qwen2 checkpoint (`make_tiny_checkpoint`, tied embeddings) is the base model, so the
export can be loaded by transformers and peft and compared with the policy's own forward.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from asyncgrpo_trainer import checkpoint, export
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import generation, policy, sampling
from asyncgrpo_trainer.models import hf, lora, recipe
from asyncgrpo_trainer.models.network import CausalLM
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint

CPU = torch.device("cpu")
LORA = lora.LoraConfig(
    rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")
)
OPTIM = policy.OptimConfig(
    learning_rate=5e-2,  # large, so that two steps move the adapters far from zero
    weight_decay=0.0,
    max_grad_norm=None,
    warmup_steps=0,
    micro_batch_size=4,
    logprob_batch_size=4,
    temperature=1.0,
)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> recipe.ModelBuild:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("qwen2") / "qwen2", family="qwen2", seed=0)
    base, _ = recipe.pretrained_build(
        str(path), max_sequence_length=64, dtype="float32", seed=0, chat_template=None, system_prompt=None
    )
    return dataclasses.replace(base, lora=LORA)


def _rows(vocab: int) -> list[policy.TrainRow]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, (p, r) in enumerate([(4, 6), (9, 1), (3, 12), (7, 5), (5, 9), (2, 3)]):
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        response = torch.randint(3, vocab, (r,), generator=g).tolist()
        rows.append(policy.TrainRow(prompt, response, [-1.0] * r, 1.0 if i % 2 else -1.0))
    return rows


def _trained(build: recipe.ModelBuild, steps: int = 2) -> policy.TorchPolicyWorker:
    worker = policy.TorchPolicyWorker(build, OPTIM, losses.LossConfig(), rank=0, world_size=1, device="cpu")
    rows = _rows(build.config.vocab_size)
    for _ in range(steps):
        worker.train_chunk(rows)
        worker.finish_step()
    return worker


def _logprobs(model: CausalLM, build: recipe.ModelBuild) -> torch.Tensor:
    pairs = [(r.prompt_ids, r.response_ids) for r in _rows(build.config.vocab_size)]
    with torch.no_grad():
        logp, mask = sampling.token_logprobs(model, pairs, pad_id=build.pad_id, device=CPU)
    return logp * mask


def test_adapters_with_b_zero_give_exactly_the_base_models_logits(build: recipe.ModelBuild) -> None:
    base = build.instantiate()
    adapted = build.instantiate()
    lora.apply(adapted, LORA, seed=0)
    ids = torch.randint(3, build.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(adapted(ids)[0], base(ids)[0])
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    assert {n.rsplit(".", 2)[-2] for n in trainable} == set(LORA.target_modules)


def test_a_lora_policy_trains_and_refits_only_its_adapters(build: recipe.ModelBuild) -> None:
    initial = build.instantiate().state_dict()
    worker = _trained(build)
    refit = worker.weights()
    assert refit and all(lora.is_adapter(n) for n in refit)
    assert refit.keys() == worker.refit_parameters().keys()
    assert any(v.abs().sum() > 0 for n, v in refit.items() if n.endswith(".lora_B"))  # B moved off zero
    state = worker.model.state_dict()
    assert all(torch.equal(state[n], w) for n, w in initial.items())  # base weights frozen
    optimized = [p for g in worker.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in optimized) == sum(v.numel() for v in refit.values())


def test_the_torch_engine_merges_refit_adapters_into_the_policys_log_probs(build: recipe.ModelBuild) -> None:
    engine = generation.TorchGenerationWorker(build, device="cpu")
    worker = _trained(build, steps=1)
    for version in (1, 2):  # the second refit merges into the base weights, not into the first merge
        asyncio.run(engine.load_weights(worker.weights(), version))
        expected = _logprobs(worker.model, build)
        torch.testing.assert_close(_logprobs(engine.model, build), expected, rtol=0, atol=1e-5)
        worker.train_chunk(_rows(build.config.vocab_size))
        worker.finish_step()
    assert not torch.allclose(
        _logprobs(engine.model, build), _logprobs(build.instantiate(), build), atol=1e-3
    )


def test_peft_loads_the_exported_adapter_and_gives_the_policys_logits(
    build: recipe.ModelBuild, tmp_path: Path
) -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    worker = _trained(build)
    step = tmp_path / "step-00000002"
    step.mkdir()
    worker.save(str(step))
    (step / checkpoint.META_FILE).write_text(json.dumps({"step": 2, "model": build.to_json()}))
    out = export.export(step, tmp_path / "export")
    adapter = out / hf.ADAPTER_DIR
    assert json.loads((adapter / lora.PEFT_CONFIG).read_text())["r"] == LORA.rank

    ids = torch.randint(3, build.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = worker.model(ids)[0]
        assert build.checkpoint is not None
        base = transformers.AutoModelForCausalLM.from_pretrained(build.checkpoint, dtype=torch.float32)
        with_adapter = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
        torch.testing.assert_close(with_adapter(ids).logits, expected, rtol=0, atol=1e-4)
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        torch.testing.assert_close(merged(ids).logits, expected, rtol=0, atol=1e-4)
        with with_adapter.disable_adapter():  # the base model (peft wrapped it in place)
            assert not torch.allclose(with_adapter(ids).logits, expected, atol=1e-3)
