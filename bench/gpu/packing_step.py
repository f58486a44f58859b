"""Packed against padded micro-batches on one GPU, on responses of the lengths RL produces.

The policy worker's own step (`train_chunk` + `finish_step`, the CUDA recipe: fp32 masters, bf16
autocast, compiled blocks and head, fused AdamW) on the same rows, once per variant:
`padded` (`policy.trainMicroBatchSize` rows a forward pass, right-padded to the longest row and
then to the compiled path's length bucket, `cuda_train.bucket_length`) and `packed<B>`
(`policy.maxTokensPerMicroBatch` B: rows end to end under a block-diagonal causal mask, the
sequence padded to B; `packing.token_budget_batches` plans the passes). Rows: GRPO groups of
`--group` samples of one prompt; prompt lengths lognormal (median 128, sigma 0.6) clipped to
[16, 512], response lengths lognormal (median 200, sigma 1.0) clipped to [16, 1024], as EOS ends
them when the cap is 1024. Random weights at a Qwen2.5 shape (`fsdp_step.SHAPES`), bf16.

tokens/s counts the rows' own tokens (prompt + response - 1 per row, what the forward reads), not
padding; `positions` is what the forward passes computed over (padding included). Each variant:
the worker's set-up, `--warmup` untimed steps (they compile every length bucket the rows need:
`warmup_s`), then the median of `--steps` (fsdp_step.measure), and the peak GPU memory.

    PYTHONPATH=trainer python3 bench/gpu/packing_step.py --shape qwen2.5-1.5b --out packing.json
    PYTHONPATH=trainer python3 bench/gpu/packing_step.py --tiny                 # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import traceback

import _common as c
import torch
from fsdp_step import SHAPES, measure, optim

from asyncgrpo_trainer.algorithms.losses import LossConfig
from asyncgrpo_trainer.backends import packing
from asyncgrpo_trainer.backends.cuda_train import Recipe, bucket_length
from asyncgrpo_trainer.backends.policy import TorchPolicyWorker, TrainRow
from asyncgrpo_trainer.models.recipe import ModelBuild


def lognormal_lengths(
    count: int, median: float, sigma: float, clip: tuple[int, int], g: torch.Generator
) -> list[int]:
    """`count` lengths exp(N(log median, sigma)) rounded and clipped to [low, high] = `clip`."""
    low, high = clip
    x = torch.exp(math.log(median) + sigma * torch.randn(count, generator=g, dtype=torch.float64))
    return [min(high, max(low, round(float(v)))) for v in x]


def rl_workload(
    vocab: int, groups: int, group: int, caps: tuple[int, int], g: torch.Generator
) -> tuple[list[list[int]], list[int]]:
    """The RL-shaped step both this bench and rl_engines.py use: one random prompt per group
    (lognormal length, median 128, sigma 0.6) and each sample's response length (median 200,
    sigma 1.0), clipped to [16, cap] with `caps` = (longest prompt, longest response)."""
    max_prompt, max_response = caps
    prompts = [
        torch.randint(1, vocab, (n,), generator=g).tolist()
        for n in lognormal_lengths(groups, 128, 0.6, (16, max_prompt), g)
    ]
    return prompts, lognormal_lengths(groups * group, 200, 1.0, (16, max_response), g)


def rl_rows(vocab: int, groups: int, group: int, caps: tuple[int, int], seed: int = 0) -> list[TrainRow]:
    """`groups` x `group` rows: one random prompt per group, each sample its own response length;
    `caps`: the longest prompt and the longest response."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = rl_workload(vocab, groups, group, caps, g)
    return [
        TrainRow(prompts[i // group], torch.randint(1, vocab, (n,), generator=g).tolist(), [-1.0] * n, adv)
        for i, (n, adv) in enumerate(
            zip(responses, torch.randn(len(responses), generator=g).tolist(), strict=True)
        )
    ]


def forward_passes(rows: list[TrainRow], micro_batch: int, budget: int | None) -> list[list[int]]:
    """The worker's plan of one step's forward passes (row indices), as `_forward_passes` makes it."""
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    return packing.micro_batches(lengths, rows_per_batch=micro_batch, token_budget=budget)


def positions(rows: list[TrainRow], micro_batch: int, budget: int | None, cap: int, compiled: bool) -> int:
    """Positions the forward passes of one step compute over, padding included (a row of n tokens
    feeds n - 1 inputs; `cuda_train.ResponseLogprobs` pads them)."""
    inputs = [len(r.prompt_ids) + len(r.response_ids) - 1 for r in rows]
    passes = forward_passes(rows, micro_batch, budget)
    if budget is not None:
        return len(passes) * budget if compiled else sum(inputs)
    if not compiled:
        return sum(len(p) * max(inputs[i] for i in p) for p in passes)
    return sum(micro_batch * bucket_length(max(inputs[i] for i in p), cap) for p in passes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="the 2-layer model on the CPU")
    ap.add_argument("--out")
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--groups", type=int, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--micro-batch", type=int, default=8, help="padded: rows per forward pass")
    ap.add_argument("--budgets", default="8192,4096", help="packed: tokens per forward pass, comma-separated")
    ap.add_argument("--max-prompt", type=int, help="the prompt cap (data.maxPromptLength)")
    ap.add_argument("--max-response", type=int, help="the response cap (generation.maxNewTokens)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    dev = c.device()
    cfg = dataclasses.replace(c.TINY, tie_word_embeddings=True) if args.tiny else SHAPES[args.shape]
    groups = args.groups or (2 if args.tiny else 8)
    max_prompt = args.max_prompt or (32 if args.tiny else 512)
    max_response = args.max_response or (48 if args.tiny else 1024)
    steps = args.steps or (1 if args.tiny else 3)
    budgets = [int(b) for b in args.budgets.split(",")] if not args.tiny else [128]
    build = ModelBuild(cfg, seed=0, dtype="bfloat16", pad_id=0, eos_ids=(1,))
    rows = rl_rows(cfg.vocab_size, groups, args.group, (max_prompt, max_response))
    compiled = Recipe.for_device(dev, torch.bfloat16).compile
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    res = c.Results(
        args.out,
        workload={
            "shape": "tiny" if args.tiny else args.shape,
            "rows": len(rows),
            "groups": groups,
            "group": args.group,
            "row_tokens": sum(lengths) - len(rows),
            "response_tokens": sum(len(r.response_ids) for r in rows),
            "longest_row": max(lengths),
            "micro_batch": args.micro_batch,
            "steps": steps,
            "warmup": args.warmup,
        },
    )
    variants: list[tuple[str, int | None]] = [("padded", None), *((f"packed{b}", b) for b in budgets)]
    for name, budget in variants:
        worker = None
        try:
            print(f"=== {name}", flush=True)
            t0 = time.perf_counter()
            worker = TorchPolicyWorker(
                build,
                dataclasses.replace(optim(args.micro_batch), max_tokens_per_micro_batch=budget),
                LossConfig(),
                rank=0,
                world_size=1,
                device=str(dev),
            )
            setup = time.perf_counter() - t0
            result = measure(worker, rows, dev, steps, args.warmup)
            res.put(
                name,
                {
                    "setup_s": setup,
                    "positions": positions(rows, args.micro_batch, budget, cfg.max_positions, compiled),
                    "forward_passes": len(forward_passes(rows, args.micro_batch, budget)),
                    **result,
                },
            )
        except torch.OutOfMemoryError:
            res.put(name, {"out_of_memory": traceback.format_exc()[-1500:]})
        except Exception:
            res.put(name, {"error": traceback.format_exc()[-3000:]})
        worker = None
        c.release_memory(compiled=True)
    base = res.data.get("padded", {}).get("tokens_per_s")
    if base:
        res.put(
            "packed_over_padded",
            {
                n: res.data[n]["tokens_per_s"] / base
                for n, _ in variants[1:]
                if "tokens_per_s" in res.data.get(n, {})
            },
        )


if __name__ == "__main__":
    main()
