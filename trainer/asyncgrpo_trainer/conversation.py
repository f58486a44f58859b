"""The conversation rollout: one multi-turn sample, from the prompt to the environment's `done`.

The loop sits above the generation interface (`Generates`: the engine group's `generate`), so the
torch engine and vLLM run the same conversations. A turn is one call of n=1 samples whose prompt is
the conversation so far, as token ids: the prompt, every policy turn as sampled (its end-of-turn
token included) and every environment reply as the tokenizer's per-turn chat template encodes it
(`Tokenizer.encode_turn`). The history is never re-tokenized from text, so the ids the policy
trains on are exactly the ids the engine conditioned on, and the log-prob of each policy token
that the engine recorded is the one the trainer recomputes from the same prefix: they stay
consistent across turns for both engines.

The response of a conversation is everything after the prompt. Its `loss_mask` is 1 on policy
tokens and 0 on environment tokens (whose recorded log-prob is 0: no model sampled them), so only
the policy's tokens are trained. Every token carries the weight version that produced it
(`versions`): a turn's tokens get the turn's staleness stamp, the oldest version that shaped them
(`generation.Generated.oldest_versions`: the engine's when the turn started, or older when the
conversation so far came from a prefix cache; a turn that straddled a refit is counted as the
older weights, so staleness is never under-stated); an environment token carries the version of
the turn it answers.

Budgets: at most `max_turns` policy turns, at most `tokens_per_turn` tokens per turn
(env.maxTokensPerTurn), and at most `max_new_tokens` response tokens in all (generation.
maxNewTokens, environment tokens included, so a conversation fits maxSequenceLength). A
conversation that runs out of any of them before the environment says done is not finished.
Every turn is sampled with the same budget (`tokens_per_turn`) and cut afterwards when the whole
conversation's budget is smaller: an engine keeps one decoder per budget, and a budget per turn
would build one for every length.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.generation import Generated
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.envs.multiturn import MultiTurnEnvironment
from asyncgrpo_trainer.models.tokenizer import Tokenizer


class Generates(Protocol):
    """The generation interface the loop needs (`workers.GenerationGroup`, any engine behind it)."""

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated: ...


@dataclass(frozen=True)
class Budget:
    """How long a conversation may run (module docstring)."""

    max_turns: int
    tokens_per_turn: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.tokens_per_turn < 1 or self.max_new_tokens < 1:
            raise ValueError(f"a conversation budget needs positive limits, got {self}")


@dataclass
class Conversation:
    """One sampled conversation: its response tokens with what training needs per token."""

    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """The engine's log-prob of each policy token; 0 on environment tokens."""
    loss_mask: list[int] = field(default_factory=list)
    """1 on policy tokens, 0 on environment tokens."""
    versions: list[int] = field(default_factory=list)
    """The weight version that produced each token (module docstring)."""
    turns: list[str] = field(default_factory=list)
    """The decoded text of each policy turn."""
    outcomes: list[str] = field(default_factory=list)
    """How each tool call ended (`envs.multiturn.Reply.outcome`)."""
    finished: bool = False
    """The environment said done (not cut by a budget)."""
    oldest_version: int = -1
    """The oldest of its turns' stamps: the oldest weights that shaped any of its tokens."""
    first_version: int = -1
    last_version: int = -1

    @property
    def answer(self) -> str:
        """The policy's last turn: what the environment scores."""
        return self.turns[-1] if self.turns else ""

    def extend(self, ids: list[int], logprobs: list[float], *, policy: bool, version: int) -> None:
        self.response_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([int(policy)] * len(ids))
        self.versions.extend([version] * len(ids))


async def converse(
    engine: Generates,
    *,
    tokenizer: Tokenizer,
    env: MultiTurnEnvironment,
    example: Example,
    params: sampling.SamplingParams,
    budget: Budget,
    seed: int,
) -> Conversation:
    """Run one conversation to the environment's done or a budget (module docstring)."""
    prompt_ids = tokenizer.encode_prompt(example.model_prompt)
    turn_params = dataclasses.replace(params, max_new_tokens=budget.tokens_per_turn)
    conv = Conversation()
    for turn in range(budget.max_turns):
        out = await engine.generate(prompt_ids + conv.response_ids, 1, turn_params, seed + turn)
        stamp = out.oldest_versions[0]
        if turn == 0:
            conv.first_version = conv.oldest_version = out.first_version
        conv.oldest_version = min(conv.oldest_version, stamp)
        conv.last_version = out.last_version
        room = budget.max_new_tokens - len(conv.response_ids)
        ids, logprobs = out.response_ids[0][:room], out.logprobs[0][:room]
        conv.extend(ids, logprobs, policy=True, version=stamp)
        conv.turns.append(tokenizer.decode(ids))
        if not out.finished[0] or len(ids) < len(out.response_ids[0]):
            return conv  # the turn hit its token budget (or the conversation's) before its end
        reply = await asyncio.to_thread(env.respond, example, tuple(conv.turns))
        if reply.outcome is not None:
            conv.outcomes.append(reply.outcome)
        if reply.done:
            conv.finished = True
            return conv
        observed = tokenizer.encode_turn(reply.role, reply.content)
        if len(conv.response_ids) + len(observed) >= budget.max_new_tokens:
            return conv  # no room left for the policy to answer the reply
        conv.extend(observed, [0.0] * len(observed), policy=False, version=stamp)
    return conv  # maxTurns policy turns, and the environment still expected more
