"""The real-model path end to end: `asyncgrpo run` on a Hugging Face checkpoint and a data file.

The shipped CPU example (docs/examples/pretrained-cpu.yaml) runs as a user runs it: a tiny random
Qwen2 checkpoint made with `asyncgrpo make-tiny-checkpoint`, the example's data files through
`--mount`, a few steps; what comes out is a Hugging Face directory that transformers loads, with the
same logits as `asyncgrpo export` of the last checkpoint's policy file, and different from the
checkpoint it started from (it trained).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "pretrained-cpu.yaml"

pytestmark = pytest.mark.trainer


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "asyncgrpo_cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def test_the_pretrained_cpu_example_trains_and_writes_a_checkpoint_transformers_loads(tmp_path: Path) -> None:
    models, checkpoints = tmp_path / "models", tmp_path / "checkpoints"
    _cli("make-tiny-checkpoint", str(models / "tiny-qwen2"), "--family", "qwen2", cwd=tmp_path)
    _cli(
        "run",
        str(EXAMPLE),
        "--mount",
        f"/models={models}",
        "--mount",
        f"/data={REPO / 'docs' / 'examples' / 'data'}",
        "--checkpoint-dir",
        str(checkpoints),
        "--max-steps",
        "3",
        cwd=tmp_path,
    )
    final = checkpoints / "final"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    _cli("export", str(checkpoints), str(tmp_path / "exported"), cwd=tmp_path)
    ids = torch.tensor([CheckpointTokenizer(str(final)).encode_prompt("4541=")])
    trained, exported = _logits(final, ids), _logits(tmp_path / "exported", ids)
    assert (trained - exported).abs().max().item() <= 1e-4  # the policy's weights, both ways
    assert (trained - _logits(models / "tiny-qwen2", ids)).abs().max().item() > 1e-4  # it trained
