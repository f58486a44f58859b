"""The GPU benchmark scripts (bench/gpu) stay runnable: each runs in its --tiny CPU configuration.

decode and train_step run in-process (main() with a patched argv), so no extra torch import is
paid; refit runs as its own process, because it forks its two gloo ranks and a fork of a process
that has already run torch work (autograd and OpenMP threads) can deadlock in the child; so does
fsdp_step, whose one-rank FSDP variants form a process group of their own. Checks that every
measurement landed in the JSON without an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def _errors(data: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in data.items() if isinstance(v, dict) and "error" in v}


def _run(monkeypatch: pytest.MonkeyPatch, module: str, out: Path, *extra: str) -> dict[str, object]:
    mod = __import__(module)
    monkeypatch.setattr(sys, "argv", [module, "--tiny", "--out", str(out), *extra])
    mod.main()
    data: dict[str, object] = json.loads(out.read_text())
    assert not _errors(data), _errors(data)
    return data


def test_decode_tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = _run(monkeypatch, "decode", tmp_path / "decode.json", "--skip-hf", "--repeats", "1")
    check = data["greedy_check_vs_model_forward"]
    assert isinstance(check, dict) and check["token_agreement"] == 1.0
    assert "ours.eager_no_graph" in data


def test_train_step_tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = _run(monkeypatch, "train_step", tmp_path / "train.json", "--iters", "1")
    assert data["summary"]


def test_refit_tiny(tmp_path: Path) -> None:
    out = tmp_path / "refit.json"
    root = BENCH.parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "trainer"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, str(BENCH / "refit.py"), "--tiny", "--repeats", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=120, env=env, capture_output=True)
    data = json.loads(out.read_text())
    assert not _errors(data), _errors(data)
    assert data["refit.sender_float32.receiver_equals_sender"] is True
    assert data["refit.sender_bfloat16.receiver_equals_sender"] is True


def test_fsdp_step_tiny(tmp_path: Path) -> None:
    """The one-GPU variants in the script's own process, then two gloo ranks per layout."""
    out = tmp_path / "fsdp.json"
    root = BENCH.parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "trainer"), os.environ.get("PYTHONPATH", "")]),
    }
    layouts = "dp,fsdp_activation_checkpointing"
    cmd = [
        sys.executable,
        str(BENCH / "fsdp_step.py"),
        "--tiny",
        "--gpus",
        "2",
        "--parity",
        "--layouts",
        layouts,
    ]
    subprocess.run([*cmd, "--out", str(out)], check=True, timeout=300, env=env, capture_output=True)
    data = json.loads(out.read_text())
    assert not _errors(data), _errors(data)
    assert {k for k in data if k.startswith("one_gpu.")} == {
        "one_gpu.plain",
        "one_gpu.activation_checkpointing",
        "one_gpu.cpu_offload",
        "one_gpu.cpu_offload_activation_checkpointing",
    }
    sharded = data["ranks2.fsdp_activation_checkpointing"]
    assert isinstance(sharded, dict) and sharded["max_abs_weight_diff_vs_dp"] <= 1e-5


def test_packing_step_tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = _run(monkeypatch, "packing_step", tmp_path / "packing.json", "--warmup", "0")
    assert {"padded", "packed128", "packed_over_padded"} <= set(data)


def test_rl_engines_tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The torch engine on the RL workload (vLLM needs a GPU build here)."""
    root = str(tmp_path / "checkpoints")
    data = _run(monkeypatch, "rl_engines", tmp_path / "rl.json", "--engines", "torch-256", "--root", root)
    run = data["torch-256"]
    assert isinstance(run, dict) and run["16x"]["tokens"] == data["workload"]["16x"]["response_tokens"]
