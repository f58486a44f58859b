"""Reward environments: a prompt set and a scoring rule, looked up by `env.name`."""

from __future__ import annotations

from asyncgrpo_trainer.envs import gsm8k, math, reverse
from asyncgrpo_trainer.envs.base import Environment, Example, Score

REGISTRY: dict[str, type[Environment]] = {
    "math": math.MathEnvironment,
    "reverse": reverse.ReverseEnvironment,
    "gsm8k": gsm8k.Gsm8kEnvironment,
}


def build(name: str) -> Environment:
    """The environment called `name` (the EnvSpec.name values)."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(REGISTRY)}") from None


__all__ = ["REGISTRY", "Environment", "Example", "Score", "build"]
