"""The torch policy's training step sharded with FSDP2, with activation checkpointing, with the
optimizer in host memory: peak GPU memory, step time, and agreement with the unsharded step.

The step is the trainer's own (`TorchPolicyWorker.train_chunk` + `finish_step`: forward, the
clipped GRPO loss with IS correction, backward, clip, AdamW), with the CUDA recipe (fp32 master
weights, bf16 compute, compiled blocks and head), on a Qwen2.5 shape with random weights
(`SHAPES`; bfloat16, tied embeddings as the checkpoints have them up to 3B). MFU = (4 x matmul
parameters + 2 x trainable matmul parameters) x tokens / step time / 989 TFLOP/s: the forward
and the backward's activation gradients go through every matmul (2 + 2 FLOPs per parameter and
token), the weight gradients only through the trainable ones (2 more). Training every weight that
is train_step.py's 6 x N; with LoRA (`policy.lora`: frozen base, adapters of `--lora-rank` on every
projection) it is about 4 x N. With activation checkpointing the recomputed forward is not
counted, so MFU reads what the step delivers.

Parts (JSON keys):
- `one_gpu.<variant>` (one GPU, this process): `plain` (the unsharded worker),
  `activation_checkpointing`, `cpu_offload` (FSDP over the one rank: sharded parameters, their
  gradients and AdamW's state in host memory, the optimizer stepping on the CPU) and
  `cpu_offload_activation_checkpointing`, and `lora` / `lora_activation_checkpointing` (the
  unsharded worker training LoRA adapters only; not in the default list): median step time,
  tokens/s, MFU, peak GPU memory (`torch.cuda.max_memory_allocated`), the process's host memory
  after the steps, the worker's set-up time, and the step split into its two calls (`train_chunk`:
  forward and backward; `finish_step`: reduce, clip, AdamW), each step's time printed as it ends.
  `--threads` sets the host threads the worker runs with (`TorchPolicyWorker(num_threads=)`; the
  trainer passes none, so 1), which is what the CPU-offloaded AdamW steps on. A variant that runs
  out of memory says so. With `--then-threads K` each variant then takes one more timed step on
  K host threads (`one_gpu.<variant>.threads<K>`).
- `ranks<N>.<layout>` (`--gpus N`, N >= 2: one process per GPU, NCCL): `dp` (unsharded data
  parallel), `fsdp`, `fsdp_activation_checkpointing`, each rank training `--batch` rows of a
  global batch of N x `--batch`: the slowest rank's median step time, every rank's peak GPU memory.
  With `--parity` (float32, TF32 off, a 4-layer model): each layout's weights after the same
  2 + `--steps` steps against `dp`'s (`max_abs_weight_diff_vs_dp`; the CPU tests bound it by 1e-5
  over gloo).

    PYTHONPATH=trainer python3 bench/gpu/fsdp_step.py --shape qwen2.5-3b --out fsdp_one_gpu.json
    PYTHONPATH=trainer python3 bench/gpu/fsdp_step.py --shape qwen2.5-7b --variants lora,plain
    PYTHONPATH=trainer python3 bench/gpu/fsdp_step.py --gpus 4 --skip-one-gpu --out fsdp_ranks.json
    PYTHONPATH=trainer python3 bench/gpu/fsdp_step.py --gpus 4 --skip-one-gpu --parity --out parity.json
    PYTHONPATH=trainer python3 bench/gpu/fsdp_step.py --tiny --gpus 2       # CPU smoke run (gloo)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import _common as c
import torch
import torch.distributed as dist
from train_step import grpo_rows

from asyncgrpo_trainer.algorithms.losses import LossConfig
from asyncgrpo_trainer.backends.cuda_train import matmul_params
from asyncgrpo_trainer.backends.policy import OptimConfig, Sharding, TorchPolicyWorker
from asyncgrpo_trainer.models import lora
from asyncgrpo_trainer.models.config import ModelConfig, tiny_config
from asyncgrpo_trainer.models.network import CausalLM
from asyncgrpo_trainer.models.recipe import ModelBuild

for _k, _v in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_k, _v)  # never NVLink multicast on the shared hosts


def _qwen(
    vocab: int, hidden: int, layers: int, *, heads: int, kv: int, inter: int, tied: bool
) -> ModelConfig:
    cfg = tiny_config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        max_positions=4096,
        position_embedding="rope",
        rope_theta=1_000_000.0,
    )
    return dataclasses.replace(cfg, tie_word_embeddings=tied)


SHAPES = {
    "qwen2.5-0.5b": _qwen(151936, 896, 24, heads=14, kv=2, inter=4864, tied=True),
    "qwen2.5-1.5b": _qwen(151936, 1536, 28, heads=12, kv=2, inter=8960, tied=True),
    "qwen2.5-3b": _qwen(151936, 2048, 36, heads=16, kv=2, inter=11008, tied=True),
    "qwen2.5-7b": _qwen(152064, 3584, 28, heads=28, kv=4, inter=18944, tied=False),
    "qwen2.5-14b": _qwen(152064, 5120, 48, heads=40, kv=8, inter=13824, tied=False),
    "parity": _qwen(32000, 896, 4, heads=14, kv=2, inter=4864, tied=True),
}
"""Qwen2.5 shapes (config.json's sizes); `parity` is the small float32 model of `--parity`."""

ONE_GPU = {
    "plain": (None, False, False),
    "activation_checkpointing": (None, True, False),
    "cpu_offload": (Sharding(cpu_offload=True), False, False),
    "cpu_offload_activation_checkpointing": (Sharding(cpu_offload=True), True, False),
    "lora": (None, False, True),
    "lora_activation_checkpointing": (None, True, True),
}
"""one_gpu variants: (sharding, activation checkpointing, LoRA)."""
DEFAULT_VARIANTS = "plain,activation_checkpointing,cpu_offload,cpu_offload_activation_checkpointing"
LAYOUTS = {
    "dp": (None, False),
    "fsdp": (Sharding(), False),
    "fsdp_activation_checkpointing": (Sharding(), True),
}
"""ranks<N> layouts: (sharding, activation checkpointing)."""


def optim(batch: int) -> OptimConfig:
    return OptimConfig(
        learning_rate=1e-5,
        weight_decay=0.01,
        max_grad_norm=1.0,
        warmup_steps=0,
        micro_batch_size=batch,
        logprob_batch_size=batch,
        temperature=1.0,
    )


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def host_rss_gib() -> float:
    """This process's resident memory now (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def build_of(args: argparse.Namespace) -> ModelBuild:
    if args.tiny:
        cfg = dataclasses.replace(c.TINY, tie_word_embeddings=True)
    else:
        cfg = SHAPES["parity" if args.parity else args.shape]
    return ModelBuild(cfg, seed=0, dtype="float32" if args.parity else "bfloat16", pad_id=0, eos_ids=(1,))


def trainable_matmul_params(model: CausalLM) -> int:
    """The matmul parameters (`matmul_params`) that train: all of them, or with LoRA the adapters."""
    decoder = model.model
    lookups = set() if model.cfg.tie_word_embeddings else {id(decoder.embed_tokens.weight)}
    if decoder.embed_positions is not None:
        lookups.add(id(decoder.embed_positions.weight))
    return sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in lookups)


def flops_per_token(model: CausalLM) -> int:
    """Forward and activation gradients through every matmul, weight gradients through the
    trainable ones: 6 x N when every weight trains."""
    return 4 * matmul_params(model) + 2 * trainable_matmul_params(model)


def measure(
    worker: TorchPolicyWorker, rows: list[Any], dev: torch.device, steps: int, warmup: int = 2
) -> dict[str, Any]:
    """Median time of `steps` steps after `warmup` untimed ones (compilation), each step also
    split into `train_chunk` and `finish_step` (the device synchronized after each), and peak GPU
    memory."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(warmup):
        worker.train_chunk(rows)
        worker.finish_step()
    c.sync(dev)
    warm = time.perf_counter() - t0
    times, chunks, finishes = [], [], []
    for i in range(steps):
        c.sync(dev)
        t0 = time.perf_counter()
        worker.train_chunk(rows)
        c.sync(dev)
        t1 = time.perf_counter()
        worker.finish_step()
        c.sync(dev)
        t2 = time.perf_counter()
        times.append(t2 - t0)
        chunks.append(t1 - t0)
        finishes.append(t2 - t1)
        print(
            f"  step {i}: {t2 - t0:.3f} s (train_chunk {t1 - t0:.3f}, finish_step {t2 - t1:.3f})", flush=True
        )
    tokens = sum(len(r.response_ids) for r in rows) + sum(len(r.prompt_ids) for r in rows) - len(rows)
    t = c.median(times)
    return {
        "step_s": t,
        "tokens_per_s": tokens / t,
        "mfu": flops_per_token(worker.model) * tokens / t / c.PEAK_BF16_FLOPS,
        "flops_per_token": flops_per_token(worker.model),
        "matmul_params": matmul_params(worker.model),
        "trainable_params": sum(p.numel() for p in worker.model.parameters() if p.requires_grad),
        "train_chunk_s": c.median(chunks),
        "finish_step_s": c.median(finishes),
        "warmup_s": warm,
        "peak_gpu_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        "host_rss_gib": host_rss_gib(),
        "all_steps_s": times,
    }


def one_gpu_part(res: c.Results, args: argparse.Namespace, build: ModelBuild) -> None:
    dev = c.device()
    rows = grpo_rows(build.config.vocab_size, args.batch, args.seq)
    adapters = lora.LoraConfig(args.lora_rank, 2.0 * args.lora_rank, lora.TARGETS)
    for name in args.variants.split(","):
        sharding, recompute, adapted = ONE_GPU[name]
        worker = None
        try:
            print(f"=== one_gpu.{name}", flush=True)
            t0 = time.perf_counter()
            worker = TorchPolicyWorker(
                dataclasses.replace(build, lora=adapters) if adapted else build,
                optim(args.micro_batch or args.batch),
                LossConfig(),
                rank=0,
                world_size=1,
                device=str(dev),
                rendezvous=free_address(),
                num_threads=args.threads,
                sharding=sharding,
                activation_checkpointing=recompute,
            )
            setup = time.perf_counter() - t0
            result = measure(worker, rows, dev, args.steps, args.warmup)
            res.put(f"one_gpu.{name}", {"setup_s": setup, "threads": args.threads, **result})
            if args.then_threads:  # the same worker on fewer (or more) host threads
                torch.set_num_threads(args.then_threads)
                result = measure(worker, rows, dev, 1, warmup=0)
                res.put(
                    f"one_gpu.{name}.threads{args.then_threads}", {"threads": args.then_threads, **result}
                )
                torch.set_num_threads(args.threads)
        except torch.OutOfMemoryError:
            res.put(f"one_gpu.{name}", {"out_of_memory": traceback.format_exc()[-1500:]})
        except Exception:
            res.put(f"one_gpu.{name}", {"error": traceback.format_exc()[-3000:]})
        if worker is not None:
            worker.shutdown()
        worker = None
        c.release_memory(compiled=True)


def ranks_part(res: c.Results, args: argparse.Namespace, tmp: Path) -> None:
    """Each layout as `--gpus` processes of this script (`rank_main`), then rank 0's results."""
    n = args.gpus
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for name in args.layouts.split(","):
        key = f"ranks{n}.{name}"
        try:
            spec = json.dumps({**vars(args), "layout": name, "address": free_address(), "tmp": str(tmp)})
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--rank", str(r), "--rank-spec", spec],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for r in range(n)
            ]
            logs = [p.communicate(timeout=args.rank_timeout)[0] for p in procs]
            parts = [tmp / f"{name}-{r}.json" for r in range(n)]
            if any(p.returncode for p in procs) or not all(f.exists() for f in parts):
                failed = [log[-2000:] for p, log in zip(procs, logs, strict=True) if p.returncode]
                oom = any("OutOfMemoryError" in log for log in logs)
                res.put(key, {"out_of_memory" if oom else "error": failed or logs[0][-2000:]})
                continue
            ranks = [json.loads(f.read_text()) for f in parts]
            result = {
                "step_s": max(r["step_s"] for r in ranks),
                "peak_gpu_gib_per_rank": [r["peak_gpu_gib"] for r in ranks],
                "host_rss_gib_per_rank": [r["host_rss_gib"] for r in ranks],
                "tokens_per_s": sum(r["tokens_per_s"] for r in ranks) / len(ranks) * n,
            }
            if args.parity:
                weights[name] = torch.load(tmp / f"{name}-weights.pt")
                if name != "dp" and "dp" in weights:
                    a, b = weights[name], weights["dp"]
                    result["max_abs_weight_diff_vs_dp"] = max(float((a[k] - b[k]).abs().max()) for k in b)
            res.put(key, result)
        except Exception:
            res.put(key, {"error": traceback.format_exc()[-3000:]})


