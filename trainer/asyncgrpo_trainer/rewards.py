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

The pool scores the groups asked for together in one call per actor, up to `MAX_BATCH_GROUPS`:
the groups of a decoded batch finish at once, and one Ray call per group cost more than the scoring
(on the CPU bench, the reward actor spent about 8 s in Ray's task machinery for 0.04 s of scoring
over 60 steps, docs/benchmarks.md). It waits `COLLECT_SECONDS` at a time while requests keep
arriving, then hands an idle actor its share (the waiting groups split over env.numWorkers actors).
Each call goes to an idle actor, so its deadline measures scoring and not a queue: env.timeoutSeconds
for each group in it, so that a group that scores in time alone scores in time in a batch; the cap
bounds what a stuck group costs its siblings before they are scored again on their own.

Failures are charged to the group that caused them. A group whose scoring raised inside a batch has
used its first attempt; a batch of several groups that timed out or lost its actor says nothing of
which group was at fault, so each of its groups is scored again on its own, with both attempts
left. On its own, a group's call that raises is retried once; a call past the deadline has its actor
killed (a Python function stuck in a loop cannot be interrupted from outside its process) and
replaced, and is retried once. A second failure raises `RewardFailedError`: the controller drops the
group, counts it (rewardFailures) and never trains on it. A failure is never turned into reward 0,
which would bias every group-relative baseline it touches.

Kept apart from the torch workers so that a reward actor's process imports no torch (scoring is
string work; importing torch would add seconds to every job start for nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
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

COLLECT_SECONDS = 0.002
"""The pool waits this long at a time, while groups keep arriving, before it sends a batch."""

MAX_COLLECT_WAITS = 8
"""At most this many waits before a batch is sent."""

MAX_BATCH_GROUPS = 8
"""Groups in one scoring call at most."""

Group = tuple[Example, list[str], list[bool]]
"""One group to score: its example, its responses and whether each finished."""

Outcome = list[Score] | str | None
"""A group's outcome in a batch: its scores, what its scoring raised, or None when the batch failed
as a whole (timed out, or its actor died) and nothing says the group was at fault."""


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

    def score_groups(self, groups: list[Group]) -> list[list[Score] | str]:
        """Each group's scores, or what its scoring raised (named as the pool names a failed call):
        one group's failure is not its batch's."""
        outcomes: list[list[Score] | str] = []
        for example, responses, finished in groups:
            try:
                outcomes.append(self.score(example, responses, finished))
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        return outcomes

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
        self._waiting: deque[_Waiting] = deque()
        self._dispatcher: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()

    def _queue(self) -> asyncio.Queue[Any]:
        # Made on first use, on the event loop of the process that scores (the controller actor):
        # the pool itself is built in the driver and travels there pickled.
        if self._idle is None:
            self._idle = asyncio.Queue()
            for actor in self.actors:
                self._idle.put_nowait(actor)
        return self._idle

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_idle": None, "_waiting": deque(), "_dispatcher": None, "_batches": set()}

    async def score(self, example: Example, responses: list[str], finished: list[bool]) -> list[Score]:
        """The scores of one group, in a batch with the groups asked for beside it; RewardFailedError
        after two failed attempts charged to it (module docstring)."""
        errors: list[str] = []
        outcome = await self._in_batch((example, responses, finished))
        if isinstance(outcome, list):
            return outcome
        if outcome is not None:
            errors.append(outcome)
            log.warning("scoring a group failed (attempt 1 of %d): %s", ATTEMPTS, outcome)
        return await self._alone(example, responses, finished, errors)

    async def _in_batch(self, group: Group) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(group, future))
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.create_task(self._dispatch(), name="reward-batches")
        return await future

    async def _dispatch(self) -> None:
        """Send the waiting groups in batches, an idle actor's share at a time."""
        idle = self._queue()
        while self._waiting:
            for _ in range(MAX_COLLECT_WAITS):
                before = len(self._waiting)
                await asyncio.sleep(COLLECT_SECONDS)
                if len(self._waiting) == before:
                    break
            actor = await idle.get()
            share = min(MAX_BATCH_GROUPS, -(-len(self._waiting) // len(self.actors)))
            batch = [w for w in (self._waiting.popleft() for _ in range(share)) if not w.future.done()]
            if batch:
                task = asyncio.create_task(self._score_batch(actor, batch), name="reward-batch")
                self._batches.add(task)  # the loop keeps only a weak reference to a task
                task.add_done_callback(self._batches.discard)
            else:
                idle.put_nowait(actor)

    async def _score_batch(self, actor: Any, batch: list[_Waiting]) -> None:
        """One actor call for `batch`; each group's outcome goes to its caller."""
        idle = self._queue()
        outcomes: list[Outcome] = [None] * len(batch)
        try:
            ref = actor.score_groups.remote([w.group for w in batch])
            outcomes = list(await asyncio.wait_for(ref, self.timeout * len(batch)))
        except TimeoutError:
            outcomes = self._blame(batch, f"timed out after {self.timeout:g}s (env.timeoutSeconds)")
            actor = await self._replace(actor)
        except ray.exceptions.RayTaskError as exc:  # not a group's scoring: those are outcomes
            cause = exc.cause if exc.cause is not None else exc
            outcomes = self._blame(batch, f"{type(cause).__name__}: {cause}")
        except ray.exceptions.RayError as exc:  # the actor died (its process, its node)
            outcomes = self._blame(batch, f"the reward worker failed: {type(exc).__name__}: {exc}")
            actor = await self._replace(actor)
        finally:
            idle.put_nowait(actor)
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(outcome)

    @staticmethod
    def _blame(batch: list[_Waiting], error: str) -> list[Outcome]:
        """A failed call's outcomes: the error is its group's when the group was alone in it; beside
        others nothing says which group was at fault, and each is scored again on its own."""
        return [error] if len(batch) == 1 else [None] * len(batch)

    async def _alone(
        self, example: Example, responses: list[str], finished: list[bool], errors: list[str]
    ) -> list[Score]:
        """The group's remaining attempts, each a call of its own."""
        idle = self._queue()
        while len(errors) < ATTEMPTS:
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


@dataclass(eq=False)
class _Waiting:
    """A group waiting for its batch, and where its outcome goes."""

    group: Group
    future: asyncio.Future[Outcome]
