"""The generation side: the interface every engine implements, and the torch engine.

`GenerationWorker` is what the controller needs from an engine (vLLM plugs in behind it):
`generate` N samples of one prompt with per-token log-probs, `load_weights` of a new version, and
`reset_cache`. The torch engine decodes a group as one batch: the prompt is prefilled once (and
kept in a prefix cache keyed by its tokens), expanded to N rows, then decoded one token per step
with a KV cache. The Ray actor is async: each decode step yields to the actor's event loop, so
concurrent groups interleave and a weight update lands between two decode steps of an in-flight
group ("in-flight weight update"); the returned first/last versions tell the controller when that
happened. The prefix cache holds KV computed by old weights after an update unless it is reset,
which the controller does after every update in sync mode and per
recomputeKVCacheAfterWeightUpdates otherwise. Without a reset a cached prompt is reused for at
most `max_prefix_age` (= S) versions after it was computed and then prefilled again: a prompt set
that repeats would otherwise keep KV from the first weights forever, and samples would depend on
weights far older than the staleness bound the buffer enforces.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.model import KVCache, TinyCausalLM
from asyncgrpo_trainer.backends.modelspec import ModelBuild

PREFIX_CACHE_ENTRIES = 512


@dataclass(frozen=True)
class Generated:
    """N samples of one prompt: tokens, the log-prob of each sampled token, and whether it ended."""

    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    first_version: int
    last_version: int
    busy_seconds: float


class GenerationWorker(abc.ABC):
    """What the controller calls on a generation engine (torch here; vLLM in its own issue)."""

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated: ...

    @abc.abstractmethod
    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None: ...

    @abc.abstractmethod
    async def reset_cache(self) -> None: ...

    @abc.abstractmethod
    async def stats(self) -> dict[str, float]: ...


class TorchGenerationWorker(GenerationWorker):
    """The torch engine; wrapped in a Ray actor by `worker_groups` (see the module docstring)."""

    def __init__(
        self, build: ModelBuild, *, device: str, max_prefix_age: int = 0, num_threads: int = 1
    ) -> None:
        torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.build = build
        self.model: TinyCausalLM = build.instantiate().to(self.device).eval()
        self.version = -1
        self.eos_id = build.eos_id
        self.max_prefix_age = max_prefix_age
        self._prefix: OrderedDict[tuple[int, ...], tuple[KVCache, torch.Tensor, int]] = OrderedDict()
        self.busy_seconds = 0.0
        self.tokens_generated = 0
        self.prefix_hits = 0
        self.cache_resets = 0

    def _forward(self, ids: torch.Tensor, past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        logits, cache = self.model(ids, past)
        return logits, cache

    def _prefill(self, prompt_ids: list[int]) -> tuple[KVCache, torch.Tensor]:
        key = tuple(prompt_ids)
        hit = self._prefix.get(key)
        if hit is not None and self.version - hit[2] <= self.max_prefix_age:
            self._prefix.move_to_end(key)
            self.prefix_hits += 1
            return hit[0], hit[1]
        logits, cache = self._forward(torch.tensor([prompt_ids], device=self.device), None)
        self._prefix[key] = (cache, logits[:, -1], self.version)
        self._prefix.move_to_end(key)
        if len(self._prefix) > PREFIX_CACHE_ENTRIES:
            self._prefix.popitem(last=False)
        return cache, logits[:, -1]

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        first_version = self.version
        busy = 0.0
        t0 = time.perf_counter()
        with torch.no_grad():
            cache, last = self._prefill(prompt_ids)
            cache = sampling.expand_cache(cache, n)
            last = last.expand(n, -1)
            state = sampling.DecodeState(n, self.eos_id)
            budget = min(params.max_new_tokens, self.build.max_positions - len(prompt_ids))
            for _ in range(budget):
                last, cache = sampling.decode_step(
                    self._forward, last, cache, state, params=params, generator=gen
                )
                if state.all_done:
                    break
                busy += time.perf_counter() - t0
                await asyncio.sleep(0)  # let other groups and a weight update interleave
                t0 = time.perf_counter()
        busy += time.perf_counter() - t0
        self.busy_seconds += busy
        out = state.result()
        self.tokens_generated += sum(len(r) for r in out.response_ids)
        return Generated(out.response_ids, out.logprobs, out.finished, first_version, self.version, busy)

    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        self.model.load_state_dict(state)
        self.version = version
        self.busy_seconds += time.perf_counter() - t0

    async def reset_cache(self) -> None:
        self._prefix.clear()
        self.cache_resets += 1

    async def stats(self) -> dict[str, float]:
        return {
            "busy_seconds": self.busy_seconds,
            "tokens_generated": float(self.tokens_generated),
            "prefix_hits": float(self.prefix_hits),
            "cache_resets": float(self.cache_resets),
            "version": float(self.version),
        }
