"""Environments as users write them, for env.class in the tests
(`tests.trainer.custom_envs:NAME`, importable in the Ray workers, which run in the repository)."""

from __future__ import annotations

from asyncgrpo_trainer.envs import Example, MultiTurnEnvironment, Reply, Score

TURNS = 3
"""EchoEnvironment ends a conversation after this many policy turns."""


class EchoEnvironment(MultiTurnEnvironment):
    """`12=` is answered `12`; the environment tells the policy which turn it is on (`>1`, `>2`) as a
    user turn, and ends the conversation after TURNS policy turns."""

    name = "echo"
    alphabet = "0123456789=>"

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        offset = 50 if split == "validation" else 0
        return [
            Example(prompt=f"{offset + i % 50:02d}=", answer=f"{offset + i % 50:02d}") for i in range(count)
        ]

    def respond(self, example: Example, turns: tuple[str, ...]) -> Reply:
        if len(turns) >= TURNS:
            return Reply(done=True)
        return Reply(done=False, content=f">{len(turns)}", role="user")

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        correct = finished and response == example.answer
        return Score(float(correct), correct)


class NotAnEnvironment:
    """A class that is no Environment: env.class must refuse it."""
