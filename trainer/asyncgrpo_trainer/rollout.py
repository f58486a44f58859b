"""The rollout manager: one prompt group from prompt to scored samples, with deadlines and retries.

`run_group` generates N samples of a prompt on a generation engine, decodes them, scores them with
the reward pool (plus DAPO's overlong penalty when the spec sets one, `algorithms.overlong`), and
returns a GroupRecord. With a multi-turn environment each of the N samples is a conversation
(`conversation.converse`, the same generation interface one turn at a time): the record then carries
the loss mask over the environment's tokens and the weight version of every token. Each generation
attempt has a deadline
(asyncRL.rolloutTimeoutSeconds); a failed or timed-out attempt is retried from the current weights
up to asyncRL.maxRolloutAttempts times, and after that `RolloutFailedError` is raised so the run fails
loudly. Scoring has its own deadline and one retry in the reward pool; when both calls fail,
`rewards.RewardFailedError` reaches the controller, which drops the group (it does not generate
it again: the samples were fine, their scorer was not). A failure is never turned into zero-reward
samples: that would bias every group-relative baseline it touches (the reference system's silent
failure mode).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from asyncgrpo_trainer.algorithms.overlong import OverlongPenalty
from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.buffer import GroupRecord
from asyncgrpo_trainer.conversation import Budget, converse
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.envs.multiturn import MultiTurnEnvironment
from asyncgrpo_trainer.models.tokenizer import Tokenizer
from asyncgrpo_trainer.rewards import RewardPool
from asyncgrpo_trainer.workers import GenerationGroup

log = logging.getLogger(__name__)


class RolloutFailedError(RuntimeError):
    """A prompt group failed every attempt."""


@dataclass(frozen=True)
class Conversations:
    """How a multi-turn environment's samples are generated: the environment that answers the
    policy and the budgets of one conversation."""

    env: MultiTurnEnvironment
    budget: Budget


@dataclass(frozen=True)
class Samples:
    """The N samples of one group as generated, before scoring."""

    prompt_ids: list[int]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    texts: list[str]
    """What the environment scores: the decoded response, or a conversation's last policy turn."""
    oldest_version: int
    """The group's staleness stamp: the oldest of its samples' (`generation.Generated.oldest_versions`)."""
    first_version: int
    last_version: int
    loss_masks: list[list[int]] | None = None
    token_versions: list[list[int]] | None = None
    tool_outcomes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answer:
    """One answer to score (validation): its text, whether it ended, and the weights it came from."""

    text: str
    finished: bool
    oldest_version: int
    first_version: int
    last_version: int


@dataclass
class RolloutStats:
    attempts: int = 0
    retries: int = 0
    timeouts: int = 0
    errors: int = 0


