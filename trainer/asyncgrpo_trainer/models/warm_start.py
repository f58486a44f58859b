"""`asyncgrpo make-tiny-checkpoint --warm-start`: a tiny checkpoint that already knows a related task.

Real RL starts from a pretrained model. A tiny random Qwen2 (RoPE, BPE tokenizer) barely moves on
4-digit reversal under GRPO from scratch (measured: exact accuracy 0.00 after 150 steps of 32 x 8),
and a random checkpoint answers no reversal right, so every GRPO advantage is zero and nothing
trains. So the checkpoint is first taught a related but different task by supervised fine-tuning:
reversing 3- and 5-digit strings, in a job's prompt format (the chat template, `ddd=`). Such a model
answers a 4-digit prompt wrongly (it has never seen one), so it starts the RL task of
docs/examples/pretrained-cpu.yaml near accuracy 0, and GRPO has to teach it the rest. The
accuracies on the taught lengths and on 4 digits are measured and returned, so the caller can check
both facts.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.models import hf, recipe
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

RL_TASK_DIGITS = 4
"""The reversal length of the example's RL task: never taught here."""
BATCH = 64
LEARNING_RATE = 3e-3
SAMPLES = 100
"""Random strings per length in the accuracy check."""


def _example(tok: CheckpointTokenizer, digits: int, rng: random.Random) -> tuple[list[int], list[int]]:
    text = f"{rng.randrange(10**digits):0{digits}d}"
    return tok.encode_prompt(f"{text}="), [*tok.encode_response(text[::-1]), tok.eos_ids[0]]


def reversal_accuracy(
    build: recipe.ModelBuild, tok: CheckpointTokenizer, model: torch.nn.Module, digits: int
) -> float:
    """Greedy exact-match accuracy on SAMPLES random `digits`-long strings (the model's own forward)."""
    rng = random.Random(1234 + digits)
    right = 0
    with torch.no_grad():
        for _ in range(SAMPLES):
            text = f"{rng.randrange(10**digits):0{digits}d}"
            ids = tok.encode_prompt(f"{text}=")
            out: list[int] = []
            for _ in range(digits + 2):
                logits, _ = model(torch.tensor([ids + out]))
                out.append(int(logits[0, -1].argmax()))
                if out[-1] in build.eos_ids:
                    break
            right += tok.decode(out) == text[::-1]
    return right / SAMPLES


def warm_start(
    directory: str | Path, *, steps: int = 600, lengths: tuple[int, ...] = (3, 5), seed: int = 0
) -> dict[int, float]:
    """Fine-tune the checkpoint in `directory` on reversing `lengths`-digit strings and write it back
    in place; returns the greedy exact accuracy per length, RL_TASK_DIGITS included."""
    if RL_TASK_DIGITS in lengths:
        raise ValueError(f"lengths {lengths}: {RL_TASK_DIGITS} digits is the RL task, keep it unseen")
    build, tok = recipe.pretrained_build(
        str(directory),
        max_sequence_length=64,
        dtype="float32",
        seed=seed,
        chat_template=None,
        system_prompt=None,
    )
    model = build.instantiate().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(steps):
        batch = [_example(tok, rng.choice(lengths), rng) for _ in range(BATCH)]
        length = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), length), tok.pad_id)
        labels = torch.full((len(batch), length), -100)
        for i, (p, a) in enumerate(batch):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        logits, _ = model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    model.eval()
    accuracy = {n: reversal_accuracy(build, tok, model, n) for n in (*lengths, RL_TASK_DIGITS)}
    hf.save(model.state_dict(), build.config, directory, source_dir=directory, dtype=torch.float32)
    return accuracy
