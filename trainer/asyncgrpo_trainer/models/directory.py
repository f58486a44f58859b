"""A Hugging Face checkpoint directory's file names, its JSON files, and the error a checkpoint
problem raises.

Kept free of torch: the tokenizer, the environments and the reward workers read checkpoint files
too, and a reward worker process should not pay torch's import time (tests/trainer/test_layering.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


class InvalidModelError(ValueError):
    """A checkpoint the trainer cannot use; the message names the file or field and the fix."""


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file as a dict, or an InvalidModelError naming the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidModelError(
            f"{path} does not exist: spec.trainer.model.path must be a Hugging Face checkpoint directory "
            "(config.json, model.safetensors or its index, tokenizer files) on a volume the pods mount"
        ) from None
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidModelError(f"{path}: expected a JSON object")
    return data
