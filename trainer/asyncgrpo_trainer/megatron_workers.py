"""The Megatron policy backend as Ray actors, and the group the controller calls (like `workers`).

One actor per GPU; global rank r is tensor-parallel rank r % TP of data-parallel replica r // TP
(see `backends.megatron_policy`). `MegatronPolicyGroup` is a `workers.PolicyGroup` whose calls
respect that layout: the TP peers of a replica get the same rows (they split the model, not the
batch), log-probs come back once per replica, the weight gather is a collective of replica 0's TP
group, so every one of its actors is called, in the same order, and replica 0's TP ranks each write
their shard of a checkpoint (`policy-tp{rank}.pt`), which every replica's rank of that TP rank reads
on resume.

This module, not `backends.megatron_policy`, imports Ray, so the GPU check script can run the
worker on a machine without Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import ray
import torch

from asyncgrpo_trainer import cluster, workers
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.backends.megatron_policy import MegatronLayout, MegatronPolicyWorker
from asyncgrpo_trainer.models.recipe import ModelBuild


class MegatronPolicyActor(workers.DeferredRank, workers.RefitSender, MegatronPolicyWorker):
    """A Megatron policy rank as a Ray actor; its `layout` is passed through to the worker.

    Broadcast refit: replica 0's TP ranks gather the full weights on TP rank 0's GPU, under the
    CausalLM names the engines hold (`full_weights`), and TP rank 0 (actor 0, the refit
    group's rank 0) broadcasts them; the other TP ranks only join the gather.
    """

    def refit_tensors(self) -> dict[str, torch.Tensor]:
        return self.full_weights(self.device)


class MegatronPolicyGroup(workers.PolicyGroup):
    """`workers.PolicyGroup` over TP x DP Megatron ranks; see the module docstring."""

    def __init__(self, actors: list[Any], tensor_parallel_size: int) -> None:
        super().__init__(actors)
        self.tp = tensor_parallel_size

    @property
    def world_size(self) -> int:
        """Data-parallel replicas (each TP actors)."""
        return len(self.actors) // self.tp

    def _shards(self, lengths: Sequence[int]) -> list[list[int]]:
        replicas = workers.PolicyGroup(self.actors[:: self.tp])._shards(lengths)
        return [replicas[i // self.tp] for i in range(len(self.actors))]

    async def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        shards = self._shards([len(p) + len(r) for p, r in rows])  # consecutive: the parts concatenate
        calls = [
            (i, a.reference_logprobs.remote([rows[j] for j in s]))
            for i, (a, s) in enumerate(zip(self.actors, shards, strict=True))
            if s
        ]
        parts = await asyncio.gather(*(ref for _, ref in calls))
        # Every TP peer of a replica returns the same log-probs: keep TP rank 0's.
        return [lp for (i, _), part in zip(calls, parts, strict=True) if i % self.tp == 0 for lp in part]

    def refit_senders(self) -> list[Any]:
        """Replica 0's TP ranks: all join the weight gather, TP rank 0 broadcasts."""
        return list(self.actors[: self.tp])

    def weights_ref(self) -> Any:
        """Object ref of the full CausalLM-named weights (TP rank 0 of replica 0 assembles
        them; its TP peers must join the gather, so they are called too)."""
        refs = [a.weights.remote() for a in self.actors[: self.tp]]
        return refs[0]

    async def save(self, directory: str) -> None:
        """Replica 0's TP ranks each write their shard's file (`load` is the base class's: every
        actor reads its TP rank's file)."""
        await self._save(directory, self.actors[: self.tp])


def start_megatron_policy_group(
    pool: cluster.Pool,
    build: ModelBuild,
    optim: policy.OptimConfig,
    loss: losses.LossConfig,
    gpus: int,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    context_parallel_size: int = 1,
) -> tuple[MegatronPolicyGroup, list[Any]]:
    """Like `workers.start_policy_group`; `pool` holds every rank (data parallel x model parallel),
    one GPU each. An unsupported layout fails here, before any actor starts."""
    layout = MegatronLayout(tensor_parallel_size, pipeline_parallel_size, context_parallel_size)
    layout.check(build, pool.ranks)
    cls = ray.remote(MegatronPolicyActor)
    actors = [
        cls.options(**pool.options(rank)).remote(
            build, optim, loss, rank=rank, world_size=pool.ranks, gpus=gpus, layout=layout
        )
        for rank in range(pool.ranks)
    ]
    address = ray.get(actors[0].rendezvous_address.remote()) if pool.ranks > 1 else None  # type: ignore[attr-defined]
    group = MegatronPolicyGroup(actors, tensor_parallel_size)
    return group, [a.setup.remote(address) for a in actors]  # type: ignore[attr-defined]
