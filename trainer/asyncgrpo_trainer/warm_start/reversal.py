"""The reversal warm start: reverse 3- and 5-digit strings (`ddd=` -> `ddd` reversed).

A tiny random Qwen2 (RoPE, BPE tokenizer) barely moves on 4-digit reversal under GRPO from scratch
(measured: exact accuracy 0.00 after 150 steps of 32 x 8). Taught the neighbouring lengths, it
answers a 4-digit prompt wrongly (it has never seen one), so it starts the RL task of
docs/examples/pretrained-cpu.yaml near accuracy 0, and GRPO has to teach it the rest. The check
is the greedy exact accuracy per length, the RL task's 4 digits included, with the floor's greedy
batch decode (`floor.sample`).
"""

from __future__ import annotations

import random

import torch

from asyncgrpo_trainer import floor
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from asyncgrpo_trainer.warm_start import Lesson, Task

RL_TASK_DIGITS = 4
"""The reversal length of the example's RL task: never taught here."""
TAUGHT_DIGITS = (3, 5)
SAMPLES = 100
"""Random strings per length in the check."""


def _digits(rng: random.Random, n: int) -> str:
    return f"{rng.randrange(10**n):0{n}d}"


def lesson(tok: CheckpointTokenizer, rng: random.Random) -> Lesson:
    text = _digits(rng, rng.choice(TAUGHT_DIGITS))
    response = [*tok.encode_response(text[::-1]), tok.eos_ids[0]]
    return Lesson(tok.encode_prompt(f"{text}="), response, [1] * len(response))


def accuracy(tok: CheckpointTokenizer, model: torch.nn.Module, digits: int) -> float:
    """Greedy exact-match accuracy on SAMPLES random `digits`-long strings."""
    rng = random.Random(1234 + digits)
    texts = [_digits(rng, digits) for _ in range(SAMPLES)]
    prompts = [tok.encode_prompt(f"{text}=") for text in texts]
    answers = floor.sample(model, prompts, 1, digits + 2, tok.eos_ids[0], greedy=True)
    return sum(tok.decode(a.tolist()) == t[::-1] for t, a in zip(texts, answers, strict=True)) / SAMPLES


def check(tok: CheckpointTokenizer, model: torch.nn.Module) -> dict[str, dict[int, float]]:
    return {"accuracy_by_digits": {n: accuracy(tok, model, n) for n in (*TAUGHT_DIGITS, RL_TASK_DIGITS)}}


TASK = Task(lesson, check, learning_rate=3e-3, steps=600, max_sequence_length=64)
