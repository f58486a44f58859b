"""Reward workers: Ray actors that score responses, and the pool in front of them.

A reward actor scores with the environment (`env.name`, or the user's `env.class`; a conversation is
scored on its last policy turn, `envs.multiturn`); with `env.function` set, the reward is
the user's function instead (`reward_function`: how it is called, per response or per group, with
the stop reason and the data row when it takes them), while the environment still says whether a
response is correct (the accuracy every run reports). The environment's truncation rule holds for a
function too: a response cut at maxNewTokens is rewarded 0 without calling it, unless
env.scoreTruncated hands it to the function. Without that rule a function that only compares
answers rewards a policy that writes the answer and never stops (tried: reward 0.995, exact-match
accuracy 0.01). A group function therefore sees the group's finished responses only (the others
are rewarded 0), or all of them with their stop reasons under scoreTruncated; a group with no
finished response is not handed to it at all. A reward model (spec.trainer.rewardModel,
`reward_model`) is the other reward source, used in the function's place by the same rules.

One scoring call is one prompt group's N responses. The pool gives each call to an idle actor, so
its deadline (env.timeoutSeconds) measures the scoring and not a queue. A call that raises is
retried once; a call past the deadline has its actor killed (a Python function stuck in a loop
cannot be interrupted from outside its process) and replaced, and is retried once. A second
failure raises `RewardFailedError`: the controller drops the group, counts it (rewardFailures)
and never trains on it. A failure is never turned into reward 0, which would bias every
group-relative baseline it touches.

Kept apart from the torch workers so that a reward actor's process imports no torch (scoring is
string work; importing torch would add seconds to every job start for nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray

from asyncgrpo_api.v1alpha1.trainer import FunctionScope
from asyncgrpo_trainer import envs, reward_function
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.reward_function import RewardFunction
from asyncgrpo_trainer.reward_model import RewardModel

log = logging.getLogger(__name__)

ATTEMPTS = 2
"""A scoring call and one retry."""


class RewardFailedError(RuntimeError):
    """Scoring a group failed twice (timed out or raised); the group is dropped."""


class RewardActor:
    """Scores responses with the environment and, when set, the user's function (module docstring)."""

    def __init__(
        self,
        env_name: str,
        function: str | None,
        score_truncated: bool,
        env_class: str | None = None,
        *,
        function_scope: FunctionScope = "response",
        reward_model: RewardModel | None = None,
    ) -> None:
        self.env = envs.build(env_name, env_class)
        self.source: RewardFunction | RewardModel | None = reward_model
        if function is not None:
            self.source = reward_function.load(function, function_scope)
        self.score_truncated = score_truncated
        # A throwaway scoring imports what the environment loads on first use (math-verify takes
        # seconds), here at start and not inside the first call's deadline.
        self.env.score(Example("1", "1"), "1", finished=True)

    def score(self, example: Example, responses: list[str], finished: list[bool]) -> list[Score]:
        scores = [self.env.score(example, r, finished=f) for r, f in zip(responses, finished, strict=True)]
        if self.source is None:
            return scores
        # The environments' truncation rule (module docstring): what the source is not shown is 0.
        shown = [i for i, f in enumerate(finished) if f or self.score_truncated]
        rewards = [0.0] * len(responses)
        if shown:
            got = self.source.rewards(example, [responses[i] for i in shown], [finished[i] for i in shown])
            for i, reward in zip(shown, got, strict=True):
                rewards[i] = reward
        return [Score(r, s.correct) for r, s in zip(rewards, scores, strict=True)]


def start_actor(
    env_name: str,
    function: str | None,
    score_truncated: bool,
    env_class: str | None,
    *,
    function_scope: FunctionScope,
    reward_model: RewardModel | None,
) -> Any:
    """A new reward actor (no CPU reserved: scoring is short and bursty)."""
    return ray.remote(num_cpus=0)(RewardActor).remote(
        env_name,
        function,
        score_truncated,
        env_class,
        function_scope=function_scope,
        reward_model=reward_model,
    )


class RewardPool:
    """The reward actors behind one `score` call with a deadline and one retry (module docstring)."""

    def __init__(
        self,
        env_name: str,
        function: str | None,
        num_workers: int,
        timeout_seconds: float,
        *,
        score_truncated: bool = False,
        env_class: str | None = None,
        function_scope: FunctionScope = "response",
        reward_model: RewardModel | None = None,
    ) -> None:
        self.env_name, self.function, self.timeout = env_name, function, timeout_seconds
        self.score_truncated, self.env_class = score_truncated, env_class
        self.function_scope, self.reward_model = function_scope, reward_model
        self.actors = [self._start() for _ in range(num_workers)]
        self._idle: asyncio.Queue[Any] | None = None

    def _queue(self) -> asyncio.Queue[Any]:
        # Made on first use, on the event loop of the process that scores (the controller actor):
        # the pool itself is built in the driver and travels there pickled.
        if self._idle is None:
            self._idle = asyncio.Queue()
            for actor in self.actors:
                self._idle.put_nowait(actor)
        return self._idle

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_idle": None}

    async def score(self, example: Example, responses: list[str], finished: list[bool]) -> list[Score]:
        """The scores of one group; RewardFailedError after two failed calls."""
        idle = self._queue()
        errors: list[str] = []
        for _ in range(ATTEMPTS):
            actor = await idle.get()
            ref = actor.score.remote(example, responses, finished)
            try:
                scores: list[Score] = await asyncio.wait_for(ref, self.timeout)
                return scores
            except TimeoutError:
                errors.append(f"timed out after {self.timeout:g}s (env.timeoutSeconds)")
                actor = await self._replace(actor)
            except ray.exceptions.RayTaskError as exc:  # the environment or the function raised
                cause = exc.cause if exc.cause is not None else exc
                errors.append(f"{type(cause).__name__}: {cause}")
            except ray.exceptions.RayError as exc:  # the actor died (its process, its node)
                errors.append(f"the reward worker failed: {type(exc).__name__}: {exc}")
                actor = await self._replace(actor)
            finally:
                idle.put_nowait(actor)
            log.warning("scoring a group failed (attempt %d of %d): %s", len(errors), ATTEMPTS, errors[-1])
        raise RewardFailedError(f"scoring failed {ATTEMPTS} times; last: {errors[-1]}")

    async def _replace(self, actor: Any) -> Any:
        """A started actor in place of `actor`, which is killed. Its start is awaited here, so that
        it does not count against the next call's deadline."""
        ray.kill(actor, no_restart=True)
        fresh = self._start()
        self.actors = [fresh if a is actor else a for a in self.actors]
        with contextlib.suppress(ray.exceptions.RayError):  # one that cannot start fails its next call
            await fresh.__ray_ready__.remote()
        return fresh

    def _start(self) -> Any:
        return start_actor(
            self.env_name,
            self.function,
            self.score_truncated,
            self.env_class,
            function_scope=self.function_scope,
            reward_model=self.reward_model,
        )

    def owned_actors(self) -> list[Any]:
        """Every actor the pool started or uses alone: its reward actors and the judge's engine."""
        return [*self.actors, *([self.reward_model.engine] if self.reward_model is not None else [])]

    def ready(self) -> list[Any]:
        """Refs that resolve when every reward actor has started."""
        return [a.__ray_ready__.remote() for a in self.actors]
