"""The shipped synthetic task: add two small numbers, answer with the digits and stop.

A tiny char-level model learns it from random weights on CPU in a few dozen GRPO steps, which makes
it the task of the tests, the CPU example and the benchmark. The reward is shaped so that a random
policy already gets signal:

- 1.0 for the exact answer followed by end-of-sequence;
- 0.1 + 0.4 x closeness for a number that is wrong (closeness = 1 - |error| / 10, floored at 0):
  the model first learns the format (digits, then stop), then to approach and hit the sum;
- 0.0 for anything else, including a response truncated at maxNewTokens.

Training and validation prompts are disjoint sets of operand pairs (validation holds out every
pair with (a * 7 + b) % 10 == 0), so validation measures generalisation, not recall.
"""

from __future__ import annotations

import random

from asyncgrpo_trainer.envs.base import Environment, Example, Score

MAX_OPERAND = 9


def _held_out(a: int, b: int) -> bool:
    return (a * 7 + b) % 10 == 0


class ArithmeticEnvironment(Environment):
    """`a+b=` with a, b in [0, 9]; see the module docstring for the reward."""

    name = "arithmetic"
    alphabet = "0123456789+="

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        pairs = [
            (a, b)
            for a in range(MAX_OPERAND + 1)
            for b in range(MAX_OPERAND + 1)
            if _held_out(a, b) == (split == "validation")
        ]
        rng = random.Random(f"{seed}-{split}")
        out: list[Example] = []
        while len(out) < count:
            rng.shuffle(pairs)
            out.extend(Example(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in pairs)
        return out[:count]

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        if not finished or not response.isdigit() or len(response) > 3:
            return Score(0.0, False)
        if response == example.answer:
            return Score(1.0, True)
        closeness = max(0.0, 1.0 - abs(int(response) - int(example.answer)) / 10.0)
        return Score(0.1 + 0.4 * closeness, False)
