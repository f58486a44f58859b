"""The colocated refit by CUDA IPC (`backends.ipc`): another process on the same GPU opens the
policy's buffer once and copies from it on every refit; the torch engine takes each refit into its
model in place. CUDA only."""

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


def _sums_in_child(handles: mp.Queue, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Open each handle received and report the sums it sees, and whether its mapping was new."""
    opened = ipc.OpenedWeights()
    while (handle := handles.get(timeout=120)) is not None:
        views = opened.open(handle)
        out.put(({name: float(t.double().sum()) for name, t in views.items()}, id(views["a"])))


def test_another_process_reads_every_refit_through_the_buffer_it_opened_once() -> None:
    tensors = {"a": torch.randn(64, 32, device="cuda"), "b": torch.arange(10.0, device="cuda")}
    shared = ipc.SharedWeights(tensors, torch.bfloat16)
    ctx = mp.get_context("spawn")
    handles, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_sums_in_child, args=(handles, out))
    child.start()
    seen = []
    for step in range(3):
        sent = {k: (v + step).to(torch.bfloat16) for k, v in tensors.items()}
        handles.put(shared.fill({k: v + step for k, v in tensors.items()}))
        sums, view_id = out.get(timeout=120)
        assert sums == pytest.approx({k: float(v.double().sum()) for k, v in sent.items()}), step
        seen.append(view_id)
    handles.put(None)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert len(set(seen)) == 1  # the same views every refit: the handle was opened once


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


def _masters(shift: float) -> dict[str, torch.Tensor]:
    """A policy rank's (changed) fp32 master weights."""
    return {n: p.detach().float() + shift for n, p in _tiny_build().instantiate().cuda().named_parameters()}


def _policy_rank(out: mp.Queue, engine_done: mp.Queue) -> None:  # type: ignore[type-arg]
    """A policy rank's side: two refits through one buffer, each after the engine copied the last."""
    shared: ipc.SharedWeights | None = None
    for shift in (1.0, 2.0):
        masters = _masters(shift)
        shared = shared or ipc.SharedWeights(masters, torch.bfloat16)
        out.put(shared.fill(masters))
        engine_done.get(timeout=120)


def test_the_torch_engine_takes_each_shared_refit_in_place_in_its_dtype() -> None:
    # Two processes, as in a job: CUDA IPC handles open only in a process other than their owner.
    engine = generation.TorchGenerationWorker(_tiny_build(), device="cuda")
    before = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    ctx = mp.get_context("spawn")
    out, engine_done = ctx.Queue(), ctx.Queue()
    rank = ctx.Process(target=_policy_rank, args=(out, engine_done))
    rank.start()
    try:
        for version, shift in ((5, 1.0), (6, 2.0)):
            paused = asyncio.run(engine.load_ipc(out.get(timeout=120), version=version))
            assert engine.version == version and paused > 0
            expected = {n: t.to(torch.bfloat16) for n, t in _masters(shift).items()}  # the build's seed
            for name, p in engine.model.named_parameters():
                assert p.data_ptr() == before[name]
                assert torch.equal(p.detach(), expected[name]), (version, name)
            engine_done.put(version)
    finally:
        rank.join(timeout=60)
    assert rank.exitcode == 0
