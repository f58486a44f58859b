"""Reward environments: a prompt set and a scoring rule, looked up by `env.name`, or a class of the
user's own named by `env.class` ("package.module:Class", importable in the trainer image)."""

from __future__ import annotations

from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs import calculator, gsm8k, math, reverse
from asyncgrpo_trainer.envs.base import Environment, Example, Score
from asyncgrpo_trainer.envs.multiturn import MultiTurnEnvironment, Reply
from asyncgrpo_trainer.user_code import import_named

REGISTRY: dict[str, type[Environment]] = {
    "math": math.MathEnvironment,
    "reverse": reverse.ReverseEnvironment,
    "gsm8k": gsm8k.Gsm8kEnvironment,
    "calculator": calculator.CalculatorEnvironment,
}


def build(name: str, class_path: str | None = None) -> Environment:
    """The environment called `name` (the EnvSpec.name values), or an instance of `class_path`
    (EnvSpec.class) when it is set; InvalidDataError when that class cannot be used."""
    if class_path is not None:
        return load_class(class_path)()
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(REGISTRY)}") from None


def load_class(class_path: str) -> type[Environment]:
    """The Environment subclass named "package.module:Class", imported in this process."""
    found = import_named("env.class", class_path)
    if not (isinstance(found, type) and issubclass(found, Environment)):
        what = (
            "does not exist" if found is None else "is not a subclass of asyncgrpo_trainer.envs.Environment"
        )
        raise InvalidDataError(f"env.class: {class_path}: {class_path.replace(':', '.', 1)} {what}")
    return found


__all__ = [
    "REGISTRY",
    "Environment",
    "Example",
    "MultiTurnEnvironment",
    "Reply",
    "Score",
    "build",
    "load_class",
]
