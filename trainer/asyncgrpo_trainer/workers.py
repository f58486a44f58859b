"""Worker groups: Ray actors for the backends, and the group objects the controller calls.

A group object is small and picklable (it holds actor handles), so the driver builds it and hands
it to the controller actor. Its methods return awaitables of Ray object refs, so the controller's
event loop never blocks on a worker. The policy group shards a chunk's rows over its
data-parallel ranks; the generation group sends each prompt group to the engine with the fewest
outstanding requests. The reward workers live in `rewards` (no torch in their processes).

The `refit_*` methods are the actors' halves of `weights.BroadcastSynchronizer`: policy rank 0
serves the refit group's store and sends; each engine joins and receives. An engine is an async
actor, so it runs the blocking parts (joining a gloo group, waiting for the buckets) in a thread
and keeps decoding meanwhile; it writes the received weights into its model on its event loop,
between two decode steps, so no forward ever sees half of an update.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from asyncgrpo_trainer import checkpoint, cluster, occupancy, rewards
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import generation, ipc, packing, policy, sampling, vllm_engine
from asyncgrpo_trainer.backends.nccl_sync import BucketPlan, RefitGroup, RefitSpec, serve_store
from asyncgrpo_trainer.models.recipe import ModelBuild


def _node_ip() -> str:
    host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return host


class DeferredRank:
    """A policy rank as a Ray actor, mixed in before the backend's worker class: creating the actor
    only records the worker's arguments, and `setup` constructs the worker once rank 0's actor has
    named the rendezvous address, since the process group forms only when every rank joins it.
    `options` are the backend's own constructor arguments."""

    def __init__(
        self,
        build: ModelBuild,
        optim: policy.OptimConfig,
        loss: losses.LossConfig,
        *,
        rank: int,
        world_size: int,
        gpus: int,
        **options: Any,
    ) -> None:
        self._init_args = (build, optim, loss, rank, world_size, gpus, options)

    def rendezvous_address(self) -> str:
        """A free port on this node, for the process group's store (called on rank 0)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{_node_ip()}:{port}"

    def setup(self, rendezvous: str | None) -> bool:
        build, optim, loss, rank, world, gpus, options = self._init_args
        worker: Any = super()  # the backend's worker class, next in the actor's MRO
        worker.__init__(
            build,
            optim,
            loss,
            rank=rank,
            world_size=world,
            device=policy.default_device(gpus),
            rendezvous=rendezvous,
            **options,
        )
        return True


class RefitSender:
    """The policy side of the broadcast refit, for a policy worker actor (mixed in before it).

    Rank 0 of the policy group serves the refit group's store, joins it and broadcasts
    `refit_tensors()` (the engines' parameter names, on this worker's device); in a backend whose
    weights are sharded the other ranks named by the group's `refit_senders` only help assemble
    them (`refit_tensors` is a collective there), so they call `refit_send` too.
    """

    device: torch.device
    build: ModelBuild
    _refit: RefitGroup | None = None
    _ipc_buffers: ipc.SharedWeights | None = None

    def refit_tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def device_type(self) -> str:
        return self.device.type

    def refit_address(self, world: int, timeout_seconds: float) -> tuple[str, int]:
        """Serve the refit group's store (this rank is its rank 0); where the engines find it."""
        host = _node_ip()
        self._refit_store = serve_store(host, world, timeout_seconds)
        return host, self._refit_store.port

    def refit_join(self, spec: RefitSpec, rank: int) -> BucketPlan:
        named = list(self.build.skeleton().named_parameters())  # the engines' names and shapes
        self._refit = RefitGroup(
            spec, rank=rank, build=self.build, named=named, device=self.device, store=self._refit_store
        )
        return self._refit.plan

    def refit_send(self) -> None:
        """Pack (casting the master weights to the engines' dtype) and broadcast (rank 0)."""
        tensors = self.refit_tensors()
        if self._refit is not None:
            self._refit.broadcast.sync(tensors)

    def refit_share(self) -> bytes:
        """The CUDA IPC handle of this rank's weights in the engines' dtype, for the engine on the
        same GPU (`weights.CudaIpcSynchronizer`). The cast goes into one flat buffer kept across
        refits (`ipc.SharedWeights`: one copy of the model in its dtype on this GPU, opened by the
        engine once), so the handle stays valid while the engine copies, whatever the next
        training step does to the master weights."""
        tensors = self.refit_tensors()
        if self._ipc_buffers is None:
            self._ipc_buffers = ipc.SharedWeights(tensors, self.build.torch_dtype)
        return self._ipc_buffers.fill(tensors)


