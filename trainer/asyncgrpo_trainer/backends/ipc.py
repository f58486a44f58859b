"""CUDA IPC between a policy rank and the generation engine on its GPU (colocated pools).

Two processes that share one GPU cannot form an NCCL group, and the object store would copy the
weights GPU -> host -> GPU. Instead the policy rank keeps its weights, in the engines' dtype, in
one flat buffer (`SharedWeights`) and shares that buffer once: a CUDA IPC handle (torch's own
`reduce_tensor`, what torch.multiprocessing sends), pickled into bytes that pass through Ray and
through vLLM's RPC unchanged. The engine opens the handle on the first refit (`OpenedWeights`)
and keeps the mapping: every later refit is the policy's cast into the buffer and the engine's
device-to-device copy out of it, with no handle opened or closed.

Why one buffer, opened once: opening a handle (`cudaIpcOpenMemHandle`) costs about 0.2 ms, and a
0.5B model has 290 tensors. Opened per tensor and per refit, that was most of the 75-80 ms a
colocated refit took into the torch engine. One buffer also lets the policy's cast run as one
pass over its parameters.

The buffer is rewritten only inside `refit_share`, after the engine's previous copy returned (the
synchronizer waits for every engine before the next refit), so the engine never reads a buffer
being written. Both processes must see the GPU under the same device index (Ray gives colocated
actors the same visible device).
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Mapping

import torch
from torch.multiprocessing.reductions import reduce_tensor

Layout = list[tuple[str, int, tuple[int, ...]]]
"""(name, offset in elements, shape) of each tensor in the flat buffer, in order."""


def _views(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    views = {}
    for name, offset, shape in layout:
        numel = 1
        for size in shape:
            numel *= size
        views[name] = flat[offset : offset + numel].view(shape)
    return views


class SharedWeights:
    """The policy rank's side: one flat buffer in `dtype` holding a copy of `like`'s tensors (by
    name and shape), shared by one CUDA IPC handle that stays valid as long as this object."""

    def __init__(self, like: Mapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        layout: Layout = []
        offset = 0
        for name, tensor in like.items():
            layout.append((name, offset, tuple(tensor.shape)))
            offset += tensor.numel()
        device = next(iter(like.values())).device
        self.flat = torch.empty(offset, dtype=dtype, device=device)
        self.views = _views(self.flat, layout)
        # A fresh key per buffer: an engine that opened an older buffer (a restarted policy rank)
        # opens this one instead of copying from a mapping that no longer exists.
        self.handle = pickle.dumps((uuid.uuid4().hex, reduce_tensor(self.flat), layout))  # type: ignore[no-untyped-call]

    def fill(self, tensors: Mapping[str, torch.Tensor]) -> bytes:
        """Copy (and cast) `tensors` into the buffer and wait for the copy: the engine reads after
        this returns. The handle, the same bytes on every refit."""
        with torch.no_grad():
            for name, tensor in tensors.items():
                self.views[name].copy_(tensor)
        torch.cuda.current_stream(self.flat.device).synchronize()
        return self.handle


class OpenedWeights:
    """The engine's side: the views of the policy's buffer, opened on the first handle and kept
    for every later refit that sends the same handle."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._flat: torch.Tensor | None = None  # holds the mapping open
        self.views: dict[str, torch.Tensor] = {}

    def open(self, handle: bytes) -> dict[str, torch.Tensor]:
        """The policy's tensors by name, as views of its buffer on this GPU."""
        key, (rebuild, args), layout = pickle.loads(handle)
        if key != self._key:
            self._flat = rebuild(*args)
            self.views = _views(self._flat, layout)
            self._key = key
        return self.views
