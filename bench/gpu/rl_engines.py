"""The CUDA-graph torch engine and vLLM 0.26 on the workload RL produces (issue 33 item 2).

A step's generation: `--groups` prompts x `--group` samples (GRPO groups), prompt lengths lognormal
(median 128, sigma 0.6) clipped to [16, 512], response lengths lognormal (median 200, sigma 1.0)
clipped to [16, 1024] (`generation.maxNewTokens` 1024), all requests at once, as a sync step sends
them. tokens/s = the step's response tokens / wall time of the whole step (prefill included), the
median of `--repeats` runs, after a warm-up (the torch engine: compiling and capturing each batch
size's step; vLLM: the smaller workload once).

How rows end. The checkpoints have random weights, whose EOS comes at random (about once in
150,000 tokens), so each row is given its length instead, the way each engine would see EOS at
that token: vLLM gets one request per sample with `max_tokens` = its length (EOS ignored), which
frees its slot at that token exactly as EOS does (vLLM's scheduler does not look ahead at
max_tokens). The torch engine decodes a static batch until every row has ended, checking once
every `sync_every` (32) steps (`static_decode.Decoding`), and a row that ended still occupies its
slot; so a batch costs ceil(longest row / 32) x 32 steps (at most maxNewTokens), which is what the
bench runs it for, on a decoder built as the generation worker builds it (`max_batch_rows` rows,
cache for the whole maxSequenceLength, compiled layer, one captured graph per batch size), and
the rows go into batches oldest first, as `batched.GroupBatcher` takes them.

vLLM is the trainer's `VLLMGenerationWorker` with the trainer's engine arguments
(`vllm_engine.engine_args`: prefix caching, the per-request seeds the trainer sends, vLLM 0.26's
defaults otherwise), `gpu_memory_utilization` 0.5; each `VLLM` entry below changes some of them
(`max_num_seqs` through `VLLMOptions`, the rest on vLLM's `AsyncEngineArgs`), one engine start
each. `unseeded` runs repeat the larger workload on the same engine without per-request seeds
(vLLM samples seeded requests one row at a time). The prefix cache is reset before each run.

    PYTHONPATH=trainer:operator python3 bench/gpu/rl_engines.py --out rl_engines.json     # GPU
    PYTHONPATH=trainer:operator python3 bench/gpu/rl_engines.py --tiny --engines torch-256
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import torch
from packing_step import rl_workload
from vllm_vs_torch import checkpoint

from asyncgrpo_trainer.backends import sampling, vllm_engine
from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder
from asyncgrpo_trainer.models import recipe

TORCH = {"torch-256": 256, "torch-512": 512}
"""The torch engine's batch (generation worker's max_batch_rows; the trainer's is 256)."""
VLLM: dict[str, dict[str, Any]] = {
    "vllm-trainer": {},
    "vllm-mnbt16k": {"max_num_batched_tokens": 16384},
    "vllm-seqs512-mnbt16k": {"max_num_seqs": 512, "max_num_batched_tokens": 16384},
    "vllm-seqs1024-mnbt16k-cg1024": {
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 16384,
        "max_cudagraph_capture_size": 1024,
    },
    "vllm-no-async-scheduling": {"async_scheduling": False},
    "vllm-no-chunked-prefill": {"enable_chunked_prefill": False},
}
"""vLLM's engine arguments over the trainer's (max_num_seqs 256, vLLM's defaults otherwise)."""
SYNC_EVERY = 32


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    length: int
    """New tokens the sample gets before it ends (its EOS)."""


