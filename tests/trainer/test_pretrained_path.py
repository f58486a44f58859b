"""The real-model path end to end: `asyncgrpo run` on a Hugging Face checkpoint and a data file.

The shipped CPU example (docs/examples/pretrained-cpu.yaml) runs as the guide's commands run it,
with the example's data files through `--mount`; what comes out is a Hugging Face directory
that transformers loads, with the same logits as `asyncgrpo export` of the last checkpoint's policy
file, and different from the checkpoint it started from (it trained). The model is the one the
example's comment makes, `asyncgrpo make-tiny-checkpoint --warm-start` (the session's `warm_qwen2`):
a random checkpoint answers no reversal right, so every GRPO advantage is zero and its weights would
rightly not move. `asyncgrpo make-tiny-checkpoint` without the warm start is checked on its own.
The guide's command sequence for the example runs as written (tests/trainer/pretrained_doc.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from tests.trainer import pretrained_doc

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
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def test_make_tiny_checkpoint_writes_a_checkpoint_transformers_and_the_trainer_load(tmp_path: Path) -> None:
    directory = tmp_path / "tiny-qwen2"
    _cli("make-tiny-checkpoint", str(directory), "--family", "qwen2", cwd=tmp_path)
    build, tok = recipe.pretrained_build(
        str(directory),
        max_sequence_length=64,
        dtype="float32",
        seed=0,
        chat_template=None,
        system_prompt=None,
    )
    ids = torch.tensor([tok.encode_prompt("4541=")])
    with torch.no_grad():
        ours, _ = build.instantiate().eval()(ids)
    assert (ours - _logits(directory, ids)).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_the_guides_pretrained_cpu_commands_run_as_written_from_any_folder_and_the_model_learns(
    pretrained_example: pretrained_doc.Place,
) -> None:
    """The rest of the guide's block, after the session's warm start (its first command): the run
    trains the example's 60 steps on its data files and writes a Hugging Face directory that
    transformers loads, and export writes one from the last checkpoint's policy file with the same
    logits, both different from the checkpoint the run started from (it trained)."""
    _warm_start, train, export = pretrained_doc.documented_commands()
    out = pretrained_doc.run(pretrained_example, train)
    accuracy = re.search(r"^  validation accuracy +([0-9.]+)$", out.stdout, re.MULTILINE)
    assert accuracy is not None and float(accuracy.group(1)) >= 0.5, out.stdout
    final = pretrained_example.work / ".asyncgrpo" / "pretrained-cpu" / "checkpoints" / "final"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    pretrained_doc.run(pretrained_example, export)
    exported = pretrained_example.work / "exported-qwen2"
    ids = torch.tensor([CheckpointTokenizer(str(final)).encode_prompt("4541=")])
    trained = _logits(final, ids)
    assert (trained - _logits(exported, ids)).abs().max().item() <= 1e-4  # the policy's weights, both ways
    warm = pretrained_example.work / "models" / "tiny-qwen2"
    assert (trained - _logits(warm, ids)).abs().max().item() > 1e-4  # it trained


def test_the_examples_comment_gives_the_guides_commands() -> None:
    """The example's YAML comment and the guide (which CI runs) show one sequence."""
    comment = [line.removeprefix("#") for line in EXAMPLE.read_text().splitlines() if line.startswith("#")]
    commands = " ".join(" ".join(comment).replace("\\", " ").split())
    for command in pretrained_doc.documented_commands():
        assert command in commands, command
