"""A tiny checkpoint that knows how to call the calculator, but not for the RL task's shape.

Real RL starts from a pretrained model (`warm_start` says why for the reversal task). The tool
learning test's checkpoint is taught, by supervised fine-tuning on whole conversations (the policy's
tokens only, as RL trains them), two related lessons:

conversations with the calculator for addition and subtraction of two 2-digit numbers and for
multiplication of a 1-digit and a 2-digit number: `?37+58`, the tool's `>95`, then `95`. So it
knows the tool's syntax and how to copy a result, as the reversal checkpoint knows reversing 3 and 5
digits. The RL task, two 2-digit numbers multiplied (`37*58=`), is a shape it was never shown, and
without the tool it cannot be done: GRPO has to teach it to write the whole call.

UNVERIFIED: a first recipe (multiplication answered directly in the lessons) left the model
calling the tool on no `*` prompt at temperature 1 after 300 steps, so RL had nothing to learn
from; this one has not been measured yet (see the branch's report).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.models import hf, recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

CPU = torch.device("cpu")
BATCH = 64
LEARNING_RATE = 3e-3


def conversation(
    tok: CheckpointTokenizer, prompt: str, turns: list[tuple[str, str]]
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, loss mask) of a conversation of (role, text) turns, encoded as the
    rollout encodes one (`conversation`): a policy turn is its text and the end-of-turn token, a
    tool turn `Tokenizer.encode_turn`."""
    end = tok.encode_response(str(tok._tok.eos_token))
    response: list[int] = []
    mask: list[int] = []
    for role, text in turns:
        ids = [*tok.encode_response(text), *end] if role == "assistant" else tok.encode_turn(role, text)
        response += ids
        mask += [int(role == "assistant")] * len(ids)
    return tok.encode_prompt(prompt), response, mask


def lesson(tok: CheckpointTokenizer, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    """One conversation with the calculator: two 2-digit numbers added or subtracted, or a 1-digit
    and a 2-digit number multiplied (never two 2-digit numbers: the RL task)."""
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randrange(2, 10), rng.randrange(10, 100)
        a, b = (b, a) if rng.random() < 0.5 else (a, b)
    else:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
    value = a + b if op == "+" else a - b if op == "-" else a * b
    turns = [("assistant", f"?{a}{op}{b}"), ("tool", f">{value}"), ("assistant", str(value))]
    return conversation(tok, f"{a}{op}{b}=", turns)


def make(directory: Path, *, steps: int, seed: int) -> Path:
    """A tiny Qwen2 checkpoint in `directory`, fine-tuned on the lessons for `steps` steps."""
    make_tiny_checkpoint(directory, seed=seed)
    build, tok = recipe.pretrained_build(
        str(directory),
        max_sequence_length=64,
        dtype="float32",
        seed=seed,
        chat_template=None,
        system_prompt=None,
    )
    assert isinstance(tok, CheckpointTokenizer)
    model = build.instantiate().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(steps):
        batch = [lesson(tok, rng) for _ in range(BATCH)]
        logp, mask = sampling.token_logprobs(
            model, [(p, r) for p, r, _ in batch], pad_id=tok.pad_id, device=CPU, grad=True
        )
        keep = torch.zeros_like(mask)
        for i, (_, _, m) in enumerate(batch):
            keep[i, : len(m)] = torch.tensor(m, dtype=keep.dtype)
        keep = keep * mask
        loss = -(logp * keep).sum() / keep.sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    hf.save(model.state_dict(), build.config, directory, source_dir=directory, dtype=torch.float32)
    return directory
