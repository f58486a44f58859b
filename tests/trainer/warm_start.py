"""A tiny "pretrained" checkpoint for the learning tests of the pretrained path: warm-started, not random.

Real RL starts from a pretrained model. A 2-layer random Qwen2 (RoPE, BPE tokenizer) barely moves
on 4-digit reversal under GRPO from scratch (measured outside the project: exact accuracy 0.00
after 150 steps of 32 x 8), so the fixture first teaches a related but different task by supervised
fine-tuning: reversing 3-digit strings, in the job's own prompt format (the chat template,
`ddd=`). Such a model answers a 4-digit prompt with three reversed digits and stops, so it starts
the RL task (4 digits) at an exact-match accuracy near 0; GRPO must teach it the fourth position
and where to stop. `warm_started` checks both facts before handing the checkpoint out.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.models import hf, recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer


def _example(tok: CheckpointTokenizer, digits: int, rng: random.Random) -> tuple[list[int], list[int]]:
    text = f"{rng.randrange(10**digits):0{digits}d}"
    answer = tok._tok(text[::-1], add_special_tokens=False)["input_ids"]
    return tok.encode_prompt(f"{text}="), [*answer, tok.eos_ids[0]]


def exact_accuracy(
    build: recipe.ModelBuild, tok: CheckpointTokenizer, model: torch.nn.Module, digits: int
) -> float:
    """Greedy exact-match accuracy on 100 random `digits`-long strings (the model's own forward)."""
    rng = random.Random(1234 + digits)
    right = 0
    with torch.no_grad():
        for _ in range(100):
            text = f"{rng.randrange(10**digits):0{digits}d}"
            ids = tok.encode_prompt(f"{text}=")
            out: list[int] = []
            for _ in range(digits + 2):
                logits, _ = model(torch.tensor([ids + out]))
                out.append(int(logits[0, -1].argmax()))
                if out[-1] in build.eos_ids:
                    break
            right += tok.decode(out) == text[::-1]
    return right / 100


def warm_started(
    directory: Path,
    *,
    steps: int = 400,
    family: str = "qwen2",
    lengths: tuple[int, ...] = (3,),
    hidden_size: int = 64,
    num_layers: int = 2,
) -> Path:
    """Write the warm-started checkpoint to `directory` (see the module docstring); its path."""
    source = make_tiny_checkpoint(
        directory / "random",
        family=family,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=hidden_size // 32,
        intermediate_size=4 * hidden_size,
        seed=0,
    )
    build, tok = recipe.pretrained_build(
        str(source), max_sequence_length=64, dtype="float32", seed=0, chat_template=None, system_prompt=None
    )
    model = build.instantiate().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(steps):
        batch = [_example(tok, rng.choice(lengths), rng) for _ in range(64)]
        length = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), length), tok.pad_id)
        labels = torch.full((len(batch), length), -100)
        for i, (p, a) in enumerate(batch):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        logits, _ = model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    taught = {n: exact_accuracy(build, tok, model, n) for n in lengths}
    four = exact_accuracy(build, tok, model, 4)
    print("warm start accuracy", taught, "4 digits", four)
    assert min(taught.values()) >= 0.9 and four < 0.1, f"warm start: {taught}, 4 digits {four}"
    out = directory / "warm"
    state = {k: v for k, v in model.state_dict().items()}
    return hf.save(state, build.config, out, source_dir=source, dtype=torch.float32)
