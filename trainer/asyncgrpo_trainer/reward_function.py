"""A user's reward function (env.function): loading it, checking it from outside, and calling it.

The function is user code: importing its module runs that module. It runs only in the reward
actors' processes (`RewardActor`); the driver checks that it can be loaded (`check`) in a child
Python process with the driver's import path, so a function that is missing from the trainer image
still fails the job in seconds with InvalidData, and nothing the module does at import (threads,
signal handlers, a crash, a different torch) reaches the process that runs the job.

How it is called depends on env.functionScope:

- response (the default): function(prompt, response, reference_answer) once per response, which
  returns a finite float;
- group: function(prompt, responses, reference_answer) once per prompt group, with the list of the
  group's responses, which returns a list of as many finite floats, in the same order. So a reward
  may rank a response against its siblings (1 for the shortest correct one).

Keywords are passed only to a function whose signature names them (or takes **kwargs), so a
three-argument function keeps working: `stop_reason` ("finished", or "truncated" when cut at
generation.maxNewTokens; `stop_reasons`, one per response, for a group), and `row`, the prompt's
whole data row (`Example.row`) with its metadata columns. Anything else returned (a wrong length,
text, NaN) is a failed call, never a reward (`rewards` retries it once, then drops the group).
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import subprocess
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncgrpo_api.v1alpha1.trainer import FunctionScope
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.user_code import import_named

CHECK_SECONDS = 300
"""How long the driver's check may take to import the function's module."""
ROW = "row"
STOP_REASON = {"response": "stop_reason", "group": "stop_reasons"}
"""The stop-reason keyword of each scope."""
CALLED = {
    "response": "function(prompt, response, reference_answer)",
    "group": "function(prompt, responses, reference_answer)",
}
PASSED = {"response": ("str", "one response's text"), "group": ("list", "the list of a group's responses")}
"""What each scope passes as the second argument: its annotation, in words."""


@dataclass(frozen=True)
class RewardFunction:
    """A loaded env.function with how it is called (module docstring)."""

    spec: str
    function: Callable[..., object]
    scope: FunctionScope
    keywords: frozenset[str]
    """The optional keywords its signature takes (`STOP_REASON` of its scope, `ROW`)."""

    @property
    def takes_stop_reason(self) -> bool:
        return STOP_REASON[self.scope] in self.keywords

    def rewards(self, example: Example, responses: list[str], finished: list[bool]) -> list[float]:
        """One reward per response; TypeError/ValueError (a failed call) when the function returns
        anything but finite floats, as many as the responses."""
        reasons = ["finished" if f else "truncated" for f in finished]
        row = {ROW: example.row} if ROW in self.keywords else {}
        if self.scope == "response":
            return [
                self._reward(self._call(example, r, {**self._stop(reason), **row}), None)
                for r, reason in zip(responses, reasons, strict=True)
            ]
        values = self._call(example, responses, {**self._stop(reasons), **row})
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise TypeError(
                f"env.function {self.spec} returned {_shown(values)}; with env.functionScope group it must "
                f"return a list of {len(responses)} floats, one per response"
            )
        if len(values) != len(responses):
            raise ValueError(
                f"env.function {self.spec} returned {len(values)} rewards for {len(responses)} responses; "
                "with env.functionScope group it must return one float per response, in their order"
            )
        return [self._reward(v, (n, len(values))) for n, v in enumerate(values, 1)]

    def _stop(self, reason: object) -> dict[str, object]:
        key = STOP_REASON[self.scope]
        return {key: reason} if key in self.keywords else {}

    def _call(self, example: Example, response: object, kwargs: dict[str, object]) -> object:
        return self.function(example.prompt, response, example.answer, **kwargs)

    def _reward(self, value: object, position: tuple[int, int] | None) -> float:
        where = f" for response {position[0]} of {position[1]}" if position else ""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"env.function {self.spec} returned {_shown(value)}{where}; it must return a float"
            )
        reward = float(value)
        if not math.isfinite(reward):
            raise ValueError(
                f"env.function {self.spec} returned {reward}{where}; it must return a finite float"
            )
        return reward


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def load(spec: str, scope: FunctionScope = "response") -> RewardFunction:
    """The function named by env.function ("package.module:function"), imported in this process, or
    InvalidDataError saying why it cannot be called as `scope` calls it."""
    function = import_named("env.function", spec)
    if not callable(function):
        found = "is not callable" if function is not None else "does not exist"
        raise InvalidDataError(f"env.function: {spec}: {spec.replace(':', '.', 1)} {found}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a callable without an inspectable signature gets three arguments
        return RewardFunction(spec, function, scope, frozenset())
    _check_signature(spec, scope, signature)
    keywords = {STOP_REASON[scope], ROW}
    parameters = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return RewardFunction(spec, function, scope, frozenset(keywords))
    named = {p.name for p in parameters if p.kind is not p.POSITIONAL_ONLY}
    return RewardFunction(spec, function, scope, frozenset(keywords & named))


def _check_signature(spec: str, scope: FunctionScope, signature: inspect.Signature) -> None:
    """InvalidDataError when the function cannot take the three positional arguments, or when its
    second parameter's annotation says it expects what the other scope passes (a str in a group
    function is a per-response function with the wrong env.functionScope, and vice versa)."""
    try:
        signature.bind_partial("", [] if scope == "group" else "", "")
    except TypeError as exc:
        raise InvalidDataError(
            f"env.function: {spec}{signature} cannot be called as {CALLED[scope]} ({exc}), as "
            f"env.functionScope {scope} calls it"
        ) from None
    positional = [
        p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) < 2:
        return
    kind = _annotated_kind(positional[1].annotation)
    if kind is not None and kind != PASSED[scope][0]:
        other = "response" if scope == "group" else "group"
        raise InvalidDataError(
            f"env.function: {spec}: its parameter {positional[1].name!r} is annotated {kind}, but "
            f"env.functionScope {scope} passes {PASSED[scope][1]}; set env.functionScope {other} or "
            "change the function"
        )


def _annotated_kind(annotation: Any) -> str | None:
    """ "str" or "list" when an annotation plainly says one of them (a string annotation too, as
    `from __future__ import annotations` leaves it), else None: nothing is guessed."""
    if isinstance(annotation, str):
        text = annotation.replace("typing.", "").replace("collections.abc.", "").strip()
        if text == "str":
            return "str"
        head = text.partition("[")[0]
        return "list" if head in {"list", "List", "Sequence", "tuple", "Tuple"} else None
    if annotation is str:
        return "str"
    origin = typing.get_origin(annotation) or annotation
    return "list" if origin in {list, tuple, Sequence} else None


def check(spec: str, scope: FunctionScope = "response") -> None:
    """InvalidDataError when env.function cannot be loaded or called as `scope` calls it, found by
    `load` in a child process with this process's import path (module docstring): user code never
    runs in the caller."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, spec, scope],
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
    """`python -m asyncgrpo_trainer.reward_function SPEC [SCOPE]`: exit 1 with load's error last on
    stderr."""
    scope: FunctionScope = "group" if sys.argv[2:] == ["group"] else "response"
    try:
        load(sys.argv[1], scope)
    except InvalidDataError as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
