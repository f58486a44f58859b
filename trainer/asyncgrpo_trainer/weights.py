"""Weight synchronization ("refit"): the policy's new weights reach every generation engine.

The synchronizer assumes global updates (all engines load the same version atomically from the
controller's point of view); mixed ages are handled per group by the buffer's start versions.
Three transports sit behind the same `sync` call, chosen by `spec.trainer.weightSync.transport`
(`asyncgrpo_api.rules.refit_transport`); every engine (torch or vLLM) implements the receiving side of each
(`generation.GenerationWorker`):

- broadcast: policy rank 0 broadcasts its parameters to every engine in packed buckets
  (`nccl_sync.BucketedBroadcast`) over a process group of its own that spans rank 0 and the
  engines, never the policy's data-parallel group; NCCL when they are on CUDA, gloo on CPU (the
  same code, which is how CI tests it). The sender casts its fp32 master weights to the model's
  dtype while packing; each engine writes the buckets into its model in place (vLLM: its
  tensor-parallel workers each join and load them with vLLM's own `load_weights`).
- cuda-ipc: colocated on GPUs (two processes on one GPU cannot form an NCCL group), each torch
  policy rank shares its weights, cast to the model's dtype, with the engine on its GPU by CUDA
  IPC handles (`ipc`); the engine copies them device to device.
- object-store: rank 0 publishes its weights once into Ray's object store and every engine pulls
  them; a dict of CPU tensors moves zero-copy between processes on one node. The CPU default,
  and the colocated path of the Megatron policy (whose ranks hold shards).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from asyncgrpo_api.rules import RefitTransport
from asyncgrpo_api.v1alpha1.trainer import WeightSyncSpec
from asyncgrpo_trainer.backends.nccl_sync import RefitSpec
from asyncgrpo_trainer.workers import GenerationGroup, PolicyGroup

MiB = 1 << 20


@dataclass(frozen=True)
class RefitTiming:
    """One refit, timed two ways: its wall time as the controller waits for it, and the longest
    any engine stopped generating for it (copying into its weights, under its weights lock or
    between two vLLM engine steps). The transfer itself may overlap generation; the pause may not."""

    seconds: float
    generation_pause_seconds: float


async def _timed(pauses: Awaitable[list[float]], timeout: float) -> RefitTiming:
    t0 = time.perf_counter()
    paused = await asyncio.wait_for(pauses, timeout)
    return RefitTiming(time.perf_counter() - t0, max(paused, default=0.0))


class WeightSynchronizer(abc.ABC):
    """Moves policy weights of a version to the generation engines."""

    @property
    @abc.abstractmethod
    def transport(self) -> str:
        """What carries the weights, for the step records: object-store, nccl or gloo."""

    @abc.abstractmethod
    async def sync(self, version: int) -> RefitTiming:
        """Push the current policy weights as `version`; how long that took and paused generation."""

    def regroup(self) -> None:
        """The engines changed (an elastic fleet's join or drain, `fleet`): the next `sync` reaches
        the group's engines as they are then. A transport that reads them at each sync has nothing
        to do."""
        return


class ObjectStoreSynchronizer(WeightSynchronizer):
    """Rank 0 -> Ray object store -> every engine; see the module docstring."""

    def __init__(self, policy: PolicyGroup, generation: GenerationGroup, timeout_seconds: float) -> None:
        self.policy, self.generation, self.timeout = policy, generation, timeout_seconds

    @property
    def transport(self) -> str:
        return "object-store"

    async def sync(self, version: int) -> RefitTiming:
        return await _timed(self.generation.load_weights(self.policy.weights_ref(), version), self.timeout)


class BroadcastSynchronizer(WeightSynchronizer):
    """Policy rank 0 -> every engine by a bucketed broadcast; see the module docstring.

    The refit group is formed at the first `sync`: rank 0 serves a TCPStore on a free port, then
    rank 0 and every engine join at once (a gloo group forms only when all members are there).
    Each `sync` launches the send and every receive together and waits for all of them, so each
    member enters the same broadcasts in the same order, one refit at a time; an engine waits for
    its buckets in a thread, so its event loop keeps serving generation meanwhile.
    """

    def __init__(
        self, policy: PolicyGroup, generation: GenerationGroup, *, bucket_bytes: int, timeout_seconds: float
    ) -> None:
        self.policy, self.generation = policy, generation
        self.bucket_bytes, self.timeout = bucket_bytes, timeout_seconds
        self._backend: str | None = None

    @property
    def transport(self) -> str:
        return self._backend or "broadcast (not joined yet)"

    def regroup(self) -> None:
        """The refit group spans the engines it was formed with: the next `sync` forms it again,
        over the engines then (rank 0 serves a new store, each engine joins it anew)."""
        self._backend = None

    async def sync(self, version: int) -> RefitTiming:
        return await _timed(self._sync(version), self.timeout)

    async def _sync(self, version: int) -> list[float]:
        if self._backend is None:
            self._backend = await self._join()
        senders = self.policy.refit_senders()
        done = await asyncio.gather(
            *(a.refit_send.remote() for a in senders),
            *(a.refit_receive.remote(version) for a in self.generation.actors),
        )
        return list(done[len(senders) :])

    async def _join(self) -> str:
        sender, engines = self.policy.actors[0], self.generation.actors
        kinds = set(
            await asyncio.gather(sender.device_type.remote(), *(a.device_type.remote() for a in engines))
        )
        members = await asyncio.gather(*(a.refit_members.remote() for a in engines))
        if len(kinds) != 1:
            raise RuntimeError(
                f"spec.trainer.weightSync.transport: the broadcast needs the policy and the generation "
                f"engines on one kind of device, they are on {sorted(kinds)}; use object-store"
            )
        backend = "nccl" if kinds == {"cuda"} else "gloo"
        world = 1 + sum(members)  # an engine takes one rank per process that receives (vLLM's TP workers)
        host, port = await sender.refit_address.remote(world, self.timeout)
        spec = RefitSpec(host, port, world, backend, self.bucket_bytes, self.timeout)
        first_ranks = itertools.accumulate(members, initial=1)
        plans = await asyncio.gather(
            sender.refit_join.remote(spec, 0),
            *(
                engine.refit_join.remote(spec, rank)
                for engine, rank in zip(engines, first_ranks, strict=False)
            ),
        )
        if any(p != plans[0] for p in plans):  # the same recipe gives the same plan; say so if not
            raise RuntimeError("the refit plans of the policy and the generation engines differ")
        return backend


class CudaIpcSynchronizer(WeightSynchronizer):
    """Colocated on GPUs: each policy rank shares its weights by CUDA IPC (`ipc`) with the engine on
    its GPU, which copies them into its own (every data-parallel rank holds the same weights)."""

    def __init__(self, policy: PolicyGroup, generation: GenerationGroup, timeout_seconds: float) -> None:
        self.policy, self.generation, self.timeout = policy, generation, timeout_seconds

    @property
    def transport(self) -> str:
        return "cuda-ipc"

    async def sync(self, version: int) -> RefitTiming:
        return await _timed(self._sync(version), self.timeout)

    async def _sync(self, version: int) -> list[float]:
        pairs = list(zip(self.policy.actors, self.generation.actors, strict=True))
        handles = await asyncio.gather(*(rank.refit_share.remote() for rank, _ in pairs))
        return list(
            await asyncio.gather(
                *(engine.load_ipc.remote(h, version) for (_, engine), h in zip(pairs, handles, strict=True))
            )
        )


def build(
    spec: WeightSyncSpec, policy: PolicyGroup, generation: GenerationGroup, *, transport: RefitTransport
) -> WeightSynchronizer:
    """The synchronizer of `transport` (`asyncgrpo_api.rules.refit_transport` of the job)."""
    if transport == "object-store":
        return ObjectStoreSynchronizer(policy, generation, spec.timeout_seconds)
    if transport == "cuda-ipc":
        return CudaIpcSynchronizer(policy, generation, spec.timeout_seconds)
    return BroadcastSynchronizer(
        policy, generation, bucket_bytes=spec.bucket_size_mb * MiB, timeout_seconds=spec.timeout_seconds
    )
