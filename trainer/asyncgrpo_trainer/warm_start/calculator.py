"""The calculator warm start: tool conversations on the calculator environment's prompts, with
the decision to call trained rarely.

GRPO can only prefer calling the calculator once some samples call it and then use what it said.
So the lessons are the environment's training prompts (`ab*cd=`, never a held-out pair), of two
kinds (TOOL_FRACTION of them the first):

- A tool conversation: the right call `?ab*cd`, the tool's reply as the chat template renders a
  `tool` turn (`Tokenizer.encode_turn`, as a job's conversation encodes it), then the reply's
  number as the answer. In RANDOM_REPLY_FRACTION of them the reply is a random number instead of
  the product, so the answer can only come from reading the reply: the lesson teaches the copy.
  The reply is context, not trained (a job's loss mask does the same).
- A direct answer: a random number in the products' range, so the model learns the answer's form
  and nothing of multiplication.

How often to call and how to call are taught apart. Every tool conversation trains the call's
operands and the copy, but only CALL_TRAINED of them train the `?` that decides to call, so the
decision is a call in CALL_FRACTION of the lessons that train it. The model then samples a call in
a few percent of its conversations, greedily answers without one (held-out accuracy starts near 0), and
the calls it samples are right and score 1 where its guesses score the digits they got right by
chance: the advantage GRPO has to find and grow.

Why (measured 2026-12-06, steps of 64 lessons, the held-out check):
- With the decision and the rehearsal tied (tool conversations in 5-10% of the lessons, after a
  first quarter or 40% of only tool conversations in some runs), the copy and the call's operands
  were learned in some seeds and not others after 1,500 steps: copies 0.82, 0.21, 0.995, 0.62,
  0.82, 0.01; sampled calls right 0.81-0.95 in some, 0.0-0.02 in others. Untied, with tool
  conversations in half the lessons, the copy was 0.31-0.52 after 600-1,500 steps; in 80%, it was
  1.0 after 300 steps in seeds 0, 1 and 2, with sampled calls right 0.9-1.0 and 1.3-3.6% of samples
  calling (600 steps: 1.0, 0.97-1.0, 2.4-8%).
- Direct answers with the true product taught a guess of it that competed with the copy, and
  answered 5-9% of held-out prompts right without the tool.
- At a learning rate of 3e-3 (the reversal warm start's) the copy was not learned even with every
  lesson a tool conversation (10% after 3,000 steps); at 1e-3 within 250 steps.
"""

from __future__ import annotations

import random

import torch

from asyncgrpo_trainer import floor
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.envs.calculator import PAIRS, TOOL_CALL, TOOL_RESULT, CalculatorEnvironment
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from asyncgrpo_trainer.warm_start import Lesson, Task

TOOL_FRACTION = 0.8
"""Lessons that are tool conversations."""
CALL_FRACTION = 0.05
"""Of the lessons whose first token (a call or an answer) is trained, those where it is a call."""
CALL_TRAINED = CALL_FRACTION / (1 - CALL_FRACTION) * (1 - TOOL_FRACTION) / TOOL_FRACTION
"""The fraction of tool conversations whose `?` is trained, so that CALL_FRACTION holds."""
RANDOM_REPLY_FRACTION = 0.5
"""Tool conversations whose reply is a random number, not the product."""
CHECKED = 200
"""Held-out prompts in the check."""
SAMPLES = 4
"""Samples per prompt for the sampled call rate."""
TURN_TOKENS = 8
"""Greedy tokens per turn in the check (a call is 7 with its end, an answer at most 5)."""

_TRAINING = CalculatorEnvironment().builtin_examples(split="train", count=len(PAIRS), seed=0)


def call_text(example: Example) -> str:
    """The right tool call for an example's prompt (`ab*cd=` -> `?ab*cd`)."""
    return TOOL_CALL + example.prompt.removesuffix("=")


