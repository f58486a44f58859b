"""The colocated refit by CUDA IPC (`backends.ipc`): another process on the same GPU opens the
policy's tensors and copies them; the torch engine takes them into its model in place. CUDA only."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.multiprocessing as mp

from asyncgrpo_trainer.backends import generation, ipc
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.recipe import ModelBuild
from tests.skip_policy import requires_cuda

pytestmark = requires_cuda()


def _sums_in_child(handles: bytes, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put({name: float(t.double().sum()) for name, t in ipc.open_shared(handles)})


def test_another_process_reads_the_shared_tensors() -> None:
    tensors = {"a": torch.randn(64, 32, device="cuda"), "b": torch.arange(10.0, device="cuda")}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_sums_in_child, args=(ipc.share(tensors), out))
    child.start()
    sums = out.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert sums == pytest.approx({k: float(v.double().sum()) for k, v in tensors.items()})


def _tiny_build() -> ModelBuild:
    cfg = tiny_config(
        vocab_size=64,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        max_positions=32,
        position_embedding="rope",
    )
    return ModelBuild(cfg, "bfloat16", pad_id=0, eos_ids=(1,), seed=0)


def _staged_weights() -> dict[str, torch.Tensor]:
    """What a policy rank stages for the refit: its (changed) master weights cast to bfloat16."""
    masters = {n: p.detach().float() + 1.0 for n, p in _tiny_build().instantiate().cuda().named_parameters()}
    return {n: t.to(torch.bfloat16) for n, t in masters.items()}


def _policy_rank(out: mp.Queue, engine_done: mp.Event) -> None:  # type: ignore[type-arg]
    """A policy rank's side: share the staged weights and keep them alive until the engine copied."""
    staged = _staged_weights()
    out.put(ipc.share(staged))
    engine_done.wait(timeout=120)


def test_the_torch_engine_takes_a_shared_refit_in_place_in_its_dtype() -> None:
    # Two processes, as in a job: CUDA IPC handles open only in a process other than their owner.
    engine = generation.TorchGenerationWorker(_tiny_build(), device="cuda")
    before = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    ctx = mp.get_context("spawn")
    out, engine_done = ctx.Queue(), ctx.Event()
    rank = ctx.Process(target=_policy_rank, args=(out, engine_done))
    rank.start()
    try:
        asyncio.run(engine.load_ipc(out.get(timeout=120), version=5))
    finally:
        engine_done.set()
        rank.join(timeout=60)
    assert rank.exitcode == 0
    assert engine.version == 5
    expected = _staged_weights()  # deterministic: the build's seed
    for name, p in engine.model.named_parameters():
        assert p.data_ptr() == before[name]
        assert torch.equal(p.detach(), expected[name]), name
