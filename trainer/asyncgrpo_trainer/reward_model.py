"""A reward model (spec.trainer.rewardModel) as a reward source: what the judge reads, and its verdict.

The judge is a checkpoint run by a generation engine of its own (`judge.JudgeEngine`, a Ray
actor). For each response the reward actor renders rewardModel.template ({prompt}, {response} and
{reference} replaced, nothing else special) and asks the engine for the judge's greedy
continuation of every response of the group at once, so the engine batches them. The reward is the
verdict read from that text:

- its first word, "yes" or "no" in any case, is 1 or 0;
- else a number written at its start, when within [0, 1], is the reward;
- anything else (a refusal, an explanation, 7) fails the call, naming rewardModel and the text:
  retried once and then the group is dropped and counted, as an env.function that raises is. Never
  0: a judge that cannot answer says nothing about the response.

It is used exactly where env.function is (`rewards.RewardActor`): the same truncation rule (a
response cut at maxNewTokens is rewarded 0 without being judged, unless env.scoreTruncated), the
same deadline and retry, and the environment still says what is correct. This module is string
work and imports no torch: it runs in the reward actors' processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import ray

from asyncgrpo_trainer.envs.base import Example

VERDICT = re.compile(r"\s*(?:(?P<word>yes|no)\b|(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?![\d.]))", re.I)


def render(template: str, example: Example, response: str) -> str:
    """What the judge reads for one response (module docstring)."""
    parts = {"{prompt}": example.prompt, "{response}": response, "{reference}": example.answer}
    # One pass, so a response that contains "{reference}" is not filled in itself.
    return re.sub(r"\{prompt\}|\{response\}|\{reference\}", lambda m: parts[m.group(0)], template)


def verdict(text: str) -> float | None:
    """The reward the judge's text gives (module docstring), or None when it gives none."""
    found = VERDICT.match(text)
    if found is None:
        return None
    if found.group("word") is not None:
        return 1.0 if found.group("word").lower() == "yes" else 0.0
    value = float(found.group("number"))
    return value if 0.0 <= value <= 1.0 else None


@dataclass(frozen=True)
class RewardModel:
    """The reward source of a job with rewardModel: the template and the judge's engine actor."""

    template: str
    engine: Any
    """The `judge.JudgeEngine` actor (shared by every reward actor, so its batches fill)."""

    def rewards(self, example: Example, responses: list[str], finished: list[bool]) -> list[float]:
        """One reward per response; RuntimeError/ValueError (a failed call) when the judge fails or
        a verdict gives no reward."""
        texts = [render(self.template, example, r) for r in responses]
        try:
            said: list[str] = ray.get(self.engine.continuations.remote(texts))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise RuntimeError(f"rewardModel: {type(cause).__name__}: {cause}") from None
        rewards = []
        for n, text in enumerate(said, 1):
            reward = verdict(text)
            if reward is None:
                raise ValueError(
                    f"rewardModel: the judge's verdict {text[:80]!r} on response {n} of {len(said)} is "
                    "neither yes, no nor a number in [0, 1]; make rewardModel.template ask for one"
                )
            rewards.append(reward)
        return rewards
