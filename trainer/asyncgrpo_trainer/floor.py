"""The floor: GRPO as a plain single-process torch loop, the yardstick of the trainer's throughput.

Sample P x N responses in one batch with a KV cache, score them with the environment, take
group-relative advantages, one optimizer step, repeat: no Ray, no actors, no weight sync, no
importance weights (the data is always on-policy). It trains the same model (the job's tiny model,
same init seed), task, P x N, learning rate, advantages and gradient clipping as a sync job, so
`bench --floor` can put its samples/s and its steps to an accuracy next to the trainer's modes
measured in the same run (docs/benchmarks.md). It is deliberately small: what it does not do is
what the trainer's extra machinery costs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer import envs
from asyncgrpo_trainer.algorithms import advantages
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tokenizer import CharTokenizer


@dataclass(frozen=True)
class FloorConfig:
    prompts: int
    generations: int
    max_new_tokens: int
    learning_rate: float
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    seed: int = 1


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    n: int,
    new: int,
    eos: int,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
) -> torch.Tensor:
    """(len(prompts) * n, new) sampled token ids, eos-padded after each row's first eos. The
    prompts of one batch have one length (the shipped task's do)."""
    ids = torch.tensor(prompts).repeat_interleave(n, 0)
    logits, cache = model(ids, None)
    out, done = [], torch.zeros(len(ids), dtype=torch.bool)
    for _ in range(new):
        last = logits[:, -1].float() / temperature
        tok = last.argmax(-1) if greedy else torch.multinomial(F.softmax(last, -1), 1).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        out.append(tok)
        done |= tok == eos
        if done.all():
            break
        logits, cache = model(tok[:, None], cache)
    return torch.stack(out, 1)


def run(
    build: ModelBuild,
    cfg: FloorConfig,
    *,
    steps: int,
    env_name: str = "reverse",
    validate_every: int = 0,
    num_validation: int = 200,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train for `steps`; per-step records (reward, accuracy, held-out greedy accuracy every
    `validate_every` steps) and the trained samples per second (validation time excluded)."""
    env = envs.build(env_name)
    tok = CharTokenizer(env.alphabet)
    model = build.instantiate().train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    train = env.builtin_examples(split="train", count=4096, seed=cfg.seed)
    held_out = env.builtin_examples(split="validation", count=num_validation, seed=cfg.seed)
    rng, eos, records, busy = random.Random(cfg.seed), tok.eos_id, [], 0.0
    torch.manual_seed(cfg.seed)
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        batch = rng.sample(train, cfg.prompts)
        prompts = [tok.encode_prompt(e.prompt) for e in batch]
        resp = sample(model, prompts, cfg.generations, cfg.max_new_tokens, eos, temperature=cfg.temperature)
        finished = (resp == eos).any(1)
        examples = [e for e in batch for _ in range(cfg.generations)]
        scores = [
            env.score(e, tok.decode(r.tolist()), finished=bool(f))
            for e, r, f in zip(examples, resp, finished, strict=True)
        ]
        rewards = torch.tensor([s.reward for s in scores]).view(cfg.prompts, cfg.generations)
        adv = advantages.group_relative(rewards, leave_one_out=True, normalize=True).view(-1, 1)
        # Response tokens up to and including the first eos.
        first = torch.where(resp == eos, torch.arange(resp.shape[1]), resp.shape[1]).min(1).values
        mask = (torch.arange(resp.shape[1])[None] <= first[:, None]).float()
        ids = torch.cat([torch.tensor(prompts).repeat_interleave(cfg.generations, 0), resp], 1)
        logits, _ = model(ids[:, :-1], None)
        logp = F.log_softmax(logits[:, len(prompts[0]) - 1 :].float() / cfg.temperature, -1)
        logp = logp.gather(-1, resp[..., None]).squeeze(-1)
        loss = -(logp * adv * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        busy += time.perf_counter() - t0
        record: dict[str, Any] = {
            "step": step,
            "samples_trained": step * cfg.prompts * cfg.generations,
            "reward_mean": float(rewards.mean()),
            "accuracy": sum(s.correct for s in scores) / len(scores),
            "step_seconds": time.perf_counter() - t0,
        }
        if validate_every and (step % validate_every == 0 or step == steps):
            record["validation_accuracy"] = validate(model, env, tok, held_out, cfg.max_new_tokens)
        records.append(record)
        if on_step is not None:
            on_step(record)
    return {"records": records, "samples_per_second": steps * cfg.prompts * cfg.generations / busy}


def validate(
    model: torch.nn.Module, env: envs.Environment, tok: CharTokenizer, held_out: list[Any], new: int
) -> float:
    """Greedy exact-match accuracy on the held-out examples."""
    resp = sample(model, [tok.encode_prompt(e.prompt) for e in held_out], 1, new, tok.eos_id, greedy=True)
    finished = (resp == tok.eos_id).any(1)
    return sum(
        env.score(e, tok.decode(r.tolist()), finished=bool(f)).correct
        for e, r, f in zip(held_out, resp, finished, strict=True)
    ) / len(held_out)
