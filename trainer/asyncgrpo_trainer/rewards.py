"""Reward workers: Ray actors that score responses with an environment, and the pool in front.

Kept apart from the torch workers so that a reward actor's process imports no torch (scoring is
string work; importing torch would add seconds to every job start for nothing). A scoring call
past env.timeoutSeconds scores 0, as the API documents; a generation failure, by contrast, is
never turned into a reward (see rollout.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from asyncgrpo_trainer import envs
from asyncgrpo_trainer.envs.base import Example, Score


class RewardActor:
    """Scores responses with an environment (one per env worker)."""

    def __init__(self, env_name: str) -> None:
        self.env = envs.build(env_name)

    def score(self, example: Example, responses: list[str], finished: list[bool]) -> list[Score]:
        return [self.env.score(example, r, finished=f) for r, f in zip(responses, finished, strict=True)]


class RewardPool:
    """Round-robin over the reward actors, with a per-call deadline (a timeout scores 0)."""

    def __init__(self, actors: list[Any], timeout_seconds: float) -> None:
        self.actors, self.timeout = actors, timeout_seconds
        self._next = 0

    async def score(self, example: Example, responses: list[str], finished: list[bool]) -> list[Score]:
        actor = self.actors[self._next % len(self.actors)]
        self._next += 1
        ref = actor.score.remote(example, responses, finished)
        try:
            scores: list[Score] = await asyncio.wait_for(ref, self.timeout)
            return scores
        except TimeoutError:
            ray.cancel(ref)
            return [Score(0.0, False)] * len(responses)


def build_reward_pool(env_name: str, num_workers: int, timeout_seconds: float) -> RewardPool:
    cls = ray.remote(num_cpus=0)(RewardActor)
    actors = [cls.remote(env_name) for _ in range(num_workers)]
    return RewardPool(actors, timeout_seconds)