class RolloutManager:
    """See the module docstring."""

    def __init__(
        self,
        generation: GenerationGroup,
        rewards: RewardPool,
        tokenizer: Tokenizer,
        params: sampling.SamplingParams,
        *,
        num_generations: int,
        timeout_seconds: float | None,
        max_attempts: int,
        seed: int,
        overlong: OverlongPenalty | None = None,
        conversations: Conversations | None = None,
    ) -> None:
        self.generation, self.rewards, self.tokenizer = generation, rewards, tokenizer
        self.params, self.n = params, num_generations
        self.timeout, self.max_attempts, self.seed = timeout_seconds, max_attempts, seed
        self.overlong = overlong
        self.conversations = conversations
        self.stats = RolloutStats()

    async def _generate(self, example: Example, seed: int) -> Samples:
        prompt_ids = self.tokenizer.encode_prompt(example.model_prompt)
        if self.conversations is not None:
            return await self._converse(example, prompt_ids, self.conversations, seed)
        out = await self.generation.generate(prompt_ids, self.n, self.params, seed)
        return Samples(
            prompt_ids,
            out.response_ids,
            out.logprobs,
            out.finished,
            [self.tokenizer.decode(r) for r in out.response_ids],
            min(out.oldest_versions),
            out.first_version,
            out.last_version,
        )

    async def _converse(
        self, example: Example, prompt_ids: list[int], conv: Conversations, seed: int
    ) -> Samples:
        """N conversations at once, each with its own seed (their turns interleave on the engines)."""
        runs = await asyncio.gather(
            *(
                converse(
                    self.generation,
                    tokenizer=self.tokenizer,
                    env=conv.env,
                    example=example,
                    params=self.params,
                    budget=conv.budget,
                    seed=(seed + i * 7919) % (2**63),
                )
                for i in range(self.n)
            )
        )
        return Samples(
            prompt_ids,
            [c.response_ids for c in runs],
            [c.logprobs for c in runs],
            [c.finished for c in runs],
            [c.answer for c in runs],
            min(c.oldest_version for c in runs),
            min(c.first_version for c in runs),
            max(c.last_version for c in runs),
            loss_masks=[c.loss_mask for c in runs],
            token_versions=[c.versions for c in runs],
            tool_outcomes=tuple(o for c in runs for o in c.outcomes),
        )

    async def answer(self, example: Example, params: sampling.SamplingParams, seed: int) -> Answer:
        """One answer to `example` under `params` (validation's greedy answers): a single
        response, or a whole conversation with a multi-turn environment."""
        if self.conversations is None:
            out = await self.generation.generate(
                self.tokenizer.encode_prompt(example.model_prompt), 1, params, seed
            )
            text = self.tokenizer.decode(out.response_ids[0])
            return Answer(text, out.finished[0], out.oldest_versions[0], out.first_version, out.last_version)
        conv = self.conversations
        run = await converse(
            self.generation,
            tokenizer=self.tokenizer,
            env=conv.env,
            example=example,
            params=params,
            budget=conv.budget,
            seed=seed,
        )
        return Answer(run.answer, run.finished, run.oldest_version, run.first_version, run.last_version)

    async def run_group(
        self, example: Example, group_id: int, on_attempt: Callable[[int], None]
    ) -> GroupRecord:
        """Generate and score one group; `on_attempt(i)` runs before attempt i (re-stamps the slot)."""
        out = await self._generate_with_retries(example, group_id, on_attempt)
        scores = await self.rewards.score(example, out.texts, out.finished)  # RewardFailedError: dropped
        rewards = [s.reward for s in scores]
        if self.overlong is not None:
            rewards = [r + self.overlong(len(ids)) for r, ids in zip(rewards, out.response_ids, strict=True)]
        return GroupRecord(
            prompt_ids=out.prompt_ids,
            response_ids=out.response_ids,
            generation_logprobs=out.logprobs,
            rewards=rewards,
            correct=[s.correct for s in scores],
            finished=out.finished,
            oldest_version=out.oldest_version,
            first_version=out.first_version,
            last_version=out.last_version,
            loss_masks=out.loss_masks,
            token_versions=out.token_versions,
            tool_outcomes=list(out.tool_outcomes),
        )

    async def _generate_with_retries(
        self, example: Example, group_id: int, on_attempt: Callable[[int], None]
    ) -> Samples:
        last_error: BaseException | None = None
        for attempt in range(self.max_attempts):
            on_attempt(attempt)
            self.stats.attempts += 1
            seed = (self.seed * 1_000_003 + group_id * 101 + attempt) % (2**63)
            try:
                if self.timeout is None:
                    return await self._generate(example, seed)
                return await asyncio.wait_for(self._generate(example, seed), self.timeout)
            except TimeoutError as exc:
                self.stats.timeouts += 1
                last_error = exc
                log.warning("group %d attempt %d timed out after %ss", group_id, attempt + 1, self.timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an engine error: retry, then fail loudly
                self.stats.errors += 1
                last_error = exc
                log.warning("group %d attempt %d failed: %r", group_id, attempt + 1, exc)
            if attempt + 1 < self.max_attempts:
                self.stats.retries += 1
        raise RolloutFailedError(
            f"prompt group {group_id} failed {self.max_attempts} attempt(s); last error: {last_error!r}"
        ) from last_error
