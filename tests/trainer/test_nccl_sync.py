"""nccl_sync's bucketing round-trips parameters (gloo, 2 CPU processes), and its plan is sound.

The two-rank test runs this file as a fresh process that forks the ranks at once: forking the
pytest process itself, after other tests have run torch work (autograd and OpenMP threads), can
deadlock in the child; a fresh process forks before any such thread exists, and costs one torch
import instead of two (spawn).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from asyncgrpo_trainer.backends.nccl_sync import BucketedBroadcast, BucketPlan, naive_broadcast
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.network import CausalLM

CFG = tiny_config(
    vocab_size=50,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=48,
    max_positions=32,
    position_embedding="rope",
)


def test_plan_covers_every_tensor_once_within_buckets() -> None:
    model = CausalLM(CFG)
    named = list(model.named_parameters())
    plan = BucketPlan.for_tensors(named, dtype=torch.bfloat16, bucket_bytes=4096)
    assert [s.name for s in plan.slots] == [n for n, _ in named]
    assert plan.total_bytes == 2 * sum(p.numel() for _, p in named)
    for b in range(plan.num_buckets):
        slots = plan.bucket_slots(b)
        ends = [s.offset + s.numel for s in slots]
        assert [s.offset for s in slots] == [0, *ends[:-1]]  # contiguous, no overlap
        assert ends[-1] == plan.bucket_numels[b]
        assert len(slots) == 1 or plan.bucket_numels[b] * 2 <= 4096  # only a lone big tensor overflows
    one = BucketPlan.for_tensors(named, bucket_bytes=0)
    assert one.num_buckets == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for seed, bucket_bytes in ((0, 0), (1, 3000)):
            torch.manual_seed(100 * seed + rank)  # different weights on each rank
            model = CausalLM(CFG)
            if rank == 1:
                model = model.to(torch.bfloat16)  # receiver in bf16, sender keeps fp32 masters
            params = {n: p.detach() for n, p in model.named_parameters()}
            plan = BucketPlan.for_tensors(
                model.named_parameters(), dtype=torch.bfloat16, bucket_bytes=bucket_bytes
            )
            assert plan.num_buckets == (1 if bucket_bytes == 0 else plan.num_buckets) > 0
            sync = BucketedBroadcast(plan, src=0, device="cpu")
            for _ in range(2):  # buffers are reused
                sync.sync(params)
            got = torch.cat([p.to(torch.bfloat16).reshape(-1) for p in params.values()])
            sent = got.clone()
            dist.broadcast(sent, 0)  # rank 0's own values, cast as the plan casts them
            assert torch.equal(got, sent)
        naive = {n: t.to(torch.bfloat16) for n, t in params.items()}
        naive_broadcast(naive, src=0)
        for n, t in params.items():
            assert torch.equal(naive[n], t.to(torch.bfloat16)), n
    finally:
        dist.destroy_process_group()


def test_bucketed_broadcast_round_trips_over_gloo() -> None:
    trainer = Path(__file__).resolve().parents[2] / "trainer"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trainer), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, __file__], timeout=120, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
    mp.start_processes(_worker, args=(_free_port(),), nprocs=2, join=True, start_method="fork")