def workload(vocab: int, groups: int, group: int, caps: tuple[int, int], seed: int) -> list[Request]:
    """`groups` prompts x `group` samples, in arrival order (a group's samples together)."""
    prompts, lengths = rl_workload(vocab, groups, group, caps, torch.Generator().manual_seed(seed))
    return [Request(prompts[i // group], n) for i, n in enumerate(lengths)]


def describe(reqs: list[Request], cap: int) -> dict[str, Any]:
    lengths = sorted(r.length for r in reqs)
    return {
        "samples": len(reqs),
        "response_tokens": sum(lengths),
        "response_median": lengths[len(lengths) // 2],
        "response_p90": lengths[int(0.9 * len(lengths))],
        "at_cap": sum(n == cap for n in lengths),
        "prompt_tokens": sum(len(r.prompt) for r in reqs),
    }


def timed_runs(
    run: Any, works: dict[str, list[Request]], repeats: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`repeats` timed runs of each workload (median), then each `extra` run (name -> (workload,
    run function)) once; the caller has warmed the engine up."""
    plan = [(name, reqs, run, repeats) for name, reqs in works.items()]
    plan += [(name, works[w], fn, 1) for name, (w, fn) in (extra or {}).items()]
    out: dict[str, Any] = {}
    for name, reqs, fn, n in plan:
        walls = []
        for r in range(n):
            t0 = time.perf_counter()
            made = fn(reqs, r + 1)
            walls.append(time.perf_counter() - t0)
        wall = c.median(walls)
        out[name] = {"tokens_per_s": made["tokens"] / wall, "wall_s": wall, "all_walls_s": walls, **made}
        print(f"  {name}: {made['tokens'] / wall:,.0f} tokens/s, {wall:.2f} s", flush=True)
    return out


def torch_engine(build: recipe.ModelBuild, rows: int, works: dict[str, list[Request]], repeats: int) -> dict:
    dev = c.device()
    max_new = max(r.length for w in works.values() for r in w)
    t0 = time.perf_counter()
    model = build.instantiate().to(dev).eval()
    dec = StaticDecoder(
        model,
        max_batch=rows,
        max_prompt_len=build.max_positions - max_new,
        max_new_tokens=max_new,
        params=DecodeParams(1.0),
        eos_ids=(),
        pad_id=build.pad_id,
        sync_every=SYNC_EVERY,
        compile_layer=dev.type == "cuda",
    )
    setup = time.perf_counter() - t0

    def run(reqs: list[Request], seed: int) -> dict[str, Any]:
        tokens = steps = 0
        for start in range(0, len(reqs), rows):
            batch = reqs[start : start + rows]
            longest = max(r.length for r in batch)
            n = min(max_new, -(-longest // SYNC_EVERY) * SYNC_EVERY)
            decoding = dec.start([r.prompt for r in batch], seed=seed * 7919 + start, max_new_tokens=n)
            while not decoding.advance():
                pass
            decoding.output().to_lists()  # the results' device->host copy, as the worker makes it
            tokens += sum(r.length for r in batch)
            steps += n
        return {"tokens": tokens, "decode_steps": steps, "batches": -(-len(reqs) // rows)}

    t0 = time.perf_counter()
    for size in sorted({dec.graph_batch(min(rows, len(w))) for w in works.values()}):
        run([Request([1] * 16, SYNC_EVERY)] * size, 0)  # compile and capture this batch size's step
    warm = time.perf_counter() - t0
    out = timed_runs(run, works, repeats)
    return {"setup_s": setup, "warmup_s_compile_capture": warm, "max_batch_rows": rows, **out}


async def _vllm(
    build: recipe.ModelBuild, settings: dict[str, Any], works: dict[str, list[Request]], repeats: int
) -> dict[str, Any]:
    settings = dict(settings)
    options = vllm_engine.VLLMOptions(
        max_num_seqs=settings.pop("max_num_seqs", 256), gpu_memory_utilization=0.5
    )
    original = vllm_engine.engine_args

    def engine_args(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(original(*args, **kwargs), **settings)

    vllm_engine.engine_args = engine_args
    t0 = time.perf_counter()
    try:
        worker = vllm_engine.VLLMGenerationWorker(build, device=c.device().type, options=options)
    finally:
        vllm_engine.engine_args = original
    loop = asyncio.get_running_loop()

    async def generate(reqs: list[Request], seed: int, seeded: bool) -> dict[str, Any]:
        await worker.reset_cache()
        if not seeded:
            make = worker._sampling

            def unseeded(*args: Any) -> Any:
                params = make(*args)
                params.seed = None
                return params

            worker._sampling = unseeded  # type: ignore[method-assign]
        try:
            outs = await asyncio.gather(
                *(
                    worker.generate(
                        r.prompt,
                        1,
                        sampling.SamplingParams(max_new_tokens=r.length, temperature=1.0, ignore_eos=True),
                        seed=seed * 100_003 + i,
                    )
                    for i, r in enumerate(reqs)
                )
            )
        finally:
            if not seeded:
                del worker._sampling
        return {"tokens": sum(len(o.response_ids[0]) for o in outs)}

    def run(seeded: bool) -> Any:
        def fn(reqs: list[Request], seed: int) -> dict[str, Any]:
            return asyncio.run_coroutine_threadsafe(generate(reqs, seed, seeded), loop).result()

        return fn

    start = time.perf_counter() - t0
    try:
        smallest, largest = min(works, key=lambda k: len(works[k])), max(works, key=lambda k: len(works[k]))
        t0 = time.perf_counter()
        await generate(works[smallest], 0, seeded=True)  # the first requests' warm-up
        warm = time.perf_counter() - t0
        out = await loop.run_in_executor(
            None,
            lambda: timed_runs(run(True), works, repeats, {f"{largest}-unseeded": (largest, run(False))}),
        )
    finally:
        await worker.shutdown()
    return {
        "engine_start_s": start,
        "warmup_s": warm,
        "max_num_seqs": options.max_num_seqs,
        "settings": settings,
        **out,
    }


def wait_for_free_memory(fraction: float = 0.9, seconds: float = 60) -> float:
    """Wait until the GPU is nearly free again (an engine's process exiting); the free fraction."""
    if not torch.cuda.is_available():
        return 1.0
    deadline = time.monotonic() + seconds
    while True:
        free, total = torch.cuda.mem_get_info()
        if free / total >= fraction or time.monotonic() > deadline:
            return free / total
        time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="a vllm_vs_torch.py shape")
    ap.add_argument("--root", default="/tmp/asyncgrpo-bench-checkpoints")
    ap.add_argument("--out")
    ap.add_argument("--engines", default="torch-256,vllm-trainer", help=f"of {[*TORCH, *VLLM]}, in order")
    ap.add_argument("--groups", default="32,128", help="prompts per step of each workload")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-prompt", type=int)
    ap.add_argument("--max-new", type=int)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    shape = "tiny" if args.tiny else args.shape
    dtype = "bfloat16" if c.device().type == "cuda" else "float32"
    caps = (args.max_prompt or (16 if args.tiny else 512), args.max_new or (24 if args.tiny else 1024))
    path = checkpoint(shape, Path(args.root), dtype)
    build, _ = recipe.pretrained_build(
        str(path), max_sequence_length=sum(caps), dtype=dtype, seed=0, chat_template=None, system_prompt=None
    )
    groups = [int(g) for g in args.groups.split(",")] if not args.tiny else [2]
    vocab = min(build.config.vocab_size, 30000)
    works = {f"{g * args.group}x": workload(vocab, g, args.group, caps, seed=g) for g in groups}
    res = c.Results(
        args.out,
        workload={
            "shape": shape,
            "dtype": dtype,
            "max_prompt": caps[0],
            "max_new_tokens": caps[1],
            "group": args.group,
            **{name: describe(reqs, caps[1]) for name, reqs in works.items()},
        },
    )
    for name in args.engines.split(","):
        print(f"=== {name}", flush=True)
        try:
            if name in TORCH:
                res.put(name, torch_engine(build, TORCH[name], works, args.repeats))
            else:
                res.put(name, asyncio.run(_vllm(build, VLLM[name], works, args.repeats)))
        except Exception:
            res.put(name, {"error": traceback.format_exc()[-3000:]})
        c.release_memory()
        res.put(f"{name}.free_memory_after", wait_for_free_memory())


if __name__ == "__main__":
    main()
