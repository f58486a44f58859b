"""Policy training step throughput and MFU: cuda_train.TrainStep variants vs the plain eager step.

MFU = 6 x N x tokens / step time / 989e12, N = matmul parameters (all but the input embedding
table, 387M for the issue's shape; the 27% baseline of issue 8 used the same N), tokens = batch x
seq positions trained per step, 989 TFLOP/s = the H100/H200 SXM dense bf16 datasheet peak.
Attention FLOPs are not counted (they would add ~5% at 1K tokens). The step is a full optimizer
step: forward, GRPO surrogate loss over a 32k-vocabulary log-softmax, backward, grad clipping,
fused AdamW.

    PYTHONPATH=trainer python3 bench/gpu/train_step.py --out train_step.json   # H200
    PYTHONPATH=trainer python3 bench/gpu/train_step.py --tiny                  # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import time
import traceback
from typing import Any

import _common as c
import torch

from asyncgrpo_trainer.backends.cuda_train import TrainOptions, TrainStep, matmul_params

VARIANTS = {
    # name: (options, parameter dtype the model is built in)
    "eager_bf16_fused_adamw (baseline)": (TrainOptions(compile=False, master_fp32=False), torch.bfloat16),
    "compiled_bf16_fused_adamw": (TrainOptions(compile=True, master_fp32=False), torch.bfloat16),
    "compiled_amp_fp32_master_fused_adamw": (TrainOptions(compile=True, master_fp32=True), torch.float32),
    "eager_amp_fp32_master_fused_adamw": (TrainOptions(compile=False, master_fp32=True), torch.float32),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--variants", help="comma-separated prefixes of variant names")
    args = ap.parse_args()
    dev = c.device()
    cfg = c.config(args.tiny)
    batch = args.batch or (2 if args.tiny else 16)
    seq = args.seq or (16 if args.tiny else 1024)
    iters = args.iters or (2 if args.tiny else 10)
    names = list(VARIANTS)
    if args.variants:
        names = [n for n in names if any(n.startswith(p) for p in args.variants.split(","))]
    elif dev.type != "cuda":
        names = [n for n in names if n.startswith("eager")]  # inductor on CPU is not what this measures
    res = c.Results(
        args.out,
        workload={"batch": batch, "seq": seq, "tokens_per_step": batch * seq, "iters": iters},
        mfu={"formula": "6 * N_matmul * tokens / step_seconds / peak", "peak_flops": c.PEAK_BF16_FLOPS},
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq + 1), generator=g).to(dev)
    mask = torch.zeros(batch, seq, device=dev)
    mask[:, seq // 8 :] = 1.0  # a prompt then a response, as in GRPO rows
    adv = torch.randn(batch, generator=g).to(dev)
    out: dict[str, Any] = {}
    for name in names:
        opts, dtype = VARIANTS[name]
        step: TrainStep | None = None
        try:
            model = c.build_model(cfg, dev, dtype)
            n_mm = matmul_params(model)
            step = TrainStep(model, opts)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            for _ in range(3):
                loss = step(ids, mask, adv)
            c.sync(dev)
            warm = time.perf_counter() - t0
            losses: list[torch.Tensor] = []
            ts = c.timed(lambda s=step, ls=losses: ls.append(s(ids, mask, adv)), dev, iters)
            t = c.median(ts)
            tokens = batch * seq
            out[name] = {
                "step_s": t,
                "tokens_per_s": tokens / t,
                "mfu": 6 * n_mm * tokens / t / c.PEAK_BF16_FLOPS,
                "matmul_params": n_mm,
                "warmup_s_incl_compile": warm,
                "loss_first_last": [float(losses[0]), float(losses[-1])],
                "finite": bool(torch.isfinite(torch.stack(losses)).all()),
                "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
                "all_steps_s": ts,
            }
            del loss
            res.put(name, out[name])
        except Exception:
            res.put(name, {"error": traceback.format_exc()[-3000:]})
        del step
        model = None
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if opts.compile:
            torch._dynamo.reset()
    base = out.get("eager_bf16_fused_adamw (baseline)", {}).get("mfu")
    best_name = max(out, key=lambda k: out[k]["mfu"]) if out else None
    res.put(
        "summary",
        {
            "baseline_mfu": base,
            "best": best_name,
            "best_mfu": out[best_name]["mfu"] if best_name else None,
            "speedup_vs_baseline": out[best_name]["mfu"] / base if best_name and base else None,
            "target_mfu": 0.40,
        },
    )


if __name__ == "__main__":
    main()
