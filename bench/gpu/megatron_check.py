"""The Megatron policy backend on GPUs: does it agree with CausalLM / the torch worker, and how
long is a step. One process per GPU, NCCL; every part is caught and reported on its own.

Parts (JSON keys):
- `tp1_logits`: a TP=1 GPTModel built from a recipe vs CausalLM on the same GPU: max |logit
  difference| and max |log-prob difference| of the response tokens, and whether `weights()` hands
  back the recipe's weights exactly.
- `tp1_step`: one training step (KL on, temperature 0.7, 3 chunks) of MegatronPolicyWorker vs
  TorchPolicyWorker on the same rows: loss, grad_norm, every metric, max weight difference after
  the step; then the median step time of a larger batch.
- `tp2` and `dp2` (with 2 GPUs): the same step as two ranks (TP=2, whose odd vocabulary is padded
  and sharded, and DP=2), compared with the TP=1 results.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=trainer python3 bench/gpu/megatron_check.py --out megatron.json
    PYTHONPATH=trainer python3 bench/gpu/megatron_check.py --tiny     # CPU smoke run (gloo)

Float32 throughout the comparisons (TF32 off), so differences are summation-order noise.
"""

from __future__ import annotations

import argparse
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

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy, sampling
from asyncgrpo_trainer.models.config import ModelConfig, tiny_config
from asyncgrpo_trainer.models.recipe import ModelBuild

# Odd vocabulary on purpose: TP=2 must pad and mask it.
GPU_CONFIG = tiny_config(
    vocab_size=32003,
    hidden_size=896,
    num_layers=4,
    num_heads=14,
    num_kv_heads=2,
    intermediate_size=4864,
    max_positions=1024,
    position_embedding="rope",
)
LOSS = losses.LossConfig(reference_policy_kl_penalty=0.05)


def recipe(tiny: bool) -> ModelBuild:
    return ModelBuild(c.TINY if tiny else GPU_CONFIG, seed=5, dtype="float32", pad_id=0, eos_ids=(2,))


def optim(micro: int) -> policy.OptimConfig:
    return policy.OptimConfig(
        learning_rate=1e-4,
        weight_decay=0.01,
        max_grad_norm=1.0,
        warmup_steps=0,
        micro_batch_size=micro,
        logprob_batch_size=micro,
        temperature=0.7,
    )


def rows(build: ModelBuild, n: int, prompt: int, response: int) -> list[policy.TrainRow]:
    g = torch.Generator().manual_seed(1)
    vocab = build.config.vocab_size
    out = []
    for i in range(n):
        p = torch.randint(3, vocab, (prompt - i % 3,), generator=g).tolist()
        length = response - 2 * (i % 4)
        r = torch.randint(3, vocab, (length,), generator=g).tolist()
        gen = (-torch.rand(length, generator=g) * 8).tolist()
        out.append(policy.TrainRow(p, r, gen, float(torch.randn(1, generator=g))))
    return out


def with_reference(build: ModelBuild, device: str, batch: list[policy.TrainRow]) -> list[policy.TrainRow]:
    worker = policy.TorchPolicyWorker(build, optim(4), LOSS, rank=0, world_size=1, device=device)
    ref = worker.reference_logprobs([(r.prompt_ids, r.response_ids) for r in batch])
    del worker
    return [
        policy.TrainRow(r.prompt_ids, r.response_ids, r.generation_logprobs, r.advantage, lp)
        for r, lp in zip(batch, ref, strict=True)
    ]


def step(worker: policy.PolicyWorker, batch: list[policy.TrainRow]) -> dict[str, float]:
    third = max(len(batch) // 3, 1)
    for i in range(0, len(batch), third):
        worker.train_chunk(batch[i : i + third])
    return worker.finish_step()


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def metric_diffs(ours: dict[str, float], ref: dict[str, float]) -> dict[str, Any]:
    return {
        k: {"megatron": ours.get(k), "torch": v, "abs_diff": abs(ours.get(k, float("nan")) - v)}
        for k, v in ref.items()
    }


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def tp1_parts(res: c.Results, args: argparse.Namespace, dev: str, tmp: Path) -> None:
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    build = recipe(args.tiny)
    batch = with_reference(build, dev, rows(build, 12, 24 if args.tiny else 200, 8 if args.tiny else 56))
    pairs = [(r.prompt_ids, r.response_ids) for r in batch]
    print("torch worker step ...", flush=True)
    torch_worker = policy.TorchPolicyWorker(build, optim(4), LOSS, rank=0, world_size=1, device=dev)
    torch_metrics = step(torch_worker, batch)
    torch_weights = torch_worker.weights()
    del torch_worker
    torch.save({"metrics": torch_metrics, "weights": torch_weights, "batch": batch}, tmp / "tp1.pt")

    print("megatron TP=1 worker ...", flush=True)
    worker = megatron_policy.MegatronPolicyWorker(build, optim(4), LOSS, rank=0, world_size=1, device=dev)
    try:
        try:
            tiny = build.instantiate().to(dev)
            ids = torch.tensor([pairs[0][0] + pairs[0][1]], device=dev)
            with torch.no_grad():
                expected, _ = tiny(ids)
                got = worker.forward_logits(worker.model, ids)
                ours, mask = worker.token_logprobs(worker.model, pairs, grad=False)
                theirs, _ = sampling.token_logprobs(
                    tiny, pairs, pad_id=build.pad_id, temperature=0.7, device=torch.device(dev)
                )
            initial = {k: v.cpu() for k, v in tiny.state_dict().items()}
            res.put(
                "tp1_logits",
                {
                    "max_abs_logit_diff": float((got - expected).abs().max()),
                    "max_abs_logprob_diff": float(((ours - theirs) * mask).abs().max()),
                    "weights_equal_recipe": max_diff(worker.weights(), initial) == 0.0,
                },
            )
            del tiny
        except Exception:
            res.put("tp1_logits", {"error": traceback.format_exc()})
        try:
            metrics = step(worker, batch)
            res.put(
                "tp1_step",
                {
                    "metrics": metric_diffs(metrics, torch_metrics),
                    "max_abs_weight_diff_after_step": max_diff(worker.weights(), torch_weights),
                },
            )
        except Exception:
            res.put("tp1_step", {"error": traceback.format_exc()})
        if not args.tiny:
            try:
                big = with_reference(build, dev, rows(build, 32, 768, 256))
                big_opt = optim(8)
                worker.optim_cfg = big_opt
                times = []
                for _ in range(4):
                    c.sync(torch.device(dev))
                    t0 = time.perf_counter()
                    worker.train_chunk(big)
                    worker.finish_step()
                    c.sync(torch.device(dev))
                    times.append(time.perf_counter() - t0)
                tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in big)
                res.put(
                    "tp1_step_time",
                    {
                        "rows": len(big),
                        "tokens": tokens,
                        "micro_batch": big_opt.micro_batch_size,
                        "seconds_each": times,
                        "median_after_warmup_s": c.median(times[1:]),
                        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                    },
                )
            except Exception:
                res.put("tp1_step_time", {"error": traceback.format_exc()})
    finally:
        worker.shutdown()


