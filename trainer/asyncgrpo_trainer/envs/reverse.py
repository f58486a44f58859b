"""The shipped synthetic task: write a 4-digit string backwards, then stop.

`1234=` is answered `4321`. A tiny char-level model learns it from random weights on CPU in about
a hundred GRPO steps, which makes it the task of the tests, the CPU examples, the demo and the
benchmarks, and one whose accuracy proves learning:

- `correct` is exact match: the four digits reversed, followed by end-of-sequence.
- The reward is the fraction of positions answered right (of the longer of the response and the
  answer, so a longer answer never pays), and 0 for a response truncated at maxNewTokens. Exact
  match alone would give a random policy no signal (about one hit in 10^5 samples); per-position
  credit does, and a policy can only collect it by reading the prompt.

A constant answer, or a copy of the prompt, matches a position only by chance (1 in 10): about
0.1 reward and an accuracy near 0 (a copy is right on the 1% palindromes). The shaped reward of the
arithmetic task this replaces paid 0.43 for answering "9" to every prompt.

Training and validation strings are disjoint: a fixed random tenth of the 10,000 strings is held
out (the same for every job seed), so validation measures generalisation, not recall.
"""

from __future__ import annotations

import random

from asyncgrpo_trainer.envs.base import Environment, Example, Score

DIGITS = 4
HELD_OUT = frozenset(random.Random("asyncgrpo-reverse-held-out").sample(range(10**DIGITS), 10**DIGITS // 10))
"""The validation strings (as numbers): 1,000 of the 10,000, never trained on."""


class ReverseEnvironment(Environment):
    """`dddd=` -> the digits reversed; see the module docstring for the reward."""

    name = "reverse"
    alphabet = "0123456789="

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        held_out = split == "validation"
        strings = [f"{n:0{DIGITS}d}" for n in range(10**DIGITS) if (n in HELD_OUT) == held_out]
        rng = random.Random(f"{seed}-{split}")
        out: list[Example] = []
        while len(out) < count:
            rng.shuffle(strings)
            out.extend(Example(prompt=f"{s}=", answer=s[::-1]) for s in strings)
        return out[:count]

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        if not finished:
            return Score(0.0, False)
        right = sum(a == b for a, b in zip(response, example.answer, strict=False))
        return Score(right / max(len(response), len(example.answer)), response == example.answer)
