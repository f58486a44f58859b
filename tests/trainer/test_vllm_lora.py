"""LoRA (policy.lora) with the vLLM engine (vLLM's CPU build): a refit is the adapters only, which
vLLM serves as a LoRA adapter over its unchanged base weights.

One engine with LoRA enabled serves the module (a tiny random Qwen2 checkpoint). Checked: after a
refit the samples come with the log-probs the LoRA policy recomputes (the gate), a newer refit
replaces the adapter (the old one is removed from vLLM and its directory deleted), and a request
keeps the adapter it started with (no in-flight update: its first and last versions are equal).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.models import lora, recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from tests.trainer.test_vllm_engine import PROMPT, Engine, _gate, _policy, _train_step

pytestmark = pytest.mark.vllm

SAMPLED = sampling.SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = make_tiny_checkpoint(
        tmp_path_factory.mktemp("vllm-lora") / "qwen2", family="qwen2", tie_word_embeddings=False, seed=3
    )
    base, tokenizer = recipe.pretrained_build(
        str(path), max_sequence_length=512, dtype="float32", seed=0, chat_template=None, system_prompt=None
    )
    build = dataclasses.replace(base, lora=lora.LoraConfig(rank=8, alpha=16.0))
    eng = Engine(build, stop_token=-1, tokenizer=tokenizer)
    yield eng
    eng.run(eng.worker.shutdown())
    eng.runner.close()


def test_a_lora_refit_is_served_as_an_adapter_and_the_gate_holds(engine: Engine) -> None:
    worker = _policy(engine.build)
    _train_step(worker, torch.Generator().manual_seed(11))
    adapters = worker.weights()
    assert adapters and all(lora.is_adapter(n) for n in adapters)
    engine.run(engine.worker.load_weights(adapters, version=1))
    out = engine.run(engine.worker.generate(PROMPT, 8, SAMPLED, seed=3))
    assert (out.first_version, out.last_version) == (1, 1)
    gate = _gate(worker, out)
    assert gate <= 1.05, gate
    assert _gate(_policy(engine.build), out) > gate  # the base model explains these samples worse

    _train_step(worker, torch.Generator().manual_seed(12))
    engine.run(engine.worker.load_weights(worker.weights(), version=2))
    # Only version 2's adapter is left in vLLM (an adapter's id is its version + 2: ids start at 1).
    assert set(engine.run(engine.worker.engine.list_loras())) == {2 + 2}
    root = engine.worker._adapter_root
    assert root is not None and sorted(p.name for p in Path(root).iterdir()) == ["v2"]
    out = engine.run(engine.worker.generate(PROMPT, 8, SAMPLED, seed=4))
    assert _gate(worker, out) <= 1.05


def test_a_request_keeps_the_adapter_it_started_with(engine: Engine) -> None:
    worker = _policy(engine.build)
    _train_step(worker, torch.Generator().manual_seed(13))
    long = dataclasses.replace(SAMPLED, max_new_tokens=200)

    async def refit_midway() -> tuple[int, int]:
        task = asyncio.create_task(engine.worker.generate(PROMPT, 2, long, seed=5))
        processor = engine.worker.engine.output_processor
        while not processor.has_unfinished_requests():
            await asyncio.sleep(0.001)
        await engine.worker.load_weights(worker.weights(), version=3)
        out = await task
        return out.first_version, out.last_version

    first, last = engine.run(refit_midway())
    assert first == last != 3
