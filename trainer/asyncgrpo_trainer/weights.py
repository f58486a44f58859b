"""Weight synchronization ("refit"): the policy's new weights reach every generation engine.

The synchronizer assumes global updates (all engines load the same version atomically from the
controller's point of view); mixed ages are handled per group by the buffer's start versions.
The object-store transport is the torch backends' path on CPU and GPU: rank 0 publishes its
weights once into Ray's object store and every engine pulls them; a dict of CPU tensors moves
zero-copy between processes on one node. The NCCL broadcast transport ships with the vLLM and
Megatron backends, behind the same `sync` call.
"""

from __future__ import annotations

import abc
import asyncio
import time

from asyncgrpo_trainer.workers import GenerationGroup, PolicyGroup


class WeightSynchronizer(abc.ABC):
    """Moves policy weights of a version to the generation engines."""

    @abc.abstractmethod
    async def sync(self, version: int) -> float:
        """Push the current policy weights as `version`; returns the seconds it took."""


class ObjectStoreSynchronizer(WeightSynchronizer):
    """Rank 0 -> Ray object store -> every engine; see the module docstring."""

    def __init__(self, policy: PolicyGroup, generation: GenerationGroup, timeout_seconds: float) -> None:
        self.policy, self.generation, self.timeout = policy, generation, timeout_seconds

    async def sync(self, version: int) -> float:
        t0 = time.perf_counter()
        await asyncio.wait_for(self.generation.load_weights(self.policy.weights_ref(), version), self.timeout)
        return time.perf_counter() - t0


TORCH_TRANSPORTS = frozenset({"auto", "object-store"})
"""weightSync.transport values the torch backends serve (both mean the object store)."""
