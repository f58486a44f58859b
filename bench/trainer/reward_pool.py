"""Scoring a step's groups: one Ray call per group against the reward pool's batches.

The controller asks for one group's scores at a time; the groups of a decoded batch finish together.
`rewards.RewardPool` sends the groups asked for together in one call per actor (up to
`MAX_BATCH_GROUPS`). This times waves of `--groups` groups of `--generations` responses on the
shipped reversal task, alternating the two ways in one run against the same actor: each group as a
call of its own to `RewardActor.score` (what the pool did before), and the pool's `score`. It prints
the median wave time of each and their ratio.

    python bench/trainer/reward_pool.py --waves 40 --groups 32 --generations 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable

import ray

from asyncgrpo_trainer import rewards
from asyncgrpo_trainer.envs.base import Example, Score

Wave = list[tuple[Example, list[str]]]


def waves(count: int, groups: int, generations: int, seed: int) -> list[Wave]:
    """Reversal prompts, each group with about half its responses right."""
    rng = random.Random(seed)
    out: list[Wave] = []
    for _ in range(count):
        wave: Wave = []
        for _ in range(groups):
            digits = "".join(rng.choice("0123456789") for _ in range(4))
            answers = [digits[::-1] if rng.random() < 0.5 else digits for _ in range(generations)]
            wave.append((Example(f"{digits}=", digits[::-1]), answers))
        out.append(wave)
    return out


async def timed(wave: Wave, score: Callable[[Example, list[str]], Awaitable[list[Score]]]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(score(example, answers) for example, answers in wave))
    return time.perf_counter() - t0


async def compare(pool: rewards.RewardPool, all_waves: list[Wave]) -> dict[str, float]:
    actor = pool.actors[0]

    async def per_group(example: Example, answers: list[str]) -> list[Score]:
        scores: list[Score] = await actor.score.remote(example, answers, [True] * len(answers))
        return scores

    async def pooled(example: Example, answers: list[str]) -> list[Score]:
        return await pool.score(example, answers, [True] * len(answers))

    single: list[float] = []
    batched: list[float] = []
    for wave in all_waves:  # alternating, so that a slow spell of the machine hits both
        single.append(await timed(wave, per_group))
        batched.append(await timed(wave, pooled))
    one, many = statistics.median(single), statistics.median(batched)
    return {"per_group_call_ms": 1e3 * one, "pool_batches_ms": 1e3 * many, "speedup": one / many}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=40)
    parser.add_argument("--groups", type=int, default=32, help="groups a wave (prompts a step)")
    parser.add_argument("--generations", type=int, default=8, help="responses a group")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    pool = rewards.RewardPool("reverse", None, 1, 30)
    ray.get(pool.ready())
    result = asyncio.run(compare(pool, waves(args.waves, args.groups, args.generations, args.seed)))
    print(json.dumps({"waves": args.waves, "groups": args.groups, "generations": args.generations, **result}))


if __name__ == "__main__":
    main()
