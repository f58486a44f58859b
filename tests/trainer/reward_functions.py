"""Reward functions as users write them, for env.function in the tests
(`tests.trainer.reward_functions:NAME`, importable in the Ray workers, which run in the repository)."""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def exact(prompt: str, response: str, reference: str) -> float:
    """1 for exactly the reference, 0.25 for any other digits, else 0."""
    if response.strip() == reference:
        return 1.0
    return 0.25 if response.strip().isdigit() else 0.0


def half_for_truncated(prompt: str, response: str, reference: str, stop_reason: str) -> float:
    """exact's reward, halved for a response cut at maxNewTokens (it takes the stop reason)."""
    return exact(prompt, response, reference) * (0.5 if stop_reason == "truncated" else 1.0)


def takes_keywords(prompt: str, response: str, reference: str, **kwargs: object) -> float:
    return 1.0


def logs_then_raises(prompt: str, response: str, reference: str) -> float:
    """Appends a line to the file named by the prompt (so a test counts the calls), then fails."""
    with Path(prompt).open("a") as f:
        f.write(f"{response}\n")
    raise RuntimeError("the reward service is down")


def hangs_on_hang(prompt: str, response: str, reference: str) -> float:
    """Never returns for the response "hang" (a stuck function); 1.0 otherwise."""
    if response == "hang":
        time.sleep(3600)
    return 1.0


def returns_text(prompt: str, response: str, reference: str) -> str:
    return "1.0"


def always_raises(prompt: str, response: str, reference: str) -> float:
    raise ValueError("no reward for you")


def best_in_group(prompt: str, responses: list[str], reference: str) -> list[float]:
    """A group function (env.functionScope group) that ranks the responses against each other: 1 for
    those with the most positions of the reference right in their group (when any has one), else 0."""
    right = [sum(a == b for a, b in zip(r, reference, strict=False)) for r in responses]
    best = max(right)
    return [float(best > 0 and n == best) for n in right]


def finished_one_truncated_half(
    prompt: str, responses: list[str], reference: str, stop_reasons: list[str]
) -> list[float]:
    """A group function that takes the stop reasons: 1 for a finished response, 0.5 for a truncated one."""
    return [1.0 if reason == "finished" else 0.5 for reason in stop_reasons]


def one_reward_short(prompt: str, responses: list[str], reference: str) -> list[float]:
    """A broken group function: one reward fewer than the responses."""
    return [1.0] * (len(responses) - 1)


def points_from_row(prompt: str, response: str, reference: str, row: Mapping[str, Any]) -> float:
    """The row's own `points` column (metadata the data file carries) for exactly the reference, else 0."""
    return float(row["points"]) if response.strip() == reference else 0.0


NOT_A_FUNCTION = 3


HOLD = Path(tempfile.gettempdir()) / f"asyncgrpo-hold-{hashlib.sha1(__file__.encode()).hexdigest()[:12]}"
"""While this file exists, `exact_unless_held` does not answer (one per checkout of the tests)."""


def exact_unless_held(prompt: str, response: str, reference: str) -> float:
    """exact's reward, once HOLD is gone: a test holds a run's first step until it is ready."""
    deadline = time.monotonic() + 100
    while HOLD.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return exact(prompt, response, reference)
