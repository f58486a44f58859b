"""A picklable recipe for the policy model, so every worker builds the same network locally.

The driver builds the tokenizer and the recipe once and ships the recipe (a few numbers) to the
workers; each worker instantiates the model from the same seed, so the policy and generation
copies start identical without moving weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncgrpo_trainer.models.network import TinyCausalLM, TinyConfig, tiny_config
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelBuild:
    config: TinyConfig
    seed: int
    dtype: str
    pad_id: int
    eos_id: int

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    def instantiate(self) -> TinyCausalLM:
        """The model with its initial (seeded, random) weights."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = TinyCausalLM(self.config)
        return model.to(DTYPES[self.dtype])


def tiny_build(
    tokenizer: CharTokenizer,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int | None,
    max_sequence_length: int,
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
    )
    return ModelBuild(cfg, seed, dtype, tokenizer.pad_id, tokenizer.eos_id)
