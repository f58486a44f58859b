"""The policy worker's step with packed micro-batches next to padded ones, on rows of varied length.

Both variants run the worker's real step (`train_chunk` + `finish_step`: forward, the GRPO loss,
backward, AdamW) on the same rows, one after the other, each in its own spawned process so that its peak
resident memory is its own: padded (`trainMicroBatchSize` rows right-padded to the longest) and
packed (`maxTokensPerMicroBatch`, rows end to end under a block-diagonal causal mask). Rows: prompts
of 16-64 tokens and responses with a long tail (most short, a few near the cap), as GRPO rollouts
are. tokens/s counts the rows' own tokens (prompt + response), not padding. Peak memory is the
process's maximum resident set after the steps, and its growth over the set-up (model, optimizer).

    PYTHONPATH=trainer:operator python bench/trainer/packed_step.py --steps 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import time
from typing import Any

import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

TOK = CharTokenizer("0123456789+=abcdefghijklmnopqrstuvwxyz")


def rows(count: int, max_response: int, seed: int) -> list[policy.TrainRow]:
    """GRPO-like rows: prompts of 16-64 tokens, responses mostly short with a long tail."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = int(torch.randint(16, 65, (1,), generator=g))
        response = max(1, min(max_response, int(torch.empty(1).exponential_(1 / 48, generator=g))))
        ids = torch.randint(3, TOK.vocab_size, (prompt + response,), generator=g).tolist()
        out.append(
            policy.TrainRow(
                ids[:prompt],
                ids[prompt:],
                (-torch.rand(response, generator=g) * 3).tolist(),
                float(torch.randn(1, generator=g)),
            )
        )
    return out


def run(args: argparse.Namespace, budget: int | None) -> dict[str, Any]:
    """One variant in this (spawned) process: seconds per step, tokens/s, peak memory."""
    torch.manual_seed(0)
    build = recipe.tiny_build(
        TOK,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.heads // 2,
        intermediate_size=None,
        max_sequence_length=64 + args.max_response,
        position_embedding="rope",
        dtype="float32",
        seed=0,
    )
    optim = policy.OptimConfig(
        learning_rate=1e-4,
        weight_decay=0.0,
        max_grad_norm=1.0,
        warmup_steps=0,
        micro_batch_size=args.micro_batch_size,
        logprob_batch_size=args.micro_batch_size,
        temperature=1.0,
        max_tokens_per_micro_batch=budget,
    )
    worker = policy.TorchPolicyWorker(
        build, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu", num_threads=args.threads
    )
    batch = rows(args.rows, args.max_response, seed=1)
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in batch)
    worker.train_chunk(batch)  # warm-up step, untimed
    worker.finish_step()
    setup_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        worker.train_chunk(batch)
        worker.finish_step()
        times.append(time.perf_counter() - t0)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step = statistics.median(times)
    return {
        "variant": "padded" if budget is None else f"packed ({budget} tokens)",
        "step_s": round(step, 3),
        "tokens_per_s": round(tokens / step),
        "peak_rss_mib": round(peak_kib / 1024),
        "rss_growth_mib": round((peak_kib - setup_kib) / 1024),
        "row_tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="rows per step")
    parser.add_argument("--max-response", type=int, default=384)
    parser.add_argument("--micro-batch-size", type=int, default=8, help="padded: rows per micro-batch")
    parser.add_argument("--budget", type=int, default=2048, help="packed: tokens per micro-batch")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (median)")
    args = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1, maxtasksperchild=1) as pool:
        results = [pool.apply(run, (args, budget)) for budget in (None, args.budget)]
    for result in results:
        print(json.dumps(result))
    padded, packed = results
    print(
        f"packed / padded: {packed['tokens_per_s'] / padded['tokens_per_s']:.2f}x tokens/s, "
        f"{packed['rss_growth_mib']} / {padded['rss_growth_mib']} MiB of step memory"
    )


if __name__ == "__main__":
    main()