class PolicyActor(DeferredRank, RefitSender, policy.TorchPolicyWorker):
    """The torch policy worker as a Ray actor."""

    def refit_tensors(self) -> dict[str, torch.Tensor]:
        return self.refit_parameters()


class PolicyGroup:
    """The data-parallel policy ranks; see the module docstring.

    A chunk's rows go to the ranks as consecutive slices of equal row counts, or, when the policy
    packs micro-batches by tokens (`balance_tokens`, policy.maxTokensPerMicroBatch), with equal
    token counts (`packing.balanced_shards`), so no rank waits at the all-reduce for one that drew
    the long rows.

    `sharded` (policy.sharding fsdp): every call that computes with the model or gathers its
    weights is a collective over the ranks, so each goes to every rank, in the same order, even
    one that has no rows in it; rank 0 returns the gathered weights and writes the checkpoint."""

    def __init__(self, actors: list[Any], *, balance_tokens: bool = False, sharded: bool = False) -> None:
        self.actors = actors
        self.balance_tokens = balance_tokens
        self.sharded = sharded

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def _shards(self, lengths: Sequence[int]) -> list[list[int]]:
        """Row indices per rank, each rank's in arrival order, for rows of `lengths` tokens."""
        if self.balance_tokens:
            return packing.balanced_shards(lengths, len(self.actors))
        return policy.split_evenly(list(range(len(lengths))), len(self.actors))

    async def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        calls = [
            (shard, a.reference_logprobs.remote([rows[i] for i in shard]))
            for a, shard in zip(self.actors, self._shards([len(p) + len(r) for p, r in rows]), strict=True)
            if shard or self.sharded
        ]
        parts = await asyncio.gather(*(ref for _, ref in calls))
        out: list[list[float]] = [[] for _ in rows]
        for (shard, _), part in zip(calls, parts, strict=True):
            for i, logprobs in zip(shard, part, strict=True):
                out[i] = logprobs
        return out

    async def train_chunk(self, rows: list[policy.TrainRow]) -> None:
        shards = self._shards([len(r.prompt_ids) + len(r.response_ids) for r in rows])
        await asyncio.gather(
            *(a.train_chunk.remote([rows[i] for i in s]) for a, s in zip(self.actors, shards, strict=True))
        )

    async def finish_step(self) -> dict[str, float | None]:
        results = await asyncio.gather(*(a.finish_step.remote() for a in self.actors))
        return dict(results[0])

    def _holders(self) -> list[Any]:
        """The ranks whose calls assemble the whole weights: rank 0, which holds them, or every
        rank when they are sharded (rank 0 gets them)."""
        return self.actors if self.sharded else self.actors[:1]

    def weights_ref(self) -> Any:
        """Object ref of rank 0's weights (CPU tensors), resolved by each engine directly."""
        refs = [a.weights.remote() for a in self._holders()]
        return refs[0]

    async def save(self, directory: str) -> None:
        """Rank 0 writes the policy's checkpoint file into `directory` (`checkpoint.begin`'s), so
        the state does not pass through the controller when the worker pods mount the checkpoint
        volume; without a shared volume the file comes back and is written here."""
        await self._save(directory, self._holders())

    async def _save(self, directory: str, writers: list[Any]) -> None:
        returned = await asyncio.gather(*(a.save.remote(directory) for a in writers))
        files = {name: obj for r in returned for name, obj in r.items()}
        if files:
            await asyncio.to_thread(checkpoint.write_returned, Path(directory), files)

    async def load(self, directory: str) -> None:
        """Every rank reads its state from the checkpoint step directory `directory`."""
        await asyncio.gather(*(a.load.remote(directory) for a in self.actors))

    def refit_senders(self) -> list[Any]:
        """The actors that call `refit_send` in a broadcast refit (rank 0 broadcasts)."""
        return self._holders()

    async def busy_seconds(self) -> float:
        values = await asyncio.gather(*(a.busy.remote() for a in self.actors))
        return float(sum(values)) / len(values)


