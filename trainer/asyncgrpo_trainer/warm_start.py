"""`asyncgrpo make-tiny-checkpoint --warm-start`: a tiny checkpoint that already knows a related task.

Real RL starts from a pretrained model. A tiny random Qwen2 (RoPE, BPE tokenizer) barely moves on
4-digit reversal under GRPO from scratch (measured: exact accuracy 0.00 after 150 steps of 32 x 8),
and a random checkpoint answers no reversal right, so every GRPO advantage is zero and nothing
trains. So the checkpoint is first taught a related but different task by supervised fine-tuning:
reversing 3- and 5-digit strings, in a job's prompt format (the chat template, `ddd=`). Such a model
answers a 4-digit prompt wrongly (it has never seen one), so it starts the RL task of
docs/examples/pretrained-cpu.yaml near accuracy 0, and GRPO has to teach it the rest. The
accuracies on the taught lengths and on 4 digits are measured and returned, so the caller can check
both facts. The loss is the policy's own token log-probs (`sampling.token_logprobs`), the check the
floor's greedy batch decode (`floor.sample`).

It runs on THREADS torch threads, whatever the machine has: the result of a seed depends on the
thread count (the order of float sums), and 2 threads is what the example's figures were measured
with. It reports progress on `log` (the CLI: stderr), since it takes one to several minutes.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TextIO

import torch

from asyncgrpo_trainer import floor
from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.models import hf, recipe
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

RL_TASK_DIGITS = 4
"""The reversal length of the example's RL task: never taught here."""
BATCH = 64
LEARNING_RATE = 3e-3
SAMPLES = 100
"""Random strings per length in the accuracy check."""
CPU = torch.device("cpu")
THREADS = 2
REPORTS = 10
"""Progress lines per run (and one for the accuracy check)."""


def _digits(rng: random.Random, n: int) -> str:
    return f"{rng.randrange(10**n):0{n}d}"


def reversal_accuracy(tok: CheckpointTokenizer, model: torch.nn.Module, digits: int) -> float:
    """Greedy exact-match accuracy on SAMPLES random `digits`-long strings."""
    rng = random.Random(1234 + digits)
    texts = [_digits(rng, digits) for _ in range(SAMPLES)]
    prompts = [tok.encode_prompt(f"{text}=") for text in texts]
    answers = floor.sample(model, prompts, 1, digits + 2, tok.eos_ids[0], greedy=True)
    return sum(tok.decode(a.tolist()) == t[::-1] for t, a in zip(texts, answers, strict=True)) / SAMPLES


def warm_start(
    directory: str | Path,
    *,
    steps: int = 600,
    lengths: tuple[int, ...] = (3, 5),
    seed: int = 0,
    log: TextIO | None = None,
) -> dict[int, float]:
    """Fine-tune the checkpoint in `directory` on reversing `lengths`-digit strings and write it back
    in place; returns the greedy exact accuracy per length, RL_TASK_DIGITS included."""
    if RL_TASK_DIGITS in lengths:
        raise ValueError(f"lengths {lengths}: {RL_TASK_DIGITS} digits is the RL task, keep it unseen")
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _warm_start(Path(directory), steps, lengths, seed, log)
    finally:
        torch.set_num_threads(threads)


def _warm_start(
    directory: Path, steps: int, lengths: tuple[int, ...], seed: int, log: TextIO | None
) -> dict[int, float]:
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
    start = time.monotonic()
    for step in range(1, steps + 1):
        texts = [_digits(rng, rng.choice(lengths)) for _ in range(BATCH)]
        rows = [(tok.encode_prompt(f"{t}="), [*tok.encode_response(t[::-1]), tok.eos_ids[0]]) for t in texts]
        logp, mask = sampling.token_logprobs(model, rows, pad_id=tok.pad_id, device=CPU, grad=True)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if log is not None and (step % max(steps // REPORTS, 1) == 0 or step == steps):
            elapsed = time.monotonic() - start
            left = elapsed / step * (steps - step)
            print(
                f"warm start: step {step}/{steps}, loss {loss.item():.3f}, "
                f"{elapsed:.0f} s so far, about {left:.0f} s left",
                file=log,
                flush=True,
            )
    model.eval()
    if log is not None:
        print(f"warm start: greedy accuracy on {SAMPLES} strings per length ...", file=log, flush=True)
    accuracy = {n: reversal_accuracy(tok, model, n) for n in (*lengths, RL_TASK_DIGITS)}
    hf.save(model.state_dict(), build.config, directory, source_dir=directory, dtype=torch.float32)
    return accuracy
