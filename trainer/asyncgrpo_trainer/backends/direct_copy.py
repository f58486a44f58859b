"""A refit straight into vLLM's parameters, where vLLM's own load amounts to a plain copy.

vLLM loads checkpoint weights through each layer's weight loader (fusing q/k/v into `qkv_proj`
and gate/up into `gate_up_proj`, taking a tensor-parallel shard), then processes them into
kernel layouts. Its in-place reload (`reload_weights`) redoes all of that on every refit: each
layer is rebuilt on the meta device, materialized, loaded, processed and copied back, in Python,
layer by layer. That was most of the 165-177 ms a colocated refit of a 0.5B model took on an
H200, where the bytes themselves copy in well under a millisecond.

With unquantized weights on a GPU and one tensor-parallel rank, the processing changes nothing
and each fused parameter is its sources concatenated along dim 0, in the order of the model's
`packed_modules_mapping`. Whether that holds is not assumed: after the first refit, loaded vLLM's
way, `plan` compares every parameter with what a copy would have written, bit for bit. If all
agree, later refits copy each source tensor into its slice of the parameter (the same storage, so
captured CUDA graphs stay valid). If one differs (the CPU build repacks its GEMM weights; a
quantized or tensor-parallel engine), `plan` returns why, and every refit goes vLLM's way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DirectCopy:
    """Where each refit tensor goes: (a slice of an engine parameter, the tensor's name)."""

    copies: list[tuple[torch.Tensor, str]]

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for destination, name in self.copies:
                destination.copy_(tensors[name])


def _sources(param_name: str, packed: Mapping[str, Sequence[str]]) -> list[str]:
    """The refit tensors a parameter is made of: `...qkv_proj.weight` -> q/k/v_proj, else itself."""
    parts = param_name.split(".")
    for i, part in enumerate(parts):
        if part in packed:
            return [".".join([*parts[:i], sub, *parts[i + 1 :]]) for sub in packed[part]]
    return [param_name]


def plan(
    params: Mapping[str, torch.Tensor],
    packed: Mapping[str, Sequence[str]],
    loaded: Mapping[str, torch.Tensor],
) -> DirectCopy | str:
    """The direct copy for an engine whose `params` were just loaded (vLLM's way) from `loaded`,
    or why a copy would not reproduce that load (the first parameter that disagrees)."""
    copies: list[tuple[torch.Tensor, str]] = []
    for name, param in params.items():
        offset = 0
        for source in _sources(name, packed):
            tensor = loaded.get(source)
            if tensor is None:
                return f"the engine's {name} has no refit tensor {source}"
            rows = tensor.shape[0] if tensor.dim() else 0
            if (
                not rows
                or tensor.dtype != param.dtype
                or tensor.shape[1:] != param.shape[1:]
                or offset + rows > param.shape[0]
            ):
                return (
                    f"the engine's {name} {tuple(param.shape)} {param.dtype} does not hold {source} "
                    f"{tuple(tensor.shape)} {tensor.dtype} at row {offset}"
                )
            destination = param.detach().narrow(0, offset, rows)
            if not torch.equal(destination, tensor.to(destination.device)):
                return f"the engine's {name} holds {source} processed, not as sent (rows from {offset})"
            copies.append((destination, source))
            offset += rows
    return DirectCopy(copies)
