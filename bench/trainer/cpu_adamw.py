"""AdamW's step on the CPU, by host threads and implementation: what the CPU-offloaded optimizer
(`policy.sharding.cpuOffload`) pays per step for each parameter.

The offloaded worker steps `torch.optim.AdamW` on parameters in host memory with the recipe's
`fused=True`, PyTorch's fused CPU kernel; until 2026-12-06 it turned fused off for offload, which
on CPU tensors is the single-tensor loop. Either runs on the threads the worker set
(`TorchPolicyWorker(num_threads=)`, 1 unless the caller passes more; the trainer passes none). This
times one step over `--params` fp32
parameters (in tensors of a Qwen2.5-1.5B layer's sizes) for each implementation and thread count,
median of `--steps`, and scales it to `--scale-to` parameters.

    python bench/trainer/cpu_adamw.py --params 64e6 --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

LAYER = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]
"""A Qwen2.5-1.5B decoder layer's projections (q, k, v, o, gate, up, down): 46.8M parameters."""


def parameters(count: int) -> list[torch.nn.Parameter]:
    out: list[torch.nn.Parameter] = []
    total = 0
    while total < count:
        for shape in LAYER:
            p = torch.nn.Parameter(torch.randn(shape))
            p.grad = torch.randn(shape) * 1e-3
            out.append(p)
            total += p.numel()
    return out


def step_seconds(params: list[torch.nn.Parameter], kind: str, steps: int) -> float:
    options = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        kind
    ]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **options)
    opt.step()  # the state is allocated here
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=64e6)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kinds", default="single-tensor,foreach,fused")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--scale-to", type=float, default=1.5437e9, help="Qwen2.5-1.5B's parameters")
    args = ap.parse_args()
    params = parameters(int(args.params))
    n = sum(p.numel() for p in params)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for kind in args.kinds.split(","):
            t = step_seconds(params, kind, args.steps)
            print(
                json.dumps(
                    {
                        "threads": threads,
                        "kind": kind,
                        "params": n,
                        "step_s": round(t, 4),
                        "ns_per_param": round(t / n * 1e9, 3),
                        "scaled_step_s": round(t / n * args.scale_to, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
