"""The trainer's half inside vLLM's own worker processes: where refits land in vLLM's weights.

vLLM runs its model in worker processes of its own (one per tensor-parallel rank). This class is
vLLM's `worker_extension_cls`: vLLM mixes it into its worker class, and the generation actor
reaches its methods with `AsyncLLM.collective_rpc`, which every worker runs between two engine
steps, so no forward pass sees a half-written update. Each method hands tensors under the
network's (Hugging Face) names to vLLM's own `model.load_weights`, which fuses q/k/v and
gate/up and takes its tensor-parallel shard, exactly as when vLLM loads the checkpoint from disk.
Three ways in, one per refit transport:

- `asyncgrpo_load_bytes`: the tensors, serialized (the object store: the actor received them
  from Ray, vLLM's RPC carries the bytes on to the worker);
- `asyncgrpo_refit_join` / `asyncgrpo_refit_receive`: every worker joins the trainer's refit
  group (`nccl_sync.RefitGroup`, NCCL between GPUs, gloo on CPU) and receives the bucketed
  broadcast itself, straight into buffers on its device: the bytes never pass through the actor;
- `asyncgrpo_load_ipc`: CUDA IPC handles of the policy's tensors on the same GPU (colocated).

This module is imported by vLLM in its worker processes; it imports nothing from vLLM.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import torch

from asyncgrpo_trainer.backends import ipc
from asyncgrpo_trainer.backends.nccl_sync import BucketPlan, RefitGroup, RefitSpec
from asyncgrpo_trainer.models.recipe import ModelBuild


class WorkerExtension:
    """Mixed into vLLM's worker (`model_runner`, `device` and `rank` are the worker's)."""

    model_runner: Any
    device: torch.device
    rank: int
    _asyncgrpo_refit: RefitGroup | None = None

    def _asyncgrpo_load(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        loaded = self.model_runner.model.load_weights(weights=named)
        return len(loaded) if loaded is not None else 0

    def asyncgrpo_load_bytes(self, blob: bytes) -> int:
        """Load a `torch.save`d dict of tensors (network names); how many parameters it wrote."""
        state: dict[str, torch.Tensor] = torch.load(
            io.BytesIO(blob), map_location=self.device, weights_only=True
        )
        return self._asyncgrpo_load(state.items())

    def asyncgrpo_refit_join(self, spec: RefitSpec, first_rank: int, build: ModelBuild) -> BucketPlan:
        """Join the refit group as rank `first_rank` + this worker's tensor-parallel rank (the
        engine's workers take consecutive ranks); returns the plan, which the sender checks."""
        named = build.skeleton().named_parameters()
        self._asyncgrpo_refit = RefitGroup(
            spec, rank=first_rank + self.rank, build=build, named=named, device=self.device
        )
        return self._asyncgrpo_refit.plan

    def asyncgrpo_refit_receive(self) -> int:
        """Receive one refit's buckets and load them (every worker of the engine at once)."""
        if self._asyncgrpo_refit is None:
            raise RuntimeError("asyncgrpo_refit_receive before asyncgrpo_refit_join")
        broadcast = self._asyncgrpo_refit.broadcast
        broadcast.receive()
        return self._asyncgrpo_load(broadcast.received())

    def asyncgrpo_load_ipc(self, handles: bytes) -> int:
        """Load tensors shared by CUDA IPC on this GPU (`ipc.share`): opened as views of the
        policy's memory, copied by `load_weights`."""
        return self._asyncgrpo_load(ipc.open_shared(handles))
