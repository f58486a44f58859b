"""The rollout manager: one prompt group from prompt to scored samples, with deadlines and retries.

`run_group` generates N samples of a prompt on a generation engine, decodes them, scores them with
the reward pool (plus DAPO's overlong penalty when the spec sets one, `algorithms.overlong`), and
returns a GroupRecord. Each generation attempt has a deadline
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
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.buffer import GroupRecord
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.models.tokenizer import Tokenizer
from asyncgrpo_trainer.rewards import RewardPool
from asyncgrpo_trainer.workers import GenerationGroup

log = logging.getLogger(__name__)


class RolloutFailedError(RuntimeError):
    """A prompt group failed every attempt."""


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
    ) -> None:
        self.generation, self.rewards, self.tokenizer = generation, rewards, tokenizer
        self.params, self.n = params, num_generations
        self.timeout, self.max_attempts, self.seed = timeout_seconds, max_attempts, seed
        self.overlong = overlong
        self.stats = RolloutStats()

    async def _generate(
        self, example: Example, seed: int
    ) -> tuple[list[int], generation.Generated, list[str]]:
        prompt_ids = self.tokenizer.encode_prompt(example.model_prompt)
        out = await self.generation.generate(prompt_ids, self.n, self.params, seed)
        return prompt_ids, out, [self.tokenizer.decode(r) for r in out.response_ids]

    async def run_group(
        self, example: Example, group_id: int, on_attempt: Callable[[int], None]
    ) -> GroupRecord:
        """Generate and score one group; `on_attempt(i)` runs before attempt i (re-stamps the slot)."""
        prompt_ids, out, texts = await self._generate_with_retries(example, group_id, on_attempt)
        scores = await self.rewards.score(example, texts, out.finished)  # RewardFailedError: dropped
        rewards = [s.reward for s in scores]
        if self.overlong is not None:
            rewards = [r + self.overlong(len(ids)) for r, ids in zip(rewards, out.response_ids, strict=True)]
        return GroupRecord(
            prompt_ids=prompt_ids,
            response_ids=out.response_ids,
            generation_logprobs=out.logprobs,
            rewards=rewards,
            correct=[s.correct for s in scores],
            finished=out.finished,
            first_version=out.first_version,
            last_version=out.last_version,
        )

    async def _generate_with_retries(
        self, example: Example, group_id: int, on_attempt: Callable[[int], None]
    ) -> tuple[list[int], generation.Generated, list[str]]:
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
