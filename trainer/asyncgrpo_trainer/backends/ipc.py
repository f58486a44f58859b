"""CUDA IPC between a policy rank and the generation engine on its GPU (colocated pools).

Two processes that share one GPU cannot form an NCCL group, and the object store would copy the
weights GPU -> host -> GPU. Instead the policy rank `share`s its tensors: CUDA IPC handles (torch's
own `reduce_tensor`, what torch.multiprocessing sends), pickled into bytes so that they pass
through Ray and through vLLM's RPC unchanged. The engine `open_shared`s them: tensors that are
views of the policy's device memory, which it copies into its own weights before it returns, so
the policy's buffers are free again as soon as the engine's call has finished. Both processes must
see the GPU under the same device index (Ray gives colocated actors the same visible device).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping

import torch
from torch.multiprocessing.reductions import reduce_tensor


def share(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """CUDA IPC handles of `tensors` (on a CUDA device), as bytes for `open_shared`."""
    handles = {name: reduce_tensor(t.detach()) for name, t in tensors.items()}  # type: ignore[no-untyped-call]
    return pickle.dumps(handles)


def open_shared(handles: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of another process's memory on this GPU, from `share`'s bytes."""
    for name, (rebuild, args) in pickle.loads(handles).items():
        yield name, rebuild(*args)
