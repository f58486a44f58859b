"""vLLM next to the trainer's CUDA-graph torch engine on the same checkpoint, in one run.

Workload of issue 15: batch 256 prompts of 128 random tokens, 256 sampled new tokens each
(temperature 1, EOS ignored so every row decodes all of them), bfloat16. tokens/s = rows x new
tokens / wall time of the whole batch (prefill included), median of `--repeats` after a warm-up
(CUDA-graph capture and compilation for the torch engine, vLLM's first request). The torch engine
is `StaticDecoder` with the compiled decode layer, as the generation worker runs it on CUDA; vLLM
is the trainer's `VLLMGenerationWorker`, given the rows as concurrent requests. Then the log-prob
gate: on 32 of vLLM's sampled rows, the policy's own log-probs (the network in bfloat16) against
vLLM's, mean exp|difference| over the tokens (<= 1.1 is the bar in bfloat16).

Shapes: `387m` is the issue's reference point (Qwen2.5-0.5B's layout with a 32k vocabulary,
untied), `qwen2.5-0.5b` the real vocabulary (151,936) and tied embeddings. The checkpoint is made
with `make_tiny_checkpoint` (random weights) unless it exists.

    PYTHONPATH=trainer:operator python3 bench/gpu/vllm_vs_torch.py --shape 387m --out v.json   # H200
    PYTHONPATH=trainer:operator python3 bench/gpu/vllm_vs_torch.py --tiny --out v.json        # CPU smoke
"""

from __future__ import annotations

import argparse
import asyncio
import time
import traceback
from pathlib import Path
from typing import Any

import _common as c
import torch

from asyncgrpo_trainer.backends import cuda_train, sampling
from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder
from asyncgrpo_trainer.backends.vllm_engine import VLLMGenerationWorker, VLLMOptions
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint

SHAPES: dict[str, dict[str, Any]] = {
    "387m": {
        "hidden_size": 896,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
        "intermediate_size": 4864,
        "model_vocab_size": 32000,
        "tie_word_embeddings": False,
    },
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
        "intermediate_size": 4864,
        "model_vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "num_layers": 28,
        "num_heads": 12,
        "num_kv_heads": 2,
        "intermediate_size": 8960,
        "model_vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128},
}


def checkpoint(shape: str, root: Path, dtype: str) -> Path:
    path = root / f"{shape}-{dtype}"
    if not (path / "config.json").is_file():
        make_tiny_checkpoint(path, family="qwen2", max_positions=4096, dtype=dtype, **SHAPES[shape])
    return path


def torch_engine(build: recipe.ModelBuild, prompts: torch.Tensor, new: int, repeats: int) -> dict[str, Any]:
    dev = c.device()
    model = build.instantiate().to(dev).eval()
    cuda = dev.type == "cuda"
    dec = StaticDecoder(
        model,
        max_batch=prompts.shape[0],
        max_prompt_len=prompts.shape[1],
        max_new_tokens=new,
        params=DecodeParams(1.0),
        eos_ids=(),
        compile_layer=cuda,
    )
    p = prompts.to(dev)
    t0 = time.perf_counter()
    dec.generate(p, seed=0)
    c.sync(dev)
    setup = time.perf_counter() - t0
    ts = c.timed(lambda: dec.generate(p, seed=0), dev, repeats)
    t = c.median(ts)
    return {
        "tokens_per_s": prompts.shape[0] * new / t,
        "seconds": t,
        "setup_s_capture_compile": setup,
        "all_runs_s": ts,
        "matmul_params": cuda_train.matmul_params(model),
    }


async def _vllm(build: recipe.ModelBuild, prompts: list[list[int]], new: int, repeats: int) -> dict[str, Any]:
    dev = c.device()
    t0 = time.perf_counter()
    worker = VLLMGenerationWorker(
        build,
        device=dev.type,
        options=VLLMOptions(max_num_seqs=len(prompts), gpu_memory_utilization=0.5),
    )
    params = sampling.SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    await worker.generate(prompts[0], 1, params, seed=0)
    start = time.perf_counter() - t0
    runs, outs = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        outs = await asyncio.gather(
            *(worker.generate(p, 1, params, seed=r * 1000 + i) for i, p in enumerate(prompts))
        )
        runs.append(time.perf_counter() - t0)
    produced = sum(len(o.response_ids[0]) for o in outs)
    await worker.shutdown()
    t = c.median(runs)
    sample = [(prompts[i], outs[i].response_ids[0], outs[i].logprobs[0]) for i in range(min(32, len(outs)))]
    return {
        "tokens_per_s": produced / t,
        "seconds": t,
        "engine_start_s": start,
        "tokens_per_run": produced,
        "all_runs_s": runs,
        "_sample": sample,
    }


def gate(build: recipe.ModelBuild, sample: list[tuple[list[int], list[int], list[float]]]) -> dict[str, Any]:
    """token_mult_prob_error of the policy's log-probs (the network in the model's dtype) vs vLLM's."""
    dev = c.device()
    model = build.instantiate().to(dev).eval()
    logprobs = cuda_train.ResponseLogprobs(cuda_train.Recipe(), pad_id=build.pad_id, temperature=1.0)
    with torch.no_grad():
        lp, mask = logprobs(model, [(p, r) for p, r, _ in sample], dev)
    engine = torch.zeros_like(lp)
    for i, (_, _, row) in enumerate(sample):
        engine[i, : len(row)] = torch.tensor(row, device=dev)
    err = ((lp.float() - engine).abs().exp() * mask).sum() / mask.sum()
    return {"token_mult_prob_error": float(err), "tokens": int(mask.sum()), "bar": 1.1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shape", default="387m", choices=sorted(SHAPES))
    ap.add_argument("--root", default="/tmp/asyncgrpo-bench-checkpoints")
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--prompt", type=int)
    ap.add_argument("--new", type=int)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    shape = "tiny" if args.tiny else args.shape
    dtype = "bfloat16" if c.device().type == "cuda" else "float32"
    batch = args.batch or (4 if args.tiny else 256)
    plen = args.prompt or (8 if args.tiny else 128)
    new = args.new or (8 if args.tiny else 256)
    res = c.Results(
        args.out, workload={"shape": shape, "batch": batch, "prompt": plen, "new": new, "dtype": dtype}
    )
    path = checkpoint(shape, Path(args.root), dtype)
    build, _ = recipe.pretrained_build(
        str(path), max_sequence_length=plen + new, dtype=dtype, seed=0, chat_template=None, system_prompt=None
    )
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, min(build.config.vocab_size, 30000), (batch, plen), generator=g)
    try:
        res.put("torch_engine", torch_engine(build, prompts, new, args.repeats))
    except Exception:
        res.put("torch_engine", {"error": traceback.format_exc()[-3000:]})
    c.release_memory()
    if not args.skip_vllm:
        try:
            out = asyncio.run(_vllm(build, prompts.tolist(), new, args.repeats))
            sample = out.pop("_sample")
            res.put("vllm", out)
            res.put("gate_bf16" if dtype == "bfloat16" else "gate_fp32", gate(build, sample))
            ours = res.data.get("torch_engine", {}).get("tokens_per_s")
            if ours:
                res.put("torch_over_vllm", ours / out["tokens_per_s"])
        except Exception:
            res.put("vllm", {"error": traceback.format_exc()[-3000:]})


if __name__ == "__main__":
    main()
