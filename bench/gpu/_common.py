"""Shared pieces of the GPU benchmarks: the model shapes, device ceilings, timing, JSON output.

The scripts run on an H200 machine with `PYTHONPATH=trainer` (the package is not installed there)
and on CPU with `--tiny`, which the CPU tests use to keep them runnable.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from asyncgrpo_trainer.models.config import ModelConfig, tiny_config
from asyncgrpo_trainer.models.network import CausalLM

# The 387M Qwen2 shape of issue 8 (Qwen2.5-0.5B's layout with a 32k vocabulary).
QWEN2_387M = tiny_config(
    vocab_size=32000,
    hidden_size=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    intermediate_size=4864,
    max_positions=2048,
    position_embedding="rope",
)
TINY = tiny_config(
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    max_positions=128,
    position_embedding="rope",
)
PEAK_BF16_FLOPS = 989e12  # H100/H200 SXM dense bf16 datasheet figure, the MFU denominator


def config(tiny: bool) -> ModelConfig:
    return TINY if tiny else QWEN2_387M


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_model(cfg: ModelConfig, dev: torch.device, dtype: torch.dtype, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    with torch.device(dev):
        model = CausalLM(cfg)
        model.init_random()
    return model.to(dev, dtype)  # the RoPE tables are built on the CPU


def release_memory(*, compiled: bool = False) -> None:
    """Free what the variant that just ran left behind, so the next one is measured from an empty
    GPU: its tensors (once the caller has dropped its references), the caching allocator's blocks,
    and with `compiled` dynamo's graphs and guards (each variant compiles its own)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if compiled:
        torch._dynamo.reset()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn: Callable[[], Any], dev: torch.device, repeats: int) -> list[float]:
    """Wall seconds of each call, the device synchronized before and after."""
    out = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        out.append(time.perf_counter() - t0)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cuda"] = torch.version.cuda
    try:
        from importlib.metadata import version  # noqa: PLC0415

        env["transformers"] = version("transformers")
    except Exception:
        env["transformers"] = None
    return env


def device_ceilings(dev: torch.device) -> dict[str, float]:
    """Measured copy bandwidth (read + write bytes) and bf16 GEMM rate: the roofline ceilings."""
    if dev.type != "cuda":
        return {}
    n = 1 << 30  # 1 GiB of bf16 = 2^29 elements
    a = torch.randn(n // 2, device=dev, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    t = median(timed(lambda: b.copy_(a), dev, 20))
    bw = 2 * n / t
    a = b = torch.empty(0)
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    t = median(timed(lambda: x @ y, dev, 10))
    return {"copy_bytes_per_s": bw, "bf16_gemm_flops": 2 * m**3 / t}


class Results:
    """A JSON file rewritten after every measurement, so a run killed midway keeps what it got."""

    def __init__(self, path: str | None, **head: Any) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = {"environment": environment(), **head}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        print(f"[{key}] {json.dumps(value, default=str)}", flush=True)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, default=str))
            os.replace(tmp, self.path)
