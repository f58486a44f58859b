"""Refit transport: bucketed NCCL broadcast of the model's bf16 weights GPU0 -> GPU1, vs the link bound.

First the link: a large broadcast (and all-reduce) between the two processes gives the bandwidth
BW the bound uses. Then the 387M-shape model (all parameters, embedding included: everything a
refit must move) goes from rank 0 (fp32 master weights, cast to bf16 while packing, as a policy
worker holds them; and a bf16 copy) into rank 1's bf16 model with `nccl_sync.BucketedBroadcast` at
several bucket sizes, and one broadcast per tensor as the naive baseline. Bound = 2 x N / BW.
Times are the slower rank's, from a barrier to its device finishing (receiver: unpack included).

    PYTHONPATH=trainer python3 bench/gpu/refit.py --out refit.json    # 2 GPUs, NCCL
    PYTHONPATH=trainer python3 bench/gpu/refit.py --tiny              # CPU, gloo
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import _common as c
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from asyncgrpo_trainer.backends.nccl_sync import BucketedBroadcast, BucketPlan, naive_broadcast

for _k, _v in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_k, _v)  # never NVLink multicast on the shared hosts

MiB = 1 << 20


def _time(fn: Callable[[], Any], dev: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median over repeats of the max over ranks of (barrier -> this rank's device done)."""
    for _ in range(warmup):
        fn()
    c.sync(dev)
    ts = []
    for _ in range(repeats):
        dist.barrier()
        c.sync(dev)
        t0 = time.perf_counter()
        fn()
        c.sync(dev)
        ts.append(time.perf_counter() - t0)
    t = torch.tensor(ts, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return c.median(t.cpu().tolist())


def worker(rank: int, world: int, port: int, tiny: bool, out: str | None, repeats: int) -> None:  # noqa: PLR0917
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl" if cuda else "gloo", rank=rank, world_size=world, device_id=dev if cuda else None
    )
    res = c.Results(out if rank == 0 else None, backend=dist.get_backend(), world=world)
    put = res.put if rank == 0 else (lambda k, v: None)
    try:
        # 1. The link.
        link: dict[str, Any] = {}
        for size in [4 * MiB] if tiny else [256 * MiB, 1024 * MiB, 4096 * MiB]:
            buf = torch.ones(size // 2, dtype=torch.bfloat16, device=dev)
            tb = _time(lambda b=buf: dist.broadcast(b, 0), dev, repeats)
            ta = _time(lambda b=buf: dist.all_reduce(b), dev, repeats)
            link[f"{size // MiB}MiB"] = {
                "broadcast_s": tb,
                "broadcast_bytes_per_s": size / tb,
                "allreduce_s": ta,
                "allreduce_busbw_bytes_per_s": size / ta,
            }
            del buf
        put("link", link)
        bw = max(v["broadcast_bytes_per_s"] for v in link.values())

        # 2. The model's weights.
        cfg = c.config(tiny)
        sender_dtypes = [torch.float32, torch.bfloat16]
        models = {
            dt: c.build_model(cfg, dev, dt if rank == 0 else torch.bfloat16, seed=rank)
            for dt in sender_dtypes
        }
        n = sum(p.numel() for p in models[torch.bfloat16].parameters())
        bound = 2 * n / bw
        put(
            "model",
            {
                "params": n,
                "bf16_bytes": 2 * n,
                "tensors": len(list(models[torch.bfloat16].parameters())),
                "link_bytes_per_s": bw,
                "bound_s": bound,
            },
        )
        results: dict[str, Any] = {}
        buckets = [0, 64 * 1024] if tiny else [0, 512 * MiB, 256 * MiB, 64 * MiB, 16 * MiB]
        for dt in sender_dtypes:
            model = models[dt]
            params = {k: p.detach() for k, p in model.named_parameters()}
            for bb in buckets:
                plan = BucketPlan.for_tensors(model.named_parameters(), dtype=torch.bfloat16, bucket_bytes=bb)
                sync = BucketedBroadcast(plan, src=0, device=dev)
                t = _time(lambda s=sync, p=params: s.sync(p), dev, repeats)
                size = "all" if bb == 0 else f"{bb // MiB}MiB" if bb >= MiB else f"{bb}B"
                key = f"sender_{str(dt).removeprefix('torch.')}.bucket_{size}"
                results[key] = {
                    "seconds": t,
                    "buckets": plan.num_buckets,
                    "x_bound": t / bound,
                    "bytes_per_s": 2 * n / t,
                }
                put(f"refit.{key}", results[key])
                del sync
            # Correct? the receiver's weights equal the sender's, cast to bf16.
            mine = torch.cat([p.to(torch.bfloat16).reshape(-1) for p in params.values()])
            ref = mine.clone()
            dist.broadcast(ref, 0)
            ok = torch.tensor([float(torch.equal(mine, ref))], device=dev)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            put(f"refit.sender_{str(dt).removeprefix('torch.')}.receiver_equals_sender", bool(ok.item()))
        bf = {k: p.detach() for k, p in models[torch.bfloat16].named_parameters()}
        t = _time(lambda: naive_broadcast(bf, src=0), dev, repeats)
        results["naive_per_tensor_bf16"] = {"seconds": t, "x_bound": t / bound, "bytes_per_s": 2 * n / t}
        put("refit.naive_per_tensor_bf16", results["naive_per_tensor_bf16"])
        best = min(results, key=lambda k: results[k]["seconds"])
        put(
            "summary",
            {
                "bound_s": bound,
                "best": best,
                "best_s": results[best]["seconds"],
                "best_x_bound": results[best]["x_bound"],
                "naive_s": results["naive_per_tensor_bf16"]["seconds"],
            },
        )
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int)
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.tiny else 20)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        print("refit needs 2 GPUs; found", torch.cuda.device_count())
        return
    # spawn on CUDA (a forked child cannot use CUDA); fork on CPU (no re-import of torch).
    method = "spawn" if torch.cuda.is_available() else "fork"
    mp.start_processes(
        worker, args=(2, port, args.tiny, args.out, repeats), nprocs=2, join=True, start_method=method
    )


if __name__ == "__main__":
    main()
