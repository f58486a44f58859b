"""Checkpoints: one directory per step, written atomically, the newest `keepLast` kept.

A checkpoint is written into a temporary directory next to its final place and renamed into
`step-NNNNNNNN` only when complete, so a driver killed mid-write leaves either the previous
checkpoint or the new one, never a torn one (the temporary directory is ignored and cleaned up on
the next save). The payload is one torch file: policy weights, optimizer and reference model,
the controller's clocks (trainer version, dispatch batch index), the loader position, the replay
buffer (ready groups with their data, in-flight groups as prompts to re-dispatch) and the run
metrics needed to continue the progress report.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

PREFIX = "step-"
STATE_FILE = "state.pt"
META_FILE = "meta.json"


def step_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:08d}"


def save(root: str | Path, step: int, payload: dict[str, Any], *, keep_last: int) -> Path:
    """Write `payload` as the checkpoint of `step` (atomic) and prune older ones."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-{step:08d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    torch.save(payload, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps({"step": step}))
    for f in (tmp / STATE_FILE, tmp / META_FILE):
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = step_dir(base, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(base)
    prune(base, keep_last)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_steps(root: str | Path) -> list[int]:
    base = Path(root)
    if not base.is_dir():
        return []
    steps = []
    for child in base.iterdir():
        # Both files: saving a step that exists removes its old directory first, and a crash
        # inside that removal can leave meta.json without state.pt (tests/reliability).
        if child.name.startswith(PREFIX) and (child / META_FILE).exists() and (child / STATE_FILE).exists():
            try:
                steps.append(int(child.name[len(PREFIX) :]))
            except ValueError:
                continue
    return sorted(steps)


def prune(root: Path, keep_last: int) -> None:
    for step in list_steps(root)[:-keep_last]:
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
    for child in root.iterdir():
        if child.name.startswith(".tmp-"):
            shutil.rmtree(child, ignore_errors=True)


def latest(root: str | Path) -> int | None:
    steps = list_steps(root)
    return steps[-1] if steps else None


def load(root: str | Path, step: int) -> dict[str, Any]:
    payload: dict[str, Any] = torch.load(step_dir(Path(root), step) / STATE_FILE, weights_only=False)
    return payload
