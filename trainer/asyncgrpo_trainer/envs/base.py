"""What an environment is: prompts with reference answers, and a score for a response.

Scoring is a pure function of (example, response, finished) so it can run anywhere: in the reward
worker actors, in tests, and in validation. `finished` is false when generation hit maxNewTokens
before the end-of-sequence token; environments score such truncated responses as wrong.

A score has two parts, because they answer different questions. `reward` is what the policy is
trained on and may be shaped. `correct` says whether the response is exactly the reference
answer (by the task's own notion of equality, e.g. math-verify's), with no partial credit: the
accuracy that the step log, /progress, the job's status and the curves report. A constant answer
can collect shaped reward, but it cannot be correct on many prompts.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncgrpo_trainer.models.tokenizer import Chat, Prompt


@dataclass(frozen=True)
class Example:
    """One prompt and its reference answer, with the data row it came from."""

    prompt: str
    """The prompt's text: what reward functions get (for a chat prompt, its last user turn)."""
    answer: str
    chat: Chat = ()
    """The prompt as the row gave it when that was chat messages; empty for a text prompt."""
    row: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The whole data row, as plain JSON data (`data.plain_row`), so a reward function can read
    the row's other columns (`reward_function`: `row=`). An example made without one (a built-in
    set, an environment class's prompts, a checkpoint from before rows were kept) gets
    {"prompt": ..., "answer": ...}, so a function that reads the row works with every source.
    Context, not identity: two examples of the same prompt and answer are equal whatever it holds."""

    def __post_init__(self) -> None:
        if not self.row:
            object.__setattr__(self, "row", {"prompt": self.prompt, "answer": self.answer})

    @property
    def model_prompt(self) -> Prompt:
        """What the tokenizer encodes: the chat messages when there are any, else the text."""
        return self.chat or self.prompt


@dataclass(frozen=True)
class Score:
    """How one response did: the reward to train on and whether it is the reference answer."""

    reward: float
    """In [0, 1]."""
    correct: bool
    """The response is exactly the reference answer (and finished): what accuracy counts."""


class Environment(abc.ABC):
    """A reward environment; subclasses ship a built-in prompt set so a job needs no data files."""

    name: str = ""
    alphabet: str = ""
    """Characters the char-level tokenizer of the tiny model must cover for this task."""

    @abc.abstractmethod
    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        """`count` examples of `split` ("train" or "validation"); the splits never overlap."""

    def reference(self, answer: str) -> str:
        """The reference answer in the answer text of a data file's row (e.g. the number after ####
        of a GSM8K solution); ValueError, saying what was expected, when it holds none (a bad row)."""
        return answer.strip()

    @abc.abstractmethod
    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        """The reward of `response` to `example` and whether it is the reference answer."""
