"""The trainer's half inside vLLM's own worker processes: where refits land in vLLM's weights.

vLLM runs its model in worker processes of its own (one per tensor-parallel rank). This class is
vLLM's `worker_extension_cls`: vLLM mixes it into its worker class, and the generation actor
reaches its methods with `AsyncLLM.collective_rpc`, which every worker runs between two engine
steps, so no forward pass sees a half-written update. Each method hands tensors under the
network's (Hugging Face) names to vLLM's own in-place reload (`reload_weights`: the model's
`load_weights`, which fuses q/k/v and gate/up and takes its tensor-parallel shard as when vLLM
loads the checkpoint from disk, then vLLM's post-load processing into the same storage).
After the first refit, the later ones skip vLLM's reload where a plain copy into its parameters
reproduces it (`direct_copy`: unquantized weights on a GPU, one tensor-parallel rank). Each
method returns the seconds its load took. Three ways in, one per refit transport:

- `asyncgrpo_load_bytes`: the tensors, serialized (the object store: the actor received them
  from Ray, vLLM's RPC carries the bytes on to the worker);
- `asyncgrpo_refit_join` / `asyncgrpo_refit_receive`: every worker joins the trainer's refit
  group (`nccl_sync.RefitGroup`, NCCL between GPUs, gloo on CPU) and receives the bucketed
  broadcast itself, straight into buffers on its device: the bytes never pass through the actor;
- `asyncgrpo_load_ipc`: the CUDA IPC handle of the policy's weights on the same GPU (colocated),
  opened on the first refit and kept (`ipc.OpenedWeights`).

This module is imported by vLLM in its worker processes; it imports nothing from vLLM.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable
from typing import Any

import torch

from asyncgrpo_trainer.backends import direct_copy, ipc
from asyncgrpo_trainer.backends.nccl_sync import RefitGroup, RefitSpec
from asyncgrpo_trainer.models.recipe import ModelBuild

log = logging.getLogger(__name__)


class WorkerExtension:
    """Mixed into vLLM's worker (`model_runner`, `device` and `rank` are the worker's)."""

    model_runner: Any
    device: torch.device
    rank: int
    _asyncgrpo_refit: RefitGroup | None = None
    _asyncgrpo_ipc: ipc.OpenedWeights | None = None
    _asyncgrpo_direct: direct_copy.DirectCopy | str | None = None
    """After the first refit: the direct copy, or why vLLM's reload stays (`direct_copy.plan`)."""

    def _asyncgrpo_load(self, named: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load a refit's tensors (network names); the seconds it took, the copies finished.

        vLLM's way is its in-place reload of checkpoint-format weights: after the first load vLLM
        has turned some parameters into kernel layouts (its CPU GEMMs repack them), so a plain
        `model.load_weights` no longer applies; the reload restores each layer's checkpoint
        layout, loads, re-processes, and copies into the same storage (CUDA graphs stay valid).
        The first refit goes that way and decides whether the later ones may copy directly."""
        t0 = time.perf_counter()
        tensors = dict(named)
        if isinstance(self._asyncgrpo_direct, direct_copy.DirectCopy):
            self._asyncgrpo_direct.load(tensors)
        else:
            runner = self.model_runner
            runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
            if self._asyncgrpo_direct is None:
                model = runner.get_model()
                packed = getattr(model, "packed_modules_mapping", {})
                self._asyncgrpo_direct = direct_copy.plan(dict(model.named_parameters()), packed, tensors)
                how = (
                    "direct copies"
                    if isinstance(self._asyncgrpo_direct, direct_copy.DirectCopy)
                    else (f"vLLM's reload ({self._asyncgrpo_direct})")
                )
                log.info("refits after the first load into vLLM by %s", how)
        if self.device.type == "cuda":
            # The sender rewrites its buffers at the next refit (CUDA IPC) or reuses them.
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter() - t0

    def asyncgrpo_load_bytes(self, blob: bytes) -> float:
        """Load a `torch.save`d dict of tensors (network names)."""
        state: dict[str, torch.Tensor] = torch.load(
            io.BytesIO(blob), map_location=self.device, weights_only=True
        )
        return self._asyncgrpo_load(state.items())

    def asyncgrpo_refit_join(self, spec: dict[str, Any], first_rank: int, build: dict[str, Any]) -> int:
        """Join the refit group as rank `first_rank` + this worker's tensor-parallel rank (the
        engine's workers take consecutive ranks), checking the plan against vLLM's side; its bucket count. The
        spec and the recipe come as JSON-shaped dicts: vLLM's RPC between its processes carries
        plain data, not the trainer's dataclasses."""
        recipe = ModelBuild.from_json(build)
        named = recipe.skeleton().named_parameters()
        self._asyncgrpo_refit = RefitGroup(
            RefitSpec(**spec), rank=first_rank + self.rank, build=recipe, named=named, device=self.device
        )
        return self._asyncgrpo_refit.plan.num_buckets

    def asyncgrpo_refit_receive(self) -> float:
        """Receive one refit's buckets and load them (every worker of the engine at once)."""
        if self._asyncgrpo_refit is None:
            raise RuntimeError("asyncgrpo_refit_receive before asyncgrpo_refit_join")
        broadcast = self._asyncgrpo_refit.broadcast
        broadcast.receive()
        return self._asyncgrpo_load(broadcast.received())

    def asyncgrpo_load_ipc(self, handle: bytes) -> float:
        """Load the policy's weights shared by CUDA IPC on this GPU (`ipc.SharedWeights`): views
        of its buffer, opened on the first refit and kept."""
        if self._asyncgrpo_ipc is None:
            self._asyncgrpo_ipc = ipc.OpenedWeights()
        return self._asyncgrpo_load(self._asyncgrpo_ipc.open(handle).items())