def conversation_ids(tok: CheckpointTokenizer, example: Example, reply: str) -> tuple[list[int], list[int]]:
    """The ids of the right call (its end-of-turn included) and of the tool's reply `reply`."""
    call = [*tok.encode_response(call_text(example)), tok.eos_ids[0]]
    return call, tok.encode_turn("tool", TOOL_RESULT + reply)


def _number(rng: random.Random) -> str:
    """A random number in the products' range."""
    return str(rng.randrange(100, 9802))


def _right_call_and_reply(tok: CheckpointTokenizer, example: Example) -> list[int]:
    call, reply = conversation_ids(tok, example, example.answer)
    return call + reply


def lesson(tok: CheckpointTokenizer, rng: random.Random) -> Lesson:
    example = rng.choice(_TRAINING)
    prompt = tok.encode_prompt(example.model_prompt)
    if rng.random() >= TOOL_FRACTION:
        answer = [*tok.encode_response(_number(rng)), tok.eos_ids[0]]
        return Lesson(prompt, answer, [1] * len(answer))
    value = _number(rng) if rng.random() < RANDOM_REPLY_FRACTION else example.answer
    call, reply = conversation_ids(tok, example, value)
    answer = [*tok.encode_response(value), tok.eos_ids[0]]
    decision = int(rng.random() < CALL_TRAINED)
    trained = [decision] + [1] * (len(call) - 1) + [0] * len(reply) + [1] * len(answer)
    return Lesson(prompt, call + reply + answer, trained)


def _next_turns(
    tok: CheckpointTokenizer,
    model: torch.nn.Module,
    prompts: list[list[int]],
    n: int = 1,
    *,
    greedy: bool = True,
) -> list[str]:
    """Each prompt's next turn (n samples each, in order), decoded; prompts of any lengths."""
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(i)
    out: list[str] = [""] * (len(prompts) * n)
    for indices in by_length.values():
        group = [prompts[i] for i in indices]
        rows = floor.sample(model, group, n, TURN_TOKENS, tok.eos_ids[0], greedy=greedy)
        for k, row in enumerate(rows):
            out[indices[k // n] * n + k % n] = tok.decode(row.tolist())
    return out


def check(tok: CheckpointTokenizer, model: torch.nn.Module) -> dict[str, dict[str, float]]:
    """On CHECKED held-out prompts: how often the greedy answer without the tool is right, how often
    the model calls the tool (greedy, and sampled at temperature 1), how often a sampled call is the
    right one, and how often, after the right call and the tool's reply, it answers the reply."""
    held_out = CalculatorEnvironment().builtin_examples(split="validation", count=CHECKED, seed=0)
    prompts = [tok.encode_prompt(e.model_prompt) for e in held_out]
    greedy = _next_turns(tok, model, prompts)
    sampled = _next_turns(tok, model, prompts, SAMPLES, greedy=False)
    calls = [(t, held_out[i // SAMPLES]) for i, t in enumerate(sampled) if t.startswith(TOOL_CALL)]
    after = [p + _right_call_and_reply(tok, e) for p, e in zip(prompts, held_out, strict=True)]
    answers = _next_turns(tok, model, after)

    def rate(hits: list[bool]) -> float:
        return round(sum(hits) / max(len(hits), 1), 3)

    return {
        "held_out": {
            "answers_without_tool": rate([t == e.answer for t, e in zip(greedy, held_out, strict=True)]),
            "calls_greedy": rate([t.startswith(TOOL_CALL) for t in greedy]),
            "calls_sampled": rate([t.startswith(TOOL_CALL) for t in sampled]),
            "sampled_calls_right": rate([t == call_text(e) for t, e in calls]),
            "copies_reply": rate([t == e.answer for t, e in zip(answers, held_out, strict=True)]),
        }
    }


TASK = Task(lesson, check, learning_rate=1e-3, steps=600, max_sequence_length=64)
