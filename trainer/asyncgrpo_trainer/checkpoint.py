"""Checkpoints: one directory per step, written atomically, the newest `keepLast` kept.

A checkpoint is written in two phases. `begin` creates a temporary directory next to the final
place; the policy workers write their own files into it (`policy.TorchPolicyWorker.save`: data-
parallel rank 0 writes `policy.pt`; the Megatron backend: one `policy-tp{rank}.pt` per
tensor-parallel rank of replica 0), each with CPU tensors and fsynced by its writer (`write`); then
the controller's `commit` adds `state.pt` and `meta.json` and renames the directory into
`step-NNNNNNNN`. So the policy's weights and optimizer state (gigabytes) go from each policy
worker straight to storage, never through the CPU-only controller, and a driver killed mid-write
leaves either the previous checkpoint or the new one, never a torn one (the temporary directory is
ignored and cleaned up by the next commit). The policy workers run on the worker pods: the path is
shared because the operator mounts `spec.storage.checkpoints` on the head and on every worker
container (`asyncgrpo_operator.manifests`), so `spec.checkpoint.path` should lie under it on a
volume every node reaches (a ReadWriteMany PVC, or hostPath on one node). A worker that does not
see the temporary directory (no checkpoint volume, the default) hands its file back instead
(`write_or_return`) and the group writes it from the controller's side: slower and through the
head's memory, but the job goes on, as the admission warning about such storage says.

`state.pt` holds the controller's part: its clocks (trainer version, dispatch batch index), the
loader position, the replay buffer (ready groups with their data, in-flight groups as prompts to
re-dispatch) and the run metrics needed to continue the progress report, all as plain data (dicts,
lists, tuples, str, numbers, None), never as pickled objects. Every checkpoint file is loaded with
`torch.load(weights_only=True)`, which builds only such data and tensors: the checkpoint directory
lies on a volume the job's own pods write, where a tool call or any code of the job could replace a
file, and a full unpickle of it on resume would run whatever that file asks (`load` refuses it).
On resume each policy worker reads its own file(s) from the step directory (`read`, onto the CPU,
so a checkpoint written on GPUs loads on CPUs and the other way round).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from asyncgrpo_trainer.models import hf

PREFIX = "step-"
STATE_FILE = "state.pt"
META_FILE = "meta.json"
HF_DIR = "hf"
"""Each checkpoint's Hugging Face directory (pretrained models): what transformers and vLLM load."""
FINAL_DIR = "final"
"""`<checkpoint.path>/final`: the last step's Hugging Face directory, published at the end of a run."""
SHARED_STORAGE = (
    "spec.checkpoint.path must be on a volume that the head and every worker pod mount "
    "(spec.storage.checkpoints: a ReadWriteMany PVC, or hostPath when the job runs on one node)"
)


def step_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:08d}"


def begin(root: str | Path, step: int) -> Path:
    """The temporary directory the checkpoint of `step` is written into, before `commit`."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-{step:08d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def write_or_return(path: Path, obj: Any) -> dict[str, Any]:
    """A policy worker's `write`: {} once written, or {file name: obj} when `path`'s directory is
    not on this node (no volume shared with the head: the storage default), for the group to
    write from the controller's side (`write_returned`) instead of failing the job."""
    if not path.parent.is_dir():
        return {path.name: obj}
    _write_any(path, obj)
    return {}


def write_returned(directory: Path, files: dict[str, Any]) -> None:
    """Write the files that policy workers could not write themselves (see `write_or_return`)."""
    for name, obj in files.items():
        _write_any(directory / name, obj)


def _write_any(path: Path, obj: Any) -> None:
    """A Hugging Face export is a directory of its own; everything else one torch file."""
    if isinstance(obj, hf.Export):
        obj.write(path)
    else:
        write(path, obj)


def write(path: Path, obj: Any) -> None:
    """torch.save `obj` to `path` in a directory from `begin`, and fsync it (every writer's call)."""
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"cannot write {path.name}: the checkpoint directory {path.parent} does not exist on this "
            f"node; {SHARED_STORAGE}"
        )
    torch.save(obj, path)
    _fsync(path)


def read(path: Path, *, fix: str, mmap: bool = False) -> Any:
    """A policy worker's file that `write` wrote, with CPU tensors (`mmap`: backed by the page
    cache, which the ranks of a node share, until they are copied onto their devices). A missing
    file raises an error naming it and `fix`, what to change."""
    if not path.is_file():
        raise FileNotFoundError(f"the checkpoint {path.parent} has no {path.name}: {fix}")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def commit(
    tmp: Path, step: int, payload: dict[str, Any], *, keep_last: int, meta: dict[str, Any] | None = None
) -> Path:
    """Add the controller's `payload` to `tmp` (from `begin`), rename it into the checkpoint of
    `step` (atomic) and prune older ones. `meta` goes into meta.json (the model recipe, which
    `asyncgrpo export` reads)."""
    write(tmp / STATE_FILE, payload)
    (tmp / META_FILE).write_text(json.dumps({"step": step, **(meta or {})}))
    _fsync(tmp / META_FILE)
    _fsync(tmp)
    base = tmp.parent
    final = step_dir(base, step)
    if final.exists():
        # Saved again: move the old directory aside in one rename (prune deletes it), so no crash
        # leaves a step directory with some of its files, e.g. the policy's, already removed.
        os.replace(final, base / f".tmp-replaced-{uuid.uuid4().hex[:8]}")
    os.replace(tmp, final)
    _fsync(base)
    prune(base, keep_last)
    return final


def _fsync(path: Path) -> None:
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
        # Both files (the controller's, written last): a step directory appears, and is replaced,
        # only by a rename of a complete one; this keeps out any left incomplete some other way.
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


class UnsafeCheckpointError(Exception):
    """A checkpoint file holds more than plain data and tensors: it is not loaded."""


def load(root: str | Path, step: int) -> dict[str, Any]:
    """The controller's payload of the checkpoint of `step` (the policy files stay for the workers).
    Plain data only (module docstring): a file that asks the unpickler for anything else, such as
    a callable to run, raises `UnsafeCheckpointError` naming it, and nothing of it runs."""
    path = step_dir(Path(root), step) / STATE_FILE
    try:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to resume from {path}: it holds more than plain data and tensors, so it was not "
            f"written by the trainer (a job's code or a tool call may have replaced it); delete that "
            f"checkpoint directory to resume from the one before. {str(exc).splitlines()[0]}"
        ) from exc
    return payload


def read_meta(step_path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((step_path / META_FILE).read_text())
    return meta


def publish_final(root: str | Path, step: int) -> Path | None:
    """Copy the Hugging Face directory of `step`'s checkpoint to `<root>/final` (replacing the one
    before, atomically), so the trained model sits at a path that does not change with the step
    and outlives pruning; None when the checkpoint has none (the tiny model)."""
    base = Path(root)
    source = step_dir(base, step) / HF_DIR
    if not source.is_dir():
        return None
    tmp = base / f".tmp-final-{uuid.uuid4().hex[:8]}"
    shutil.copytree(source, tmp)
    final = base / FINAL_DIR
    old = base / f".tmp-replaced-{uuid.uuid4().hex[:8]}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(base)
    shutil.rmtree(old, ignore_errors=True)
    return final
