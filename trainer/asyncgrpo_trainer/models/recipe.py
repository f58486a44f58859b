"""A picklable recipe for the policy model, so every worker builds the same network locally.

The driver reads the checkpoint's config and tokenizer once (or builds the tiny model's) and ships
the recipe (a config and a path, no weights) to the workers. Each worker instantiates the model
itself: a pretrained recipe loads the checkpoint directory, which the pods mount from the models
volume; a tiny recipe builds random weights from the job's seed, so the policy and generation
copies start identical without moving weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from asyncgrpo_trainer.models import hf
from asyncgrpo_trainer.models.config import ModelConfig, PositionEmbedding, tiny_config
from asyncgrpo_trainer.models.lora import LoraConfig
from asyncgrpo_trainer.models.network import CausalLM
from asyncgrpo_trainer.models.tokenizer import CharTokenizer, CheckpointTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelBuild:
    """How to build the network: its config, dtype and where its initial weights come from."""

    config: ModelConfig
    dtype: str
    pad_id: int
    eos_ids: tuple[int, ...]
    seed: int
    checkpoint: str | None = None
    """Hugging Face checkpoint directory of the initial weights; None: random from `seed`."""
    lora: LoraConfig | None = None
    """policy.lora: the policy trains adapters on these weights (`lora`); None: all of them."""

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        """The recipe as JSON (a checkpoint's meta.json keeps it, for `asyncgrpo export`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelBuild:
        cfg = dict(data["config"])
        cfg["rope_inv_freq"] = tuple(cfg["rope_inv_freq"])
        adapters = data.get("lora")
        return cls(
            **{
                **data,
                "config": ModelConfig(**cfg),
                "eos_ids": tuple(data["eos_ids"]),
                "lora": None if adapters is None else LoraConfig.from_json(adapters),
            }
        )

    def skeleton(self) -> CausalLM:
        """The network on the meta device: names and shapes, no storage (plans, checks)."""
        with torch.device("meta"):
            return CausalLM(self.config)

    def instantiate(self) -> CausalLM:
        """The model with its initial weights, on the CPU, in the recipe's dtype."""
        if self.checkpoint is not None:
            model = self.skeleton()
            hf.load_weights(model, self.checkpoint, self.torch_dtype)
            model.model.init_buffers(torch.device("cpu"))
            return model
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = CausalLM(self.config)
            model.init_random()
        return model.to(self.torch_dtype)


def tiny_build(
    tokenizer: CharTokenizer,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int | None,
    max_sequence_length: int,
    position_embedding: PositionEmbedding,
    dtype: str,
    seed: int,
) -> ModelBuild:
    cfg = tiny_config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_positions=max_sequence_length,
        position_embedding=position_embedding,
    )
    return ModelBuild(cfg, dtype, tokenizer.pad_id, tokenizer.eos_ids, seed)


def pretrained_build(
    directory: str,
    *,
    max_sequence_length: int,
    dtype: str,
    seed: int,
    chat_template: bool | None,
    system_prompt: str | None,
) -> tuple[ModelBuild, CheckpointTokenizer]:
    """The recipe and tokenizer of the checkpoint in `directory`; InvalidModelError if unusable."""
    cfg = hf.read_config(directory, max_positions=max_sequence_length)
    hf.weight_files(directory)  # fail here, in the driver, not in every worker
    tokenizer = CheckpointTokenizer(directory, chat_template=chat_template, system_prompt=system_prompt)
    return ModelBuild(cfg, dtype, tokenizer.pad_id, tokenizer.eos_ids, seed, checkpoint=directory), tokenizer
