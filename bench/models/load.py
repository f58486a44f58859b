"""Loading a Qwen2.5-0.5B-shaped checkpoint: the trainer's loader next to safetensors' own.

Both read the same files in the same run, alternating, with the page cache warm for both (the
first, untimed, read warms it): `safetensors.torch.load_file` (the floor: the tensors, nothing
else) vs `ModelBuild.instantiate()` of a pretrained recipe (config, tokenizer, the network built
on the meta device, every tensor checked and assigned, rotary tables). Two timings of each:
"lazy", until the call returns (safetensors maps the file, so no byte has been read yet), and
"resident", until every weight byte has been read once (a sum over each tensor, what a first
forward pass also costs), which is the time a user waits for a usable model. With `--device cuda`
"resident" is the copy of every tensor to the GPU instead. The checkpoint is made
here with `make_tiny_checkpoint` at Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV
heads, intermediate 4864, vocabulary 151,936, tied embeddings, bfloat16) and random weights.

    PYTHONPATH=trainer python bench/models/load.py --dir /tmp/qwen2.5-0.5b-shape --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file

from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.directory import WEIGHTS
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint

QWEN25_05B = {
    "hidden_size": 896,
    "num_layers": 24,
    "num_heads": 14,
    "num_kv_heads": 2,
    "intermediate_size": 4864,
    "max_positions": 32768,
    "model_vocab_size": 151936,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}


def ensure_checkpoint(directory: Path) -> Path:
    if not (directory / WEIGHTS).is_file():
        make_tiny_checkpoint(directory, family="qwen2", **QWEN25_05B)
    return directory


def _make_resident(tensors: Iterable[torch.Tensor], device: str) -> None:
    """Read every byte of `tensors` once (on CPU), or copy them to the GPU (and wait for it)."""
    with torch.no_grad():
        if device == "cpu":
            for t in tensors:
                t.sum()
        else:
            kept = [t.to(device, non_blocking=True) for t in tensors]
            torch.cuda.synchronize()
            del kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/qwen2.5-0.5b-shape")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cpu", help="cpu: read every byte; cuda: copy to the GPU")
    ns = parser.parse_args(argv)
    path = ensure_checkpoint(Path(ns.dir))
    build, _ = recipe.pretrained_build(
        str(path), max_sequence_length=4096, dtype="bfloat16", seed=0, chat_template=None, system_prompt=None
    )
    load_file(str(path / WEIGHTS))  # warm the page cache for both
    timings: dict[str, list[float]] = {k: [] for k in ("floor_lazy", "floor", "ours_lazy", "ours")}
    for _ in range(ns.repeat):
        t0 = time.perf_counter()
        tensors = load_file(str(path / WEIGHTS))
        timings["floor_lazy"].append(time.perf_counter() - t0)
        _make_resident(tensors.values(), ns.device)
        timings["floor"].append(time.perf_counter() - t0)
        del tensors
        t0 = time.perf_counter()
        model = build.instantiate()
        timings["ours_lazy"].append(time.perf_counter() - t0)
        _make_resident(model.parameters(), ns.device)
        timings["ours"].append(time.perf_counter() - t0)
        del model
    med = {k: statistics.median(v) for k, v in timings.items()}
    result = {
        "checkpoint_bytes": (path / WEIGHTS).stat().st_size,
        "device": ns.device,
        "resident_load_file_s": med["floor"],
        "resident_instantiate_s": med["ours"],
        "resident_ratio": med["ours"] / med["floor"],
        "lazy_load_file_s": med["floor_lazy"],
        "lazy_instantiate_s": med["ours_lazy"],
        "lazy_ratio": med["ours_lazy"] / med["floor_lazy"],
        "runs": timings,
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
