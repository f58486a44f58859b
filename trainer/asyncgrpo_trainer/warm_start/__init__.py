"""`asyncgrpo make-tiny-checkpoint --warm-start TASK`: a tiny checkpoint that already knows something.

Real RL starts from a pretrained model. A tiny random checkpoint answers nothing right, so every
GRPO advantage is zero and nothing trains. So the checkpoint is first taught by supervised
fine-tuning, in a job's prompt format (the chat template), something that gives GRPO a signal
without solving the RL task for it. What is taught is a task's lessons (`Task`):

- `reverse` (`reversal`): reversing 3- and 5-digit strings; the RL task is 4 digits, never seen.
- `calculator` (`calculator`): conversations with the calculator tool, which the policy calls in
  a small fraction of lessons; the rest answer the product directly, which a tiny model cannot do.

The loss is the policy's own token log-probs (`sampling.token_logprobs`) over a lesson's trained
tokens (a tool's reply is context, not trained). The task's check measures what the caller must
know about the result (that the RL task is not solved yet, and that what was taught was learned),
and is returned.

It runs on THREADS torch threads, whatever the machine has: the result of a seed depends on the
thread count (the order of float sums), and 2 threads is what the examples' figures were measured
with. It reports progress on `log` (the CLI: stderr), since it takes one to several minutes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.models import hf, recipe
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

BATCH = 64
CPU = torch.device("cpu")
THREADS = 2
REPORTS = 10
"""Progress lines per run (and one for the check)."""


@dataclass(frozen=True)
class Lesson:
    """One supervised example: the prompt, the response and which response tokens are trained."""

    prompt_ids: list[int]
    response_ids: list[int]
    trained: list[int]
    """1 on the policy's tokens, 0 on tokens the policy does not write (a tool's reply)."""


@dataclass(frozen=True)
class Task:
    """What a warm start teaches, and how its result is checked."""

    lessons: Callable[[CheckpointTokenizer, random.Random], Lesson]
    check: Callable[[CheckpointTokenizer, torch.nn.Module], Mapping[str, Any]]
    learning_rate: float
    steps: int
    """The default number of steps of BATCH lessons."""
    max_sequence_length: int


def tasks() -> dict[str, Task]:
    """The tasks by name (imported here: each module imports this one for `Lesson`)."""
    from asyncgrpo_trainer.warm_start import calculator, reversal  # noqa: PLC0415

    return {"reverse": reversal.TASK, "calculator": calculator.TASK}


def warm_start(
    directory: str | Path,
    task: str = "reverse",
    *,
    steps: int | None = None,
    seed: int = 0,
    log: TextIO | None = None,
) -> Mapping[str, Any]:
    """Fine-tune the checkpoint in `directory` on `task`'s lessons and write it back in place;
    returns the task's check of the result."""
    chosen = _task(task)
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _warm_start(Path(directory), chosen, chosen.steps if steps is None else steps, seed, log)
    finally:
        torch.set_num_threads(threads)


def check(directory: str | Path, task: str) -> Mapping[str, Any]:
    """`task`'s check of the checkpoint in `directory` (what a warm start returns), e.g. of one that
    GRPO has trained since."""
    chosen = _task(task)
    build, tok = _load(Path(directory), chosen, seed=0)
    with torch.no_grad():
        return chosen.check(tok, build.instantiate().eval())


def _task(name: str) -> Task:
    known = tasks()
    if name not in known:
        raise ValueError(f"warm start task {name!r}: choose one of {sorted(known)}")
    return known[name]


def _load(directory: Path, task: Task, *, seed: int) -> tuple[recipe.ModelBuild, CheckpointTokenizer]:
    return recipe.pretrained_build(
        str(directory),
        max_sequence_length=task.max_sequence_length,
        dtype="float32",
        seed=seed,
        chat_template=None,
        system_prompt=None,
    )


def _warm_start(directory: Path, task: Task, steps: int, seed: int, log: TextIO | None) -> Mapping[str, Any]:
    build, tok = _load(directory, task, seed=seed)
    model = build.instantiate().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.learning_rate)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    start = time.monotonic()
    for step in range(1, steps + 1):
        lessons = [task.lessons(tok, rng) for _ in range(BATCH)]
        rows = [(lesson.prompt_ids, lesson.response_ids) for lesson in lessons]
        logp, mask = sampling.token_logprobs(model, rows, pad_id=tok.pad_id, device=CPU, grad=True)
        trained = torch.zeros_like(mask)
        for i, lesson in enumerate(lessons):
            trained[i, : len(lesson.trained)] = torch.tensor(lesson.trained, dtype=mask.dtype)
        loss = -(logp * trained).sum() / trained.sum()
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
        print("warm start: checking what it learned ...", file=log, flush=True)
    with torch.no_grad():
        result = task.check(tok, model)
    hf.save(model.state_dict(), build.config, directory, source_dir=directory, dtype=torch.float32)
    return result
