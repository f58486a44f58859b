"""Hugging Face checkpoint directories in and out: config, safetensors weights, tokenizer files.

Reading: `read_config` parses config.json into a `ModelConfig` (the supported families only) and
`load_weights` fills a `CausalLM` built on the meta device from model.safetensors or a sharded
model.safetensors.index.json, tensor by tensor straight into the parameters (no second copy of
the model, no random initialisation first). Every problem raises `InvalidModelError` naming the
file and what to fix: a missing file, a tensor the network does not have or lacks, a shape that
does not match the config.

Writing: `save` writes a directory that `transformers.AutoModelForCausalLM.from_pretrained` and
vLLM load as they load the source checkpoint: the weights under their own names (sharded at
5 GB, with an index, as transformers shards), the source's config.json with the saved dtype, and
the tokenizer and generation_config files copied from the source. It writes into a temporary
directory and renames it, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open
from safetensors.torch import save_file

from asyncgrpo_trainer.models.config import ModelConfig, from_hf
from asyncgrpo_trainer.models.directory import (
    CONFIG,
    GENERATION_CONFIG,
    INDEX,
    TOKENIZER_FILES,
    WEIGHTS,
    InvalidModelError,
    read_json,
)
from asyncgrpo_trainer.models.lora import PeftAdapter
from asyncgrpo_trainer.models.network import CausalLM

SHARD_BYTES = 5 * 10**9
ADAPTER_DIR = "adapter"
"""A LoRA job's PEFT adapter inside its Hugging Face directory (`lora.PeftAdapter`)."""
IGNORED_TENSORS = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved; the network computes them from the config."""

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def read_config(directory: str | Path, *, max_positions: int) -> ModelConfig:
    """The ModelConfig of the checkpoint in `directory` (see `config.from_hf`)."""
    path = Path(directory) / CONFIG
    return from_hf(read_json(path), source=str(path), max_positions=max_positions)


def weight_files(directory: str | Path) -> dict[str, Path]:
    """tensor name -> the safetensors file that holds it."""
    root = Path(directory)
    if (root / INDEX).is_file():
        index = read_json(root / INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InvalidModelError(f"{root / INDEX}: `weight_map` is missing or empty")
        return {name: root / str(file) for name, file in weight_map.items()}
    single = root / WEIGHTS
    if not single.is_file():
        raise InvalidModelError(
            f"{root} holds neither {WEIGHTS} nor {INDEX}: the trainer reads safetensors weights only "
            "(convert pytorch_model.bin with transformers' save_pretrained)"
        )
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def load_weights(model: CausalLM, directory: str | Path, dtype: torch.dtype) -> None:
    """Fill `model`'s parameters (built on the meta device) from the checkpoint, cast to `dtype`."""
    expected = dict(model.named_parameters())
    tied = model.cfg.tie_word_embeddings
    by_file: dict[Path, list[str]] = {}
    unexpected: list[str] = []
    for name, file in weight_files(directory).items():
        if name in expected:
            by_file.setdefault(file, []).append(name)
        elif not (name.endswith(IGNORED_TENSORS) or (tied and name == "lm_head.weight")):
            unexpected.append(name)
    if unexpected:
        raise InvalidModelError(
            f"{directory}: tensors the {model.cfg.family} network does not have: {sorted(unexpected)[:5]} "
            f"({len(unexpected)} in all); is config.json's model_type right for these weights?"
        )
    loaded: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        if not file.is_file():
            raise InvalidModelError(f"{file} is named by {INDEX} but does not exist")
        with safe_open(str(file), framework="pt") as f:
            for name in names:
                tensor = f.get_tensor(name)
                if tensor.shape != expected[name].shape:
                    raise InvalidModelError(
                        f"{file}: {name} has shape {tuple(tensor.shape)}, config.json gives "
                        f"{tuple(expected[name].shape)}"
                    )
                loaded[name] = tensor.to(dtype)
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise InvalidModelError(
            f"{directory}: the weights lack {missing[:5]} ({len(missing)} in all) that config.json's "
            f"{model.cfg.family} shape needs"
        )
    model.load_state_dict(loaded, strict=False, assign=True)
    if tied:  # assign replaced the embedding's Parameter; the head must share the new one
        model.lm_head.weight = model.model.embed_tokens.weight


def hf_state(model_state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors a Hugging Face checkpoint of `cfg` holds (a tied head is not written twice)."""
    return {k: v for k, v in model_state.items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}


def save(
    state: Mapping[str, torch.Tensor],
    cfg: ModelConfig,
    out_dir: str | Path,
    *,
    source_dir: str | Path,
    dtype: torch.dtype,
    adapter: PeftAdapter | None = None,
) -> Path:
    """Write a Hugging Face checkpoint of `state` (network names) to `out_dir`, replacing it; with
    `adapter` (policy.lora) `state` is the merged weights and the PEFT adapter goes into
    `out_dir/adapter` (`ADAPTER_DIR`)."""
    if not cfg.hf_exportable:
        raise InvalidModelError(
            "the tiny model with learned position embeddings has no Hugging Face family to export to; "
            "export applies to pretrained checkpoints (spec.trainer.model.source: pretrained)"
        )
    out, source = Path(out_dir), Path(source_dir)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in hf_state(state, cfg).items()}
    tmp = out.parent / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        split = split_torch_state_dict_into_shards(
            tensors, filename_pattern="model{suffix}.safetensors", max_shard_size=SHARD_BYTES
        )
        for filename, names in split.filename_to_tensors.items():
            save_file({n: tensors[n] for n in names}, str(tmp / filename), metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            (tmp / INDEX).write_text(json.dumps(index, indent=2))
        config = read_json(source / CONFIG)
        config["torch_dtype"] = config["dtype"] = DTYPE_NAMES[dtype]
        (tmp / CONFIG).write_text(json.dumps(config, indent=2))
        for name in (*TOKENIZER_FILES, GENERATION_CONFIG):
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        if adapter is not None:
            for f in adapter.write(tmp / ADAPTER_DIR, dtype).iterdir():
                with f.open("rb") as fh:
                    os.fsync(fh.fileno())
        for f in tmp.iterdir():
            if f.is_dir():
                continue
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@dataclass(frozen=True)
class Export:
    """A Hugging Face checkpoint still to be written: the weights (network names, CPU) and what
    `save` needs besides them. A policy worker that cannot see the checkpoint volume hands this
    back to the controller, which writes it (`checkpoint.write_or_return`)."""

    state: dict[str, torch.Tensor]
    config: ModelConfig
    source_dir: str
    dtype: torch.dtype
    adapter: PeftAdapter | None = None

    def write(self, out_dir: str | Path) -> Path:
        return save(
            self.state,
            self.config,
            out_dir,
            source_dir=self.source_dir,
            dtype=self.dtype,
            adapter=self.adapter,
        )
