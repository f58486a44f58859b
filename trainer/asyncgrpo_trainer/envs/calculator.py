"""The shipped tool environment: multiply two 2-digit numbers, with a calculator to call.

`37*58=` is answered `2146`. A tiny model cannot multiply; it can call the calculator. A policy
turn that starts with `?` is a tool call: the rest of the turn is a Python expression, run in the
sandbox (`sandbox.run`: its own process, no network, CPU, memory, time and process limits), and
the environment answers with `>` and the value (`>!` when the call failed, or printed anything but
an integer). Any other turn is the answer, and ends the conversation. So the policy that solves the
task writes `?37*58`, reads `>2146` and answers `2146`:

    37*58=  ?37*58<eos>  >2146  2146<eos>
    prompt  policy       tool   policy

- `correct` is exact match of the final turn (and a conversation the environment ended).
- The reward is the fraction of positions of the final answer that are right (of the longer of the
  answer and the reference, as in `reverse`), 0 when a budget cut the conversation. Without the
  tool the positions are right by chance; with it the answer can be copied.

Training and validation pairs are disjoint: a fixed random tenth of the 8,100 pairs is held out (the
same for every job seed), so validation measures the use of the tool, not recall of products.
"""

from __future__ import annotations

import random

from asyncgrpo_trainer import sandbox
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.envs.multiturn import MultiTurnEnvironment, Reply

TOOL_CALL, TOOL_RESULT, TOOL_FAILED = "?", ">", "!"
PAIRS = [(a, b) for a in range(10, 100) for b in range(10, 100)]
HELD_OUT = frozenset(
    random.Random("asyncgrpo-calculator-held-out").sample(range(len(PAIRS)), len(PAIRS) // 10)
)
"""The validation pairs (as indices into PAIRS): 810 of the 8,100, never trained on."""


class CalculatorEnvironment(MultiTurnEnvironment):
    """`ab*cd=` -> the product, with a sandboxed calculator; see the module docstring."""

    name = "calculator"
    alphabet = "0123456789*+-=?>!"

    def __init__(self, limits: sandbox.Limits | None = None) -> None:
        self.limits = limits if limits is not None else sandbox.Limits()

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        held_out = split == "validation"
        pairs = [p for i, p in enumerate(PAIRS) if (i in HELD_OUT) == held_out]
        rng = random.Random(f"{seed}-{split}")
        out: list[Example] = []
        while len(out) < count:
            rng.shuffle(pairs)
            out.extend(Example(prompt=f"{a}*{b}=", answer=str(a * b)) for a, b in pairs)
        return out[:count]

    def respond(self, example: Example, turns: tuple[str, ...]) -> Reply:
        last = turns[-1]
        if not last.startswith(TOOL_CALL):
            return Reply(done=True)
        report = sandbox.run(last[len(TOOL_CALL) :], self.limits)
        shown = (
            report.output if report.outcome is sandbox.Outcome.OK and _integer(report.output) else TOOL_FAILED
        )
        return Reply(done=False, content=TOOL_RESULT + shown, role="tool", outcome=report.outcome.value)

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        if not finished:
            return Score(0.0, False)
        right = sum(a == b for a, b in zip(response, example.answer, strict=False))
        return Score(right / max(len(response), len(example.answer)), response == example.answer)


def _integer(text: str) -> bool:
    return text.removeprefix("-").isdigit()
