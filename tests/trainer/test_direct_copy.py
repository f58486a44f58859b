"""The refit straight into vLLM's parameters (`backends.direct_copy`), on parameters laid out as
vLLM's GPU build lays them out (q/k/v fused into qkv_proj, gate/up into gate_up_proj, a padded
vocabulary), built here from a real checkpoint's tensors. vLLM's CPU build repacks its weights, so
the real engine takes the other branch in CI (tests/trainer/test_vllm_engine.py checks that every
refit lands there); the GPU branch runs in bench/gpu (docs/benchmarks.md)."""

from __future__ import annotations

import torch

from asyncgrpo_trainer.backends import direct_copy
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.recipe import ModelBuild

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _checkpoint(seed: int) -> dict[str, torch.Tensor]:
    cfg = tiny_config(
        vocab_size=60,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        max_positions=32,
        position_embedding="rope",
    )
    model = ModelBuild(cfg, "float32", pad_id=0, eos_ids=(1,), seed=seed).instantiate()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _as_vllm_loads(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Engine parameters as vLLM's loaders fill them on a GPU: fused, the vocabulary padded to 64."""
    params: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if ".q_proj." in name or ".gate_proj." in name:
            fused = "qkv_proj" if ".q_proj." in name else "gate_up_proj"
            subs = PACKED[fused]
            first = name.split(".")[-2]
            params[name.replace(first, fused)] = torch.cat([tensors[name.replace(first, s)] for s in subs])
        elif not any(f".{s}." in name for s in ("k_proj", "v_proj", "up_proj")):
            padded = torch.zeros(64, *t.shape[1:]) if name.endswith("embed_tokens.weight") else None
            if padded is not None:
                padded[: len(t)] = t
            params[name] = padded if padded is not None else t.clone()
    return params


def test_a_refit_copied_directly_equals_what_vllms_own_load_would_hold() -> None:
    first, second = _checkpoint(seed=0), _checkpoint(seed=1)
    engine = _as_vllm_loads(first)
    copy = direct_copy.plan(engine, PACKED, first)
    assert isinstance(copy, direct_copy.DirectCopy), copy
    storage = {n: p.data_ptr() for n, p in engine.items()}
    copy.load(second)
    expected = _as_vllm_loads(second)
    for name, param in engine.items():
        assert torch.equal(param, expected[name]), name
        assert param.data_ptr() == storage[name]  # in place: captured graphs stay valid


def test_an_engine_that_processed_its_weights_keeps_vllms_reload_and_says_which_parameter() -> None:
    loaded = _checkpoint(seed=0)
    engine = _as_vllm_loads(loaded)
    gate_up = "model.layers.1.mlp.gate_up_proj.weight"
    engine[gate_up] = engine[gate_up].t().contiguous().t()  # same values: still a plain copy
    assert isinstance(direct_copy.plan(engine, PACKED, loaded), direct_copy.DirectCopy)
    engine[gate_up] = engine[gate_up] * 2  # what a kernel's repacking or scaling would do
    reason = direct_copy.plan(engine, PACKED, loaded)
    gate = "model.layers.1.mlp.gate_proj.weight"
    assert reason == f"the engine's {gate_up} holds {gate} processed, not as sent (rows from 0)"


def test_an_engine_with_a_parameter_the_refit_does_not_send_is_not_copied_into() -> None:
    loaded = _checkpoint(seed=0)
    engine = _as_vllm_loads(loaded)
    extra = "model.layers.0.self_attn.extra_scale"
    engine[extra] = torch.ones(4)  # a parameter vLLM would derive itself
    assert direct_copy.plan(engine, PACKED, loaded) == f"the engine's {extra} has no refit tensor {extra}"
