"""A tiny judge checkpoint whose verdict depends on its input in a known way, for the reward-model tests.

A random tiny Qwen2 (`make_tiny_checkpoint`) is fine-tuned with plain torch on CPU to answer "1"
when the response it reads equals the reference answer and "0" otherwise, in the layout of
TEMPLATE (reference and response at a fixed distance, so one comparison per digit position) and
without a chat template. Wrong responses are random 4-digit strings. Half of the lessons are a
side task that makes the comparisons explicit: after `#` instead of `=`, one mark per digit
position (1 where the response's digit is the reference's), on wrong answers that differ in one
digit half of the time. Equality is learnt slowly by so small a model: measured after 1000 steps
of 64 lessons, every right answer was judged 1, and 77% of random wrong ones 0 without the side
task, 83% with it (on a loaded 2-core machine, 2 threads). Strings that `held_out` picks
(one in 13, spread over all of them) are never a reference it is taught on, so they show whether the
reward model's rewards separate right from wrong answers beyond what it saw.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from pathlib import Path

import torch
import transformers

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.models import hf, recipe, tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from tests.cluster.config import cache_root

TEMPLATE = "{reference}|{response}="
"""rewardModel.template of the tests (and of the guide's example job)."""
STEPS = 1000
BATCH = 64
LEARNING_RATE = 1e-3
THREADS = 2
MAX_POSITIONS = 64


def digits(rng: random.Random) -> str:
    return f"{rng.randrange(10**4):04d}"


def held_out(text: str) -> bool:
    """Whether a 4-digit string is kept out of the judge's lessons (a fixed 1 in 13 of them)."""
    return int(text) * 7919 % 13 == 0


def held_out_strings(count: int) -> list[str]:
    rng = random.Random(1234)
    found: list[str] = []
    while len(found) < count:
        if held_out(text := digits(rng)) and text not in found:
            found.append(text)
    return found


def wrong_answer(rng: random.Random, reference: str) -> str:
    """A random 4-digit string that is not `reference`."""
    while (answer := digits(rng)) == reference:
        pass
    return answer


def _lesson(rng: random.Random, tok: CheckpointTokenizer) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of one lesson (module docstring)."""
    while held_out(reference := digits(rng)):
        pass
    right = rng.random() < 0.5
    response = reference if right else wrong_answer(rng, reference)
    text = TEMPLATE.replace("{reference}", reference).replace("{response}", response)
    if rng.random() < 0.5:
        return tok.encode_prompt(text), [*tok.encode_response("1" if right else "0"), tok.eos_ids[0]]
    if not right and rng.random() < 0.5:
        n = rng.randrange(4)
        response = reference[:n] + str((int(reference[n]) + rng.randrange(1, 10)) % 10) + reference[n + 1 :]
    marks = "".join("1" if a == b else "0" for a, b in zip(reference, response, strict=True))
    text = TEMPLATE.replace("{reference}", reference).replace("{response}", response)
    return tok.encode_prompt(text.removesuffix("=") + "#"), [*tok.encode_response(marks), tok.eos_ids[0]]


def teach_judge(directory: Path, *, seed: int = 0) -> Path:
    """A judge checkpoint in `directory` (module docstring)."""
    tiny_checkpoint.make_tiny_checkpoint(
        directory, hidden_size=64, num_layers=2, num_heads=2, max_positions=MAX_POSITIONS
    )
    build, tok = recipe.pretrained_build(
        str(directory),
        max_sequence_length=MAX_POSITIONS,
        dtype="float32",
        seed=seed,
        chat_template=False,
        system_prompt=None,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        model = build.instantiate().train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        rng = random.Random(seed)
        torch.manual_seed(seed)
        for _ in range(STEPS):
            rows = [_lesson(rng, tok) for _ in range(BATCH)]
            logp, mask = sampling.token_logprobs(
                model, rows, pad_id=tok.pad_id, device=torch.device("cpu"), grad=True
            )
            loss = -(logp * mask).sum() / mask.sum()
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    hf.save(model.state_dict(), build.config, directory, source_dir=directory, dtype=torch.float32)
    return directory


def recipe_key() -> str:
    """What the taught judge depends on: this module's lessons and hyperparameters, the code that
    makes, trains and saves the checkpoint, and the torch and transformers versions."""
    sources = [Path(__file__), *(Path(m.__file__ or "") for m in (hf, recipe, sampling, tiny_checkpoint))]
    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def cached_judge() -> Path:
    """The taught judge from the suite's cache (<ASYNCGRPO_CACHE or ~/.cache/asyncgrpo>/judge/KEY),
    taught and stored there when missing.

    Why: teaching takes 1000 steps, a minute on a quiet machine but 8.5 minutes in a CI run beside
    the operator's half (the longest trainer test of 2026-12-07's run). The checkpoint is a
    fixture, not a claim: the tests prove what a reward model does with it, and a change to how it
    is taught, made or saved changes its key (`recipe_key`), so it is taught again."""
    target = cache_root().parent / "judge" / recipe_key()
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".teaching-", dir=target.parent))
        teach_judge(staging)
        try:
            staging.rename(target)  # whole or not at all: a run killed mid-teaching leaves no half
        except OSError:  # another run stored it first
            shutil.rmtree(staging, ignore_errors=True)
    return target