def two_rank_part(res: c.Results, name: str, tp: int, args: argparse.Namespace, tmp: Path) -> None:
    """Run ranks 0 and 1 of `--rank` mode as subprocesses and compare rank 0's output with TP=1."""
    try:
        address, out = free_address(), tmp / f"{name}.pt"
        cmd = [sys.executable, __file__, "--rank-args", json.dumps([tp, address, str(tmp), name])]
        cmd += ["--tiny"] if args.tiny else []
        procs = [
            subprocess.Popen(
                [*cmd, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for r in range(2)
        ]
        logs = [p.communicate(timeout=150)[0] for p in procs]
        if any(p.returncode for p in procs) or not out.exists():
            res.put(name, {"error": "rank failed", "logs": [log[-3000:] for log in logs]})
            return
        got = torch.load(out, weights_only=False)
        ref = torch.load(tmp / "tp1.pt", weights_only=False)
        res.put(
            name,
            {
                "metrics": metric_diffs(got["metrics"], ref["metrics"]),
                "max_abs_weight_diff_vs_torch": max_diff(got["weights"], ref["weights"]),
                "max_abs_reference_logprob_diff": max(
                    abs(a - b)
                    for ours, r in zip(got["logprobs"], got["rows"], strict=True)
                    for a, b in zip(ours, r.reference_logprobs or [], strict=True)
                ),
                "step_seconds": got["seconds"],
            },
        )
    except Exception:
        res.put(name, {"error": traceback.format_exc()})


def rank_main(rank: int, spec: str, tiny: bool) -> None:
    """One rank of a two-rank run (a subprocess of this script)."""
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    tp, address, tmp, name = json.loads(spec)
    dev = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
    build = recipe(tiny)
    batch = torch.load(Path(tmp) / "tp1.pt", weights_only=False)["batch"]
    dp_rank, dp = rank // tp, 2 // tp
    mine = batch[dp_rank::dp]
    layout = megatron_policy.MegatronLayout(tensor_parallel_size=tp)
    worker = megatron_policy.MegatronPolicyWorker(
        build, optim(4), LOSS, rank=rank, world_size=2, device=dev, rendezvous=address, layout=layout
    )
    logprobs = worker.reference_logprobs([(r.prompt_ids, r.response_ids) for r in mine])
    t0 = time.perf_counter()
    metrics = step(worker, mine)
    seconds = time.perf_counter() - t0
    weights = worker.weights()
    worker.shutdown()
    if rank == 0:
        payload = {
            "metrics": metrics,
            "weights": weights,
            "logprobs": logprobs,
            "rows": mine,
            "seconds": seconds,
        }
        torch.save(payload, Path(tmp) / f"{name}.pt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--rank-args")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.rank is not None:
        rank_main(args.rank, args.rank_args, args.tiny)
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpus = torch.cuda.device_count()
    res = c.Results(args.out, part="megatron policy backend vs torch", gpus=gpus)
    try:
        import megatron.core  # noqa: PLC0415

        res.put("megatron_core", getattr(megatron.core, "__version__", "unknown"))
    except Exception:
        res.put("megatron_core", {"error": traceback.format_exc()})
        return
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        try:
            tp1_parts(res, args, dev, tmp)
        except Exception:
            res.put("tp1_setup", {"error": traceback.format_exc()})
        if (tmp / "tp1.pt").exists() and (gpus >= 2 or dev == "cpu"):
            for name, tp in (("tp2", 2), ("dp2", 1)):
                print(f"{name} ...", flush=True)
                two_rank_part(res, name, tp, args, tmp)
        elif gpus < 2:
            res.put("tp2", {"skipped": f"{gpus} GPU(s)"})
    res.put("total_seconds", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
