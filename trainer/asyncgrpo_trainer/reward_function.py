"""A user's reward function (env.function): loading it, checking it from outside, and calling it.

The function is user code: importing its module runs that module. It runs only in the reward
actors' processes (`RewardActor`); the driver checks that it can be loaded (`check`) in a child
Python process with the driver's import path, so a function that is missing from the trainer image
still fails the job in seconds with InvalidData, and nothing the module does at import (threads,
signal handlers, a crash, a different torch) reaches the process that runs the job.

A function is called as function(prompt, response, reference_answer), plus the keyword
stop_reason="finished" or "truncated" (cut at generation.maxNewTokens) when its signature names
that parameter or takes **kwargs; it returns a finite float.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.user_code import import_named

CHECK_SECONDS = 300
"""How long the driver's check may take to import the function's module."""
STOP_REASON = "stop_reason"


@dataclass(frozen=True)
class RewardFunction:
    """A loaded env.function with how it is called (module docstring)."""

    spec: str
    function: Callable[..., object]
    takes_stop_reason: bool

    def __call__(self, prompt: str, response: str, reference: str, *, finished: bool) -> float:
        """The reward; TypeError/ValueError (a failed call) when the function returns no finite float."""
        kwargs = {STOP_REASON: "finished" if finished else "truncated"} if self.takes_stop_reason else {}
        value = self.function(prompt, response, reference, **kwargs)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{self.spec} returned {type(value).__name__} {value!r}; it must return a float")
        reward = float(value)
        if not math.isfinite(reward):
            raise ValueError(f"{self.spec} returned {reward}; it must return a finite float")
        return reward


def load(spec: str) -> RewardFunction:
    """The function named by env.function ("package.module:function"), imported in this process, or
    InvalidDataError saying why it cannot be used."""
    function = import_named("env.function", spec)
    if not callable(function):
        found = "is not callable" if function is not None else "does not exist"
        raise InvalidDataError(f"env.function: {spec}: {spec.replace(':', '.', 1)} {found}")
    return RewardFunction(spec, function, _takes_stop_reason(function))


def _takes_stop_reason(function: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a callable without an inspectable signature gets three arguments
        return False
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == STOP_REASON and p.kind is not p.POSITIONAL_ONLY)
        for p in parameters
    )


def check(spec: str) -> None:
    """InvalidDataError when env.function cannot be loaded, found by `load` in a child process with
    this process's import path (module docstring): user code never runs in the caller."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, spec],
            capture_output=True,
            text=True,
            env=env,
            timeout=CHECK_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InvalidDataError(
            f"env.function: importing {spec.partition(':')[0]!r} took more than {CHECK_SECONDS}s"
        ) from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        if not last.startswith("env.function: "):  # the import killed the process before load answered
            last = f"env.function: loading {spec} failed (exit code {done.returncode}): {last}"
        raise InvalidDataError(last)


def main() -> int:
    """`python -m asyncgrpo_trainer.reward_function SPEC`: exit 1 with load's error last on stderr."""
    try:
        load(sys.argv[1])
    except InvalidDataError as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
