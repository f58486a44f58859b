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


def test_the_torch_engine_takes_a_shared_refit_in_place_in_its_dtype() -> None:
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
    build = ModelBuild(cfg, "bfloat16", pad_id=0, eos_ids=(1,), seed=0)
    engine = generation.TorchGenerationWorker(build, device="cuda")
    masters = {n: p.detach().float() + 1.0 for n, p in build.instantiate().cuda().named_parameters()}
    staged = {n: t.to(torch.bfloat16) for n, t in masters.items()}
    before = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    asyncio.run(engine.load_ipc(ipc.share(staged), version=5))
    assert engine.version == 5
    for name, p in engine.model.named_parameters():
        assert p.data_ptr() == before[name]
        assert torch.equal(p.detach(), staged[name]), name
