"""The generation side: the interface every engine implements, and the torch engine.

`GenerationWorker` is what the controller needs from an engine (vLLM plugs in behind it):
`generate` N samples of one prompt with per-token log-probs, `load_weights` of a new version, and
`reset_cache`. The torch engine has two decode paths, picked by `engine=` (the spec's
generation.torchDecode; auto: batched on CUDA, per-group on CPU):

- batched: concurrent `generate` calls are collected into one left-padded batch and decoded by
  `static_decode.StaticDecoder` (static KV cache; one CUDA graph per step on a GPU); see `batched`.
  A GPU decoding one group at a time is launch-bound (~2% of the decode bound). On a 2-core CPU it
  takes generation from 14.8-15.7 s to 2.6-2.9 s of an 80-step benchmark run (docs/benchmarks.md).
  No KV survives a batch.
- per-group: a group is one batch of its own; the prompt is prefilled once (and kept in a prefix
  cache keyed by its tokens), expanded to N rows, then decoded one token per step with the model's
  own KV cache. Why CPU keeps it by default: a group's samples depend only on its seed (see
  Determinism), so a CPU job (the demo, the tests, a recipe checked over seeds) repeats its
  learning curve run after run; batched, the curve also depends on how the groups happened to
  batch, and the tests' learning job from a low start ended anywhere from 0.0 to 1.0 held-out at
  step 60 over 7 runs (docs/benchmarks.md). The prefix cache holds KV computed by old weights
  after an update unless it is reset, which the controller does after every update in sync mode
  and per recomputeKVCacheAfterWeightUpdates otherwise. Without a reset a cached prompt is reused
  for at most `max_prefix_age` (= S) versions after it was computed and then prefilled again: a
  prompt set that repeats would otherwise keep KV from the first weights forever, and samples
  would depend on weights far older than the staleness bound the buffer enforces. The batched path
  also decodes this way a prompt that leaves less than maxNewTokens of maxSequenceLength.

The Ray actor is async and both paths yield to its event loop while decoding (per-group: every
token; batched: every `sync_every` steps), so a weight update lands between two steps of an
in-flight group ("in-flight weight update"); the returned first/last versions tell the controller
when that happened. Decode steps run under `weights_lock`, so a writer that holds it never
interleaves with one.

The staleness stamp: each sample also carries its oldest version, that of the oldest weights that
computed any KV or logits it was sampled from (`Generated.oldest_versions`). The per-group path's
is the version that prefilled its prompt, which is older than the first version when the prompt's
KV and first-token logits came from the prefix cache; the batched path prefills every batch, so a
sample's is the version its batch started with. The staleness gates measure a group by it, so a
cached prompt can never make data look younger than the weights that shaped it.

Determinism: per-group, a group's samples are a function of its prompt, n, params, seed and the
weights at each step (its own generator), whatever else runs concurrently. Batched, a batch is
seeded by its oldest group's seed and every row draws from one shared generator, so a group's
samples also depend on which groups share its batch and where its rows sit: per-group seeds do not
reproduce a group bit for bit, and a run repeats only if its requests batch the same way. Greedy
decoding does not depend on the seed; it can still differ in the last bits across batch shapes
(different kernels), which flips a token only at a near-tie.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import ray
import torch

from asyncgrpo_trainer.backends import ipc, sampling
from asyncgrpo_trainer.backends.batched import GroupBatcher, distribution
from asyncgrpo_trainer.backends.nccl_sync import BucketPlan, RefitGroup, RefitSpec
from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder
from asyncgrpo_trainer.models import lora
from asyncgrpo_trainer.models.network import CausalLM, KVCache
from asyncgrpo_trainer.models.recipe import ModelBuild

PREFIX_CACHE_ENTRIES = 512


@dataclass(frozen=True)
class Generated:
    """N samples of one prompt: tokens, the log-prob of each sampled token, and whether it ended."""

    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    oldest_versions: list[int]
    """Per sample, the staleness stamp: the oldest weight version that computed any KV or logits the
    sample was drawn from (a cached prefix's, when the engine reused one; see the module docstring)."""
    first_version: int
    """The engine's weight version at the group's first decode step."""
    last_version: int
    """The engine's weight version at its last decode step (> first_version after an in-flight
    weight update)."""
    busy_seconds: float


class EngineLostError(RuntimeError):
    """The engine behind a generation worker died (vLLM's engine process): an infrastructure
    failure that the operator retries from the last checkpoint, not a training error."""


class GenerationWorker(abc.ABC):
    """What the controller and the weight synchronizers call on a generation engine: the torch
    engine below and `vllm_engine.VLLMGenerationWorker` implement it, so the controller's rules
    (versions, aborts, cache resets) and the refit transports are the same for both."""

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated:
        """n samples of one prompt; cancelling the call aborts them."""

    @abc.abstractmethod
    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> float:
        """The object store's refit: `state` (network names) becomes weight `version`.

        Each refit returns the seconds generation was paused for it (no decode step ran): what
        the refit costs the engine, apart from the wall time of the whole transfer."""

    @abc.abstractmethod
    async def device_type(self) -> str: ...

    async def node_id(self) -> str:
        """The Ray node this engine runs on (an elastic fleet drains engines by their node's pod)."""
        node: str = ray.get_runtime_context().get_node_id()
        return node

    @abc.abstractmethod
    async def refit_members(self) -> int:
        """Ranks this engine takes in a broadcast refit group (its processes that receive)."""

    @abc.abstractmethod
    async def refit_join(self, spec: RefitSpec, rank: int) -> BucketPlan:
        """Join the broadcast refit group at `rank` (and the ranks after it, one per member)."""

    @abc.abstractmethod
    async def refit_receive(self, version: int) -> float:
        """Receive one broadcast refit as weight `version`; the seconds generation was paused."""

    @abc.abstractmethod
    async def load_ipc(self, handle: bytes, version: int) -> float:
        """A colocated refit: the CUDA IPC handle of the policy's weights on this engine's GPU
        (`ipc.SharedWeights`); the seconds generation was paused."""

    @abc.abstractmethod
    async def reset_cache(self) -> None: ...

    @abc.abstractmethod
    async def sleep(self) -> None:
        """Free the engine's memory while the policy trains (generation.sleepWhileTraining); the
        controller calls it only while nothing generates, and calls `wake` before the next refit or
        generation. The weights stay valid: what the engine generates after `wake` is what it would
        have generated without the sleep."""

    @abc.abstractmethod
    async def wake(self) -> None: ...

    @abc.abstractmethod
    async def stats(self) -> dict[str, float]: ...


Engine = Literal["auto", "batched", "per-group"]
"""The torch engine's decode path; auto: batched on CUDA, per-group on CPU (see the module docstring)."""


class TorchGenerationWorker(GenerationWorker):
    """The torch engine; wrapped in a Ray actor by `worker_groups` (see the module docstring).

    `self.model` is the live model both paths decode with: whoever changes its parameters in place
    calls `adopt_weights` after. `max_batch_rows` bounds a batched decode (its KV cache is
    allocated for that many rows at maxSequenceLength, once per sampling distribution).
    """

    def __init__(
        self,
        build: ModelBuild,
        *,
        device: str,
        max_prefix_age: int = 0,
        num_threads: int = 1,
        engine: Engine = "auto",
        max_batch_rows: int = 256,
        sync_every: int = 32,
        collect_seconds: float = 0.005,
    ) -> None:
        torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.build = build
        self.model: CausalLM = build.instantiate().to(self.device).eval()
        self.version = -1
        self.max_prefix_age = max_prefix_age
        self._prefix: OrderedDict[tuple[int, ...], tuple[KVCache, torch.Tensor, int]] = OrderedDict()
        self.weights_lock = asyncio.Lock()
        self.max_batch_rows, self.sync_every = max_batch_rows, sync_every
        self._decoders: dict[tuple[DecodeParams, int, tuple[int, ...]], StaticDecoder] = {}
        batched = engine == "batched" or (engine == "auto" and self.device.type == "cuda")
        self._batcher = (
            GroupBatcher(
                self._decoder,
                lambda: self.version,
                self.weights_lock,
                max_rows=max_batch_rows,
                collect_seconds=collect_seconds,
            )
            if batched
            else None
        )
        self._refit: RefitGroup | None = None
        self._ipc = ipc.OpenedWeights()
        self._base: dict[str, torch.Tensor] | None = None  # policy.lora: the adapted base weights
        self.busy_seconds = 0.0
        self.tokens_generated = 0
        self.prefix_hits = 0
        self.cache_resets = 0
        self.sleeps = 0

    def _budget(self, params: sampling.SamplingParams) -> int:
        """New tokens a batched decoder of these params reserves (a prompt needs at least one slot)."""
        return min(params.max_new_tokens, self.build.max_positions - 1)

    def _stop_ids(self, params: sampling.SamplingParams) -> tuple[int, ...]:
        """The tokens that end a row; none when the params ignore end-of-sequence."""
        return () if params.ignore_eos else self.build.eos_ids

    def _decoder(self, params: sampling.SamplingParams) -> StaticDecoder:
        """The batched decoder of this distribution, length and stop token, built on first use."""
        key = (distribution(params), self._budget(params), self._stop_ids(params))
        dec = self._decoders.get(key)
        if dec is None:
            dec = StaticDecoder(
                self.model,
                max_batch=self.max_batch_rows,
                max_prompt_len=self.build.max_positions - key[1],
                max_new_tokens=key[1],
                params=key[0],
                eos_ids=key[2],
                pad_id=self.build.pad_id,
                sync_every=self.sync_every,
                # The compiled layer halves a decode step on CUDA (bench/gpu: 4.3 -> 2.2 ms for the
                # 387M model at 256 rows) for a few seconds of compilation per batch size.
                compile_layer=self.device.type == "cuda",
            )
            self._decoders[key] = dec
        return dec

    def _forward(self, ids: torch.Tensor, past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        logits, cache = self.model(ids, past)
        return logits, cache

    def _prefill(self, prompt_ids: list[int]) -> tuple[KVCache, torch.Tensor, int]:
        """The prompt's KV and last logits, and the weight version that computed them: a cached
        entry's own (up to `max_prefix_age` versions old), or the current one."""
        key = tuple(prompt_ids)
        hit = self._prefix.get(key)
        if hit is not None and self.version - hit[2] <= self.max_prefix_age:
            self._prefix.move_to_end(key)
            self.prefix_hits += 1
            return hit
        logits, cache = self._forward(torch.tensor([prompt_ids], device=self.device), None)
        entry = (cache, logits[:, -1], self.version)
        self._prefix[key] = entry
        self._prefix.move_to_end(key)
        if len(self._prefix) > PREFIX_CACHE_ENTRIES:
            self._prefix.popitem(last=False)
        return entry

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated:
        """n samples of one prompt. Batched unless the prompt leaves less than max_new_tokens of
        maxSequenceLength (the rules keep training data out of that case): the per-group loop then
        decodes it with the shorter budget, as it always has."""
        if self._batcher is None or len(prompt_ids) + self._budget(params) > self.build.max_positions:
            return await self._generate_group(prompt_ids, n, params, seed)
        run = await self._batcher.submit(prompt_ids, n, params, seed)
        return Generated(
            run.tokens,
            run.logprobs,
            run.finished,
            run.oldest_versions,
            run.first_version,
            run.last_version,
            run.busy_seconds,
        )

    async def _generate_group(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        # no_grad only around the compute: a grad-mode switch held across an await would leak
        # into (and be undone by) the groups interleaving with this one.
        async with self.weights_lock:
            t0 = time.perf_counter()
            first_version = self.version
            with torch.no_grad():
                cache, last, prefilled_by = self._prefill(prompt_ids)
                cache = sampling.expand_cache(cache, n)
            last = last.expand(n, -1)
            busy = time.perf_counter() - t0
        state = sampling.DecodeState(n, self._stop_ids(params))
        budget = min(params.max_new_tokens, self.build.max_positions - len(prompt_ids))
        for _ in range(budget):
            async with self.weights_lock:
                t0 = time.perf_counter()
                with torch.no_grad():
                    last, cache = sampling.decode_step(
                        self._forward, last, cache, state, params=params, generator=gen
                    )
                busy += time.perf_counter() - t0
            if state.all_done:
                break
            await asyncio.sleep(0)  # let other groups and a weight update interleave
        self.busy_seconds += busy
        out = state.result()
        self.tokens_generated += sum(len(r) for r in out.response_ids)
        return Generated(
            out.response_ids,
            out.logprobs,
            out.finished,
            [prefilled_by] * n,
            first_version,
            self.version,
            busy,
        )

    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Copy `state` into the model's parameters in place, then `adopt_weights(version)`. With
        policy.lora `state` is the adapters: merged into the base weights (`merge_adapters`)."""
        async with self.weights_lock:
            t0 = time.perf_counter()
            if self.build.lora is None:
                self.model.load_state_dict(state)
            else:
                self.merge_adapters(state, self.build.lora.scale)
            self.busy_seconds += time.perf_counter() - t0
            await self.adopt_weights(version)
            return time.perf_counter() - t0

    def merge_adapters(self, adapters: dict[str, torch.Tensor], scale: float) -> None:
        """Set each adapted weight to base + scale x B A (`lora.merged`). The base weights are those
        the engine was built with, kept aside at the first refit: each refit merges into them, not
        into the previous merge, so no rounding accumulates across versions."""
        params = dict(self.model.named_parameters())
        if self._base is None:
            names = [f"{m}.weight" for m in lora.adapted_modules(adapters)]
            self._base = {n: params[n].detach().clone() for n in names}
        moved = {k: v.to(self.device) for k, v in adapters.items()}
        with torch.no_grad():
            for name, weight in lora.merged(self._base, moved, scale).items():
                params[name].copy_(weight)

    async def device_type(self) -> str:
        return self.device.type

    async def refit_members(self) -> int:
        return 1

    async def refit_join(self, spec: RefitSpec, rank: int) -> BucketPlan:
        # A gloo group's constructor returns once every member has joined: not on the event loop.
        self._refit = await asyncio.to_thread(
            RefitGroup,
            spec,
            rank=rank,
            build=self.build,
            named=list(self.model.named_parameters()),
            device=self.device,
        )
        return self._refit.plan

    async def refit_receive(self, version: int) -> float:
        if self._refit is None:
            raise RuntimeError("refit_receive before refit_join")
        await asyncio.to_thread(self._refit.broadcast.receive)  # into staging buffers only
        async with self.weights_lock:  # decode steps see the old or the new weights, whole
            t0 = time.perf_counter()
            self._refit.broadcast.unpack(dict(self.model.named_parameters()))
            await self.adopt_weights(version)
            return time.perf_counter() - t0

    async def load_ipc(self, handle: bytes, version: int) -> float:
        """Copy the policy's weights, shared by CUDA IPC on this GPU (`ipc.SharedWeights`), into
        the model in place; the copy is on this engine's stream, before any later decode step."""
        params = dict(self.model.named_parameters())
        async with self.weights_lock:
            t0 = time.perf_counter()
            with torch.no_grad():
                for name, tensor in self._ipc.open(handle).items():
                    params[name].copy_(tensor)
            # The policy rewrites its buffer at the next refit: the copy must be done by then.
            torch.cuda.current_stream(self.device).synchronize()
            self.busy_seconds += time.perf_counter() - t0
            await self.adopt_weights(version)
            return time.perf_counter() - t0

    async def adopt_weights(self, version: int) -> None:
        """The model's parameters were just overwritten in place by someone else (an NCCL
        receive): refresh the batched decoders' packed copies and take `version`.

        A writer whose copy spans awaits holds `weights_lock` from its first write until this
        returns, so no decode step sees half-written weights (this does not take the lock).
        """
        t0 = time.perf_counter()
        for dec in self._decoders.values():
            dec.refresh_weights()
        self.version = version
        self.busy_seconds += time.perf_counter() - t0

    async def reset_cache(self) -> None:
        """Drop the per-group prefix cache (the batched path keeps no KV across batches)."""
        self._prefix.clear()
        self.cache_resets += 1

    async def sleep(self) -> None:
        """Drop the prefix cache's KV and the batched decoders (their KV caches and CUDA graphs):
        the next batch builds its decoder again, recapturing its graphs (seconds on a GPU)."""
        async with self.weights_lock:
            self._prefix.clear()
            self._decoders.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.sleeps += 1

    async def wake(self) -> None:
        """Nothing to restore: the weights never left, and the caches refill on use."""

    async def stats(self) -> dict[str, float]:
        b = self._batcher
        return {
            "busy_seconds": self.busy_seconds + (b.busy_seconds if b else 0.0),
            "tokens_generated": float(self.tokens_generated + (b.tokens_generated if b else 0)),
            "prefix_hits": float(self.prefix_hits),
            "cache_resets": float(self.cache_resets),
            "sleeps": float(self.sleeps),
            "batches": float(b.batches if b else 0),
            "version": float(self.version),
        }