class GenerationGroup:
    """The generation engines; least-outstanding routing of prompt groups. `occupancy` counts each
    engine's requests, which routing reads, and the time each one held some (the controller's
    step windows report it).

    Engines have ids that are never reused. An elastic fleet (`fleet`) adds engines and removes
    them while the run goes on: every engine in `engines` receives the refits, and routing skips
    the `closed` ones, an engine that joined until its first refit gave it the current weights
    and one draining before it leaves."""

    def __init__(self, actors: list[Any]) -> None:
        self.engines: dict[int, Any] = dict(enumerate(actors))
        self.closed: set[int] = set()
        self.occupancy = occupancy.Occupancy(self.engines)
        self._next_id = len(actors)

    @property
    def actors(self) -> list[Any]:
        """Every engine, in the order of its id."""
        return list(self.engines.values())

    def add(self, actor: Any) -> int:
        """A new engine, which refits reach from now on and routing once it is opened; its id."""
        engine, self._next_id = self._next_id, self._next_id + 1
        self.engines[engine] = actor
        self.closed.add(engine)
        self.occupancy.add(engine)
        return engine

    def remove(self, engine: int) -> Any:
        """Take out an engine that holds no request; its actor."""
        self.occupancy.remove(engine)
        self.closed.discard(engine)
        return self.engines.pop(engine)

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> generation.Generated:
        routable = [e for e in self.engines if e not in self.closed]
        idx = min(routable, key=self.occupancy.outstanding.__getitem__)
        with self.occupancy.serving(idx):
            ref = self.engines[idx].generate.remote(prompt_ids, n, params, seed)
            try:
                result: generation.Generated = await ref
                return result
            except asyncio.CancelledError:
                ray.cancel(ref)
                raise

    async def load_weights(self, weights_ref: Any, version: int) -> list[float]:
        """Every engine loads `version`; the seconds each paused generation for it."""
        return list(await asyncio.gather(*(a.load_weights.remote(weights_ref, version) for a in self.actors)))

    async def reset_cache(self) -> None:
        await asyncio.gather(*(a.reset_cache.remote() for a in self.actors))

    async def sleep(self) -> None:
        await asyncio.gather(*(a.sleep.remote() for a in self.actors))

    async def wake(self) -> None:
        await asyncio.gather(*(a.wake.remote() for a in self.actors))

    async def stats(self) -> list[dict[str, float]]:
        return list(await asyncio.gather(*(a.stats.remote() for a in self.actors)))


def start_policy_group(
    pool: cluster.Pool,
    build: ModelBuild,
    optim: policy.OptimConfig,
    loss: losses.LossConfig,
    gpus: int,
    *,
    sharding: policy.Sharding | None = None,
    activation_checkpointing: bool = False,
) -> tuple[PolicyGroup, list[Any]]:
    """The policy group and the refs that resolve once every rank is set up (wait on them later,
    so the policy and generation processes start in parallel)."""
    cls = ray.remote(PolicyActor)
    actors = [
        cls.options(**pool.options(rank)).remote(
            build,
            optim,
            loss,
            rank=rank,
            world_size=pool.ranks,
            gpus=gpus,
            sharding=sharding,
            activation_checkpointing=activation_checkpointing,
        )
        for rank in range(pool.ranks)
    ]
    grouped = pool.ranks > 1 or sharding is not None  # a process group, even of one rank
    address = ray.get(actors[0].rendezvous_address.remote()) if grouped else None  # type: ignore[attr-defined]
    group = PolicyGroup(
        actors, balance_tokens=optim.max_tokens_per_micro_batch is not None, sharded=sharding is not None
    )
    return group, [a.setup.remote(address) for a in actors]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EngineSpec:
    """How to start one generation engine (vLLM when `vllm` options are given, else the torch
    engine decoding as `torch_decode` says): in the generation pool's bundles at the start, and on
    a node an elastic fleet gains later (`fleet`), the same way."""

    build: ModelBuild
    gpus: int
    """GPUs per engine (0 on CPU)."""
    max_prefix_age: int = 0
    torch_decode: generation.Engine = "auto"
    vllm: vllm_engine.VLLMOptions | None = None

    def start(self, placement: dict[str, Any]) -> Any:
        """The engine's actor, placed by `placement` (Ray's `.options`: resources and scheduling)."""
        engine: type[generation.GenerationWorker] = generation.TorchGenerationWorker
        options: dict[str, Any] = {"engine": self.torch_decode}
        if self.vllm is not None:
            engine, options = vllm_engine.VLLMGenerationWorker, {"options": self.vllm}
        return (
            ray.remote(engine)
            .options(**placement)
            .remote(
                self.build,
                device=policy.default_device(self.gpus),
                max_prefix_age=self.max_prefix_age,
                **options,
            )
        )


def start_generation_group(pool: cluster.Pool, spec: EngineSpec) -> tuple[GenerationGroup, list[Any]]:
    """The generation group and the refs that resolve once every engine is up."""
    if spec.vllm is not None:
        vllm_engine.check_available()  # a clear error here, naming the spec field, not in every actor
    actors = [spec.start(pool.options(rank)) for rank in range(pool.ranks)]
    return GenerationGroup(actors), [a.stats.remote() for a in actors]


def kill(*groups: PolicyGroup | GenerationGroup | rewards.RewardPool) -> None:
    for group in groups:
        actors = group.owned_actors() if isinstance(group, rewards.RewardPool) else group.actors
        for actor in actors:
            ray.kill(actor, no_restart=True)
