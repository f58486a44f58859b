"""`asyncgrpo export CHECKPOINT OUT_DIR`: a Hugging Face directory from a training checkpoint.

Training already writes one into every checkpoint of a pretrained model (`<step>/hf`) and the
last one to `<checkpoint.path>/final`; this command makes one from any checkpoint after the fact
(for example one written before a run was cut short, or to another place). CHECKPOINT is a step
directory (`step-NNNNNNNN`) or the checkpoint root, whose newest step is taken. The weights are
the policy's own files (the fp32 master weights of the torch backend, the tensor-parallel shards of
the Megatron backend, reassembled), cast to the model's dtype; the config and tokenizer files come
from the checkpoint's `hf` directory, or else from the source checkpoint the run started from. A
LoRA job's (policy.lora) export holds the merged weights and, in `OUT_DIR/adapter`, the adapters in
PEFT's format over the source checkpoint (`peft.PeftModel.from_pretrained(base, OUT_DIR/adapter)`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.recipe import ModelBuild


def step_path(path: str | Path) -> Path:
    """The step directory `path` names: itself, or the newest step under a checkpoint root."""
    p = Path(path)
    if (p / checkpoint.META_FILE).is_file():
        return p
    step = checkpoint.latest(p)
    if step is None:
        raise FileNotFoundError(f"{p} is neither a checkpoint step directory nor a root that holds one")
    return checkpoint.step_dir(p, step)


def policy_weights(step: Path, build: ModelBuild) -> dict[str, torch.Tensor]:
    """The network's weights (Hugging Face names) from the policy files of a checkpoint step."""
    torch_file = step / policy.POLICY_FILE
    if torch_file.is_file():
        state = checkpoint.read(torch_file, fix="")
        return dict(state["model"])
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415  (imports megatron.core)

    return megatron_policy.read_full_weights(step, build)


def export(checkpoint_path: str | Path, out_dir: str | Path) -> Path:
    """Write the Hugging Face directory of a checkpoint to `out_dir` (replacing it); its path."""
    step = step_path(checkpoint_path)
    meta = checkpoint.read_meta(step)
    if "model" not in meta:
        raise InvalidModelError(
            f"{step / checkpoint.META_FILE} has no model recipe (written by an older trainer)"
        )
    build = ModelBuild.from_json(meta["model"])
    if build.checkpoint is None:
        raise InvalidModelError(
            f"{step} is a checkpoint of the tiny model (model.source tiny), which has no Hugging Face "
            "family or tokenizer to export to; export applies to pretrained checkpoints"
        )
    source = step / checkpoint.HF_DIR if (step / checkpoint.HF_DIR).is_dir() else Path(build.checkpoint)
    exported = policy.hf_export(build, policy_weights(step, build))
    assert exported is not None  # a pretrained recipe (checked above)
    return dataclasses.replace(exported, source_dir=str(source)).write(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="asyncgrpo export",
        description="Write a Hugging Face checkpoint directory from a training checkpoint.",
    )
    parser.add_argument(
        "checkpoint", help="a checkpoint step directory, or the checkpoint root (newest step)"
    )
    parser.add_argument("out_dir", help="the Hugging Face directory to write (replaced if it exists)")
    ns = parser.parse_args(argv)
    try:
        out = export(ns.checkpoint, ns.out_dir)
    except (OSError, ValueError) as exc:
        print(f"asyncgrpo export: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"exported": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
