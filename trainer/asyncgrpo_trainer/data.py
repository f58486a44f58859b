"""Prompt data: the training loader (resumable position) and the validation set.

The loader yields batches of P prompts forever, reshuffling every epoch with a seed derived from
the job seed and the epoch, so its whole state is (epoch, position) and a resumed run continues
with exactly the prompts an uninterrupted run would have seen next. Only the rollout pump reads it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncgrpo_trainer.envs.base import Environment, Example
from asyncgrpo_trainer.models.tokenizer import Tokenizer

BUILTIN_TRAIN_SIZE = 4096


def read_jsonl(path: str) -> list[Example]:
    """{prompt, answer} rows of a JSONL file."""
    out: list[Example] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "prompt" not in row or "answer" not in row:
            raise ValueError(f"{path}:{n}: each row needs 'prompt' and 'answer'")
        out.append(Example(str(row["prompt"]), str(row["answer"])))
    return out


def fits(examples: list[Example], tokenizer: Tokenizer, max_prompt_length: int) -> list[Example]:
    """Examples whose prompt encodes within max_prompt_length tokens (the others are skipped)."""
    return [e for e in examples if len(tokenizer.encode_prompt(e.prompt)) <= max_prompt_length]


@dataclass
class PromptLoader:
    """Endless, seeded, resumable batches of `batch_size` prompts; see the module docstring."""

    examples: list[Example]
    batch_size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    position: int = 0
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.examples:
            raise ValueError("no training prompts (all longer than data.maxPromptLength?)")
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[Example]:
        batch: list[Example] = []
        while len(batch) < self.batch_size:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            batch.append(self.examples[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)


def load_examples(
    env: Environment,
    tokenizer: Tokenizer,
    *,
    train_path: str | None,
    validation_path: str | None,
    num_validation: int,
    max_prompt_length: int,
    seed: int,
) -> tuple[list[Example], list[Example]]:
    """(train, validation) examples from the data files, or from the environment's built-in set."""
    train = (
        read_jsonl(train_path)
        if train_path
        else env.builtin_examples(split="train", count=BUILTIN_TRAIN_SIZE, seed=seed)
    )
    if validation_path:
        val = read_jsonl(validation_path)[:num_validation]
    else:
        val = env.builtin_examples(split="validation", count=num_validation, seed=seed)
    return fits(train, tokenizer, max_prompt_length), fits(val, tokenizer, max_prompt_length)