def rank_main(rank: int, spec: dict[str, Any]) -> None:
    """One rank of a layout (a subprocess of `ranks_part`): `steps` timed steps on its own rows."""
    args = argparse.Namespace(**spec)
    n, name, tmp = args.gpus, args.layout, Path(args.tmp)
    dev = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
    build = build_of(args)
    sharding, recompute = LAYOUTS[name]
    worker = TorchPolicyWorker(
        build,
        optim(args.micro_batch or args.batch),
        LossConfig(),
        rank=rank,
        world_size=n,
        device=str(dev),
        rendezvous=args.address,
        sharding=sharding,
        activation_checkpointing=recompute,
    )
    rows = grpo_rows(build.config.vocab_size, args.batch * n, args.seq)[rank::n]
    result = measure(worker, rows, dev, args.steps)
    if args.parity:
        weights = worker.weights()  # sharded: a collective, rank 0 gets them
        if rank == 0:
            torch.save(weights, tmp / f"{name}-weights.pt")
    # Every rank's collectives have ended before any leaves the group: a gloo rank that destroyed
    # its group while its peer's last send was still in flight aborted at exit ("terminate called
    # without an active exception", 2 of about 10 CPU runs under load).
    if dist.is_initialized():
        dist.barrier()
    worker.shutdown()
    (tmp / f"{name}-{rank}.json").write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="the 2-layer model on the CPU (gloo)")
    ap.add_argument("--out")
    ap.add_argument("--shape", default="qwen2.5-3b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, help="rows per step (per rank with --gpus)")
    ap.add_argument("--micro-batch", type=int, help="rows per forward pass (default: --batch)")
    ap.add_argument("--seq", type=int, help="positions per row")
    ap.add_argument("--steps", type=int, help="timed steps (after --warmup untimed)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation) of the one_gpu part")
    ap.add_argument("--threads", type=int, default=1, help="the worker's host threads (the trainer's: 1)")
    ap.add_argument(
        "--then-threads", type=int, help="then one more step of each variant on this many threads"
    )
    ap.add_argument("--lora-rank", type=int, default=16, help="the lora variants' rank (alpha: twice it)")
    ap.add_argument("--gpus", type=int, default=0, help="N >= 2: the ranks<N> part")
    ap.add_argument("--skip-one-gpu", action="store_true")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {sorted(ONE_GPU)}, comma-separated")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="of the ranks<N> part, comma-separated")
    ap.add_argument("--parity", action="store_true", help="float32, TF32 off, small model: weights vs dp")
    ap.add_argument("--rank-timeout", type=float, default=500)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank-spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parity:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.rank is not None:
        rank_main(args.rank, json.loads(args.rank_spec))
        return
    args.batch = args.batch or (2 if args.tiny else 8)
    args.seq = args.seq or (16 if args.tiny else 1024)
    args.steps = args.steps or (1 if args.tiny else 3 if args.parity else 5)
    build = build_of(args)
    res = c.Results(
        args.out,
        workload={"batch": args.batch, "seq": args.seq, "steps": args.steps, "gpus": args.gpus},
        lora={"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank, "target_modules": list(lora.TARGETS)},
        model={
            "shape": "parity" if args.parity else "tiny" if args.tiny else args.shape,
            "dtype": build.dtype,
            "parameters": sum(p.numel() for p in build.skeleton().parameters()),
        },
    )
    t0 = time.perf_counter()
    if not args.skip_one_gpu:
        one_gpu_part(res, args, build)
    if args.gpus >= 2:
        with tempfile.TemporaryDirectory() as d:
            ranks_part(res, args, Path(d))
    res.put("total_seconds", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
