"""GSM8K-style grade-school word problems: the final number of a response against the reference.

A GSM8K answer is worked reasoning that ends in `#### 42`; the reference answer is the number
after the last `####` (thousands separators dropped: `#### 1,200` is 1200). An answer text without
`####` must be a number itself (a column that holds only the answer). A response is correct when
its last number (after a `$`, with separators; `\\boxed{42}` and `#### 42` both end in 42) equals
the reference numerically, so 42, 42.0 and 42.00 are the same answer. The reward is 1.0 or 0.0,
and a response cut at maxNewTokens is wrong.

There is no built-in prompt set: a gsm8k job trains on data.trainPath (admission requires it).
"""

from __future__ import annotations

import re
from decimal import Decimal

from asyncgrpo_trainer.envs.base import Environment, Example, Score
from asyncgrpo_trainer.models.tokenizer import PRINTABLE

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+")
MARK = "####"


def as_number(text: str) -> Decimal | None:
    """The value of `text` when it is one number (`$1,200.50`, `-3`, `42.`); None otherwise."""
    cleaned = text.strip().removeprefix("$").rstrip(".")
    if not NUMBER.fullmatch(cleaned):
        return None
    return Decimal(cleaned.replace(",", ""))


def final_number(text: str) -> Decimal | None:
    """The last number written in `text`; None when it has none."""
    found = NUMBER.findall(text)
    return as_number(found[-1]) if found else None


class Gsm8kEnvironment(Environment):
    """Final-number matching for GSM8K-shaped data; see the module docstring."""

    name = "gsm8k"
    alphabet = PRINTABLE

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        raise ValueError("env gsm8k has no built-in prompt set: set data.trainPath to a GSM8K-shaped file")

    def reference(self, answer: str) -> str:
        text = answer.rsplit(MARK, 1)[1] if MARK in answer else answer
        value = as_number(text)
        if value is None:
            expected = f"after {MARK!r}" if MARK in answer else f"(GSM8K answers end in '{MARK} 42')"
            raise ValueError(f"has no final number {expected}; got {text.strip()[:40]!r}")
        return format(value.normalize(), "f")

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        predicted = final_number(response)
        correct = finished and predicted is not None and predicted == Decimal(example.answer)
        return Score(1.0 if correct else 0.0, correct)
