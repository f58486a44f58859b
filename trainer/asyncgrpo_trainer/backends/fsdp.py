"""FSDP2 for the torch policy (policy.sharding.strategy fsdp): each of the W data-parallel ranks
keeps 1/W of the weights, their gradients and the optimizer state.

`Sharded.shard` applies torch's `fully_shard` to every decoder layer, then to the whole model,
whose own group is the embeddings, the final norm and the output layer (tied or not). A layer's weights are
gathered from every rank just before its forward and again for its backward, and freed after
each; its gradients are reduce-scattered, so each rank keeps the sum of its own shard's. Mixed
precision: the sharded parameters (the optimizer's master weights) stay in the worker's training
dtype (fp32 on CUDA, `cuda_train.Recipe`), the gathered ones are in the model's dtype
(spec.trainer.model.dtype: what the forward computes in and what the all-gathers move), and
gradients are reduced in fp32. With `cpu_offload` (CUDA only) the sharded parameters,
their gradients and the optimizer state live in host memory and AdamW steps on the CPU (FSDP2's
CPUOffloadPolicy); the GPU then holds the gathered layers and the activations.

The step stays the unsharded worker's (`policy` module docstring) with the gradient reduce moved:
FSDP sums (not averages: `shard` sets its divide factor to 1) each micro-batch's gradients as its
backward ends, so `finish_step` reduces only the counters and divides the shards by the global
token count; the clip's norm over the shards (DTensors) is the global gradient's (`whole`).

Lockstep: a sharded forward is a collective (every rank joins each layer's all-gather), so in each
call every rank runs as many forward passes as the rank with the most: `in_lockstep` pads a rank's
micro-batches with empty ones, which run a forward that scores nothing.

Full state: the weights, the optimizer state and the reference are gathered onto rank 0's CPU for
a checkpoint, in the unsharded worker's `policy.pt` format (the optimizer's state numbered in
parameter order, as `Optimizer.state_dict` numbers it), so a checkpoint resumes with or without
sharding, at any W, and `asyncgrpo export` reads it as it is; every rank loads its shards from the
full file. For a refit, `gathered_parameters` hands every rank the whole weights in the engines'
dtype, one tensor at a time, so a rank holds at most the whole model in that dtype besides its
shards.

The policy worker imports this module only when it shards: DTensor's imports take seconds that an
unsharded worker does not pay.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from asyncgrpo_trainer.models.network import CausalLM

_GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Whole tensors, on rank 0's CPU only (the other ranks get {}): what a checkpoint writes."""
_FROM_WHOLE = StateDictOptions(full_state_dict=True)
"""Load whole tensors that every rank holds, each rank keeping its shard."""


class Sharded:
    """A policy worker's models sharded over the default process group (one mesh of all ranks),
    and what the worker does differently with them; see the module docstring."""

    def __init__(self, device: torch.device, *, param_dtype: torch.dtype, cpu_offload: bool) -> None:
        self.device = device
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        self.mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        self.offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()

    def shard(self, model: CausalLM, *, trains: bool) -> None:
        """Shard `model` in place, one decoder layer per group, its parameters moving to the device
        (or host memory when offloaded) as they are sharded: `model` may be on the CPU, only one
        layer at a time is whole on the device.

        The root group (embeddings, final norm, output layer) of a model that `trains` stays
        gathered from its forward to its backward, which needs it first (FSDP's default; after a
        forward without gradients too, until the next backward reshards it). A model that only
        runs forwards (the reference) reshards it after each, so its state reads as shards."""
        for layer in model.layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=self.mixed, offload_policy=self.offload)
        fully_shard(
            model,
            mesh=self.mesh,
            mp_policy=self.mixed,
            offload_policy=self.offload,
            reshard_after_forward=None if trains else True,
        )
        # The policy's log-prob pass calls this method, not forward (`cuda_train.ResponseLogprobs`).
        register_fsdp_forward_method(model, "target_logprobs")
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # sum: the step divides by its token count
                module.set_force_sum_reduction_for_comms(True)  # gloo has no average

    def in_lockstep(self, batches: list[list[int]]) -> list[list[int]]:
        """`batches` (row indices per forward pass) padded with empty passes to the most any rank
        has (a collective: every rank calls it, with its own list)."""
        most = torch.tensor([len(batches)], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return batches + [[] for _ in range(int(most.item()) - len(batches))]

    @staticmethod
    def whole(tensor: torch.Tensor) -> torch.Tensor:
        """A sharded tensor's global value (a collective), a plain one as it is."""
        if isinstance(tensor, DTensor):
            return tensor.full_tensor()
        return tensor

    def gathered_parameters(self, model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Every parameter of `model`, whole, on the device in `dtype`: what the engines load (a
        collective; every rank gets them). Each shard is cast before it travels, and taken from
        host memory first when offloaded."""
        out = {}
        with torch.no_grad():
            for name, param in model.named_parameters():
                assert isinstance(param, DTensor), f"{name} is not sharded"
                local = param.to_local().to(self.device, dtype)
                piece = DTensor.from_local(
                    local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                )
                out[name] = piece.full_tensor()
        return out

    @staticmethod
    def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
        """`model.state_dict()` of the unsharded model, on rank 0's CPU; {} on the other ranks (a
        collective)."""
        state: dict[str, Any] = get_model_state_dict(model, options=_GATHERED)
        return state

    @staticmethod
    def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load an unsharded model's state dict (every rank passes all of it) into `model`."""
        whole_state: dict[str, Any] = state
        set_model_state_dict(model, whole_state, options=_FROM_WHOLE)

    @staticmethod
    def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state as the unsharded model's optimizer numbers it (`model.parameters()`
        order), whole, on rank 0's CPU; {} on the other ranks (a collective)."""
        full: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_GATHERED)
        if not full:
            return {}
        number = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        return {
            "state": {number[name]: value for name, value in full["state"].items()},
            "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in full["param_groups"]],
        }

    @staticmethod
    def load_optimizer_state(
        model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load an optimizer state numbered as `optimizer_state` returns it (every rank passes all
        of it) into the optimizer of `model`."""
        names = [name for name, _ in model.named_parameters()]
        groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]
        keyed: dict[str, Any] = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": groups,
        }
        set_optimizer_state_dict(model, optimizer, keyed, options=_FROM_WHOLE)
