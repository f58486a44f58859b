"""What a multi-turn environment is: a conversation in which the policy speaks and the environment
answers (a tool's result, a user's next turn, an observation), until the environment says done.

The rollout side (`conversation`) drives the loop above the generation interface, so every engine
runs it: it generates one policy turn, hands the decoded text of every policy turn so far to
`respond`, appends the reply (encoded by the tokenizer's per-turn chat template) and generates
again, until `respond` says done, env.maxTurns policy turns were spoken, or a budget ran out.

`respond` sees the whole history (it is called with every policy turn so far), so an environment
keeps no state between calls and one instance serves every conversation at once. It runs in a
worker thread of the process that drives rollouts, so it may block (a tool's subprocess) without
stalling generation. Scoring is the single-turn contract (`Environment.score`) applied to the
policy's last turn: the answer the conversation ended on; `finished` is true only when the
environment said done (a conversation cut by a budget is truncated, and scored as such).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from asyncgrpo_trainer.envs.base import Environment, Example


@dataclass(frozen=True)
class Reply:
    """The environment's answer to the policy's latest turn."""

    done: bool
    """The conversation is over: the latest policy turn is the answer to score."""
    content: str = ""
    """What the environment says next (ignored when done)."""
    role: str = "tool"
    """The chat role of `content` (`tool`, `user`, ...), for the tokenizer's per-turn template."""
    outcome: str | None = None
    """For a tool call, how it ended (`sandbox.Outcome` values: ok, error, timeout, killed,
    memory): counted per kind in the run's counters, so a hostile or broken call is visible."""


class MultiTurnEnvironment(Environment):
    """An environment whose rollouts are conversations; see the module docstring."""

    @abc.abstractmethod
    def respond(self, example: Example, turns: tuple[str, ...]) -> Reply:
        """The reply to the policy's latest turn (`turns[-1]`), given all its turns so far."""
