"""Math answer checking for real models: the last \\boxed{...} of a response against the answer.

Answers compare equal after light normalisation (spaces, surrounding $, a trailing period, \\left /
\\right, thousands separators) or, when both parse as numbers (including simple fractions a/b),
numerically. The reward is 1.0 or 0.0; no partial credit, as in the usual math-verify setups.
The built-in prompt set is generated word problems so that a job with env math runs without a
dataset volume; real runs point data.trainPath at a JSONL file.
"""

from __future__ import annotations

import random
from fractions import Fraction

from asyncgrpo_trainer.envs.base import Environment, Example, Score
from asyncgrpo_trainer.models.tokenizer import PRINTABLE

INSTRUCTION = " Put the final answer in \\boxed{}."


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text`, braces balanced; None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def normalize(answer: str) -> str:
    """A canonical spelling of an answer for string comparison."""
    out = answer.strip().strip("$").strip()
    for token in ("\\left", "\\right", "\\!", "\\,", " "):
        out = out.replace(token, "")
    out = out.rstrip(".")
    if out.replace(",", "").lstrip("-").isdigit():
        out = out.replace(",", "")
    return out


def as_number(answer: str) -> Fraction | None:
    """The value of a plain number, decimal or a/b fraction (also \\frac{a}{b}); None otherwise."""
    text = normalize(answer)
    if text.startswith("\\frac{") and text.endswith("}") and "}{" in text:
        num, den = text[len("\\frac{") : -1].split("}{", 1)
        text = f"{num}/{den}"
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str, reference: str) -> bool:
    """Whether two answers are the same, textually or numerically."""
    if normalize(predicted) == normalize(reference):
        return True
    a, b = as_number(predicted), as_number(reference)
    return a is not None and b is not None and a == b


class MathEnvironment(Environment):
    """Exact-answer math with \\boxed{} extraction; see the module docstring."""

    name = "math"
    alphabet = PRINTABLE

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        rng = random.Random(f"{seed}-{split}-math")
        out: list[Example] = []
        parity = 0 if split == "train" else 1
        while len(out) < count:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            if ((a + b) % 7 == 0 and parity == 0) or ((a + b) % 7 != 0 and parity == 1):
                continue
            kind = rng.choice(("sum", "product", "difference"))
            if kind == "sum":
                out.append(Example(f"What is {a} plus {b}?{INSTRUCTION}", str(a + b)))
            elif kind == "product":
                out.append(Example(f"What is {a} times {b}?{INSTRUCTION}", str(a * b)))
            else:
                out.append(Example(f"What is {a} minus {b}?{INSTRUCTION}", str(a - b)))
        return out

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        boxed = last_boxed(response)
        correct = boxed is not None and answers_match(boxed, example.answer)
        return Score(1.0 if correct else 0.0, correct)
