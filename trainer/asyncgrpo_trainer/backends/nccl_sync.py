"""Refit transport: broadcast a model's parameters from one rank to the others in packed buckets.

Why buckets: one collective per tensor costs ~20 us of launch and bookkeeping each (measured on
the project's H200s: 290 tensors one by one took 8.4 ms for ~1 GB, against ~3 ms for the same
bytes in one piece), and a single buffer the size of the whole model doubles its memory on both
sides. Packing parameters into a few contiguous buffers of `bucket_bytes` gives a handful of large
broadcasts that run at link speed, and lets packing bucket i+1 overlap the broadcast of bucket i.

Both sides build the same `BucketPlan` from the same parameter names, shapes and dtype (every
worker builds the model from one recipe), so no metadata travels: only the bytes. The sender may
hold fp32 master weights; packing casts to the plan's dtype (the receiver's, e.g. bf16). The
receiver unpacks with one multi-tensor copy per bucket into its model's parameters, in place, so
anything holding those tensors (a captured CUDA graph) sees the new values; packed copies such as
`StaticDecoder`'s must be refreshed after.

Works with any torch.distributed backend that implements broadcast: NCCL between GPUs, gloo on
CPU (what the tests use), over the default group, a registered group, or a directly constructed
backend such as `RefitGroup`'s.

`RefitGroup` is the trainer's use: policy rank 0 and every generation engine join a process group
of their own (a TCPStore served by rank 0 plus a directly constructed ProcessGroupNCCL or
ProcessGroupGloo), so the refit never touches the policy's data-parallel default group and the
engines, which are not in that group, need no torch.distributed state at all. A receiver that
must keep serving while the bytes move (an async generation actor) calls `receive` in a thread and
`unpack` on its own thread, so its model is never half-updated while it decodes.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import PrefixStore, TCPStore

from asyncgrpo_trainer.models.recipe import DTYPES, ModelBuild

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the packed buffers."""

    name: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketPlan:
    """A deterministic layout of named tensors into buckets of one dtype."""

    slots: tuple[Slot, ...]
    bucket_numels: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def build(
        cls,
        shapes: Iterable[tuple[str, tuple[int, ...]]],
        *,
        dtype: torch.dtype,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> BucketPlan:
        """Greedy in the given order; a tensor larger than a bucket gets a bucket of its own.

        bucket_bytes <= 0 means one bucket for everything.
        """
        item = torch.empty((), dtype=dtype).element_size()
        cap = max(bucket_bytes // item, 1) if bucket_bytes > 0 else None
        slots: list[Slot] = []
        numels: list[int] = []
        fill = 0
        for name, shape in shapes:
            n = 1
            for s in shape:
                n *= int(s)
            if not numels or (cap is not None and fill > 0 and fill + n > cap):
                numels.append(0)
                fill = 0
            slots.append(Slot(name, tuple(int(s) for s in shape), len(numels) - 1, fill, n))
            fill += n
            numels[-1] = fill
        return cls(tuple(slots), tuple(numels), dtype)

    @classmethod
    def for_tensors(
        cls,
        named: Iterable[tuple[str, torch.Tensor]],
        *,
        dtype: torch.dtype | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> BucketPlan:
        """Plan for e.g. `model.named_parameters()`; dtype defaults to the first tensor's."""
        items = list(named)
        if not items:
            raise ValueError("nothing to plan")
        dt = dtype if dtype is not None else items[0][1].dtype
        return cls.build(((n, tuple(t.shape)) for n, t in items), dtype=dt, bucket_bytes=bucket_bytes)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_numels)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_numels) * torch.empty((), dtype=self.dtype).element_size()

    def bucket_slots(self, bucket: int) -> list[Slot]:
        return [s for s in self.slots if s.bucket == bucket]

    def check(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Raise unless `named` has exactly the planned names and shapes (a model built from
        another recipe would otherwise receive bytes meant for other tensors)."""
        have = {n: tuple(t.shape) for n, t in named}
        want = {s.name: s.shape for s in self.slots}
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))[:4]
            raise ValueError(f"the model does not match the refit plan (first differences: {diff})")


def refit_plan(build: ModelBuild, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketPlan:
    """The plan both sides of a refit derive from the model recipe alone: its parameters in
    `named_parameters` order, in the model's dtype (what the generation engines hold)."""
    shapes = ((n, tuple(p.shape)) for n, p in build.skeleton().named_parameters())
    return BucketPlan.build(shapes, dtype=DTYPES[build.dtype], bucket_bytes=bucket_bytes)


class BucketedBroadcast:
    """Sender packs and broadcasts; receivers receive and unpack. Every rank of `group` calls
    `sync` with the same plan, the sender with its tensors as the source, the others with theirs
    as the destination. Buffers are allocated once and reused across refits.
    """

    def __init__(
        self,
        plan: BucketPlan,
        *,
        src: int,
        device: torch.device | str,
        group: dist.ProcessGroup | C10dBackend | None = None,
    ) -> None:
        """src is the sender's global rank for the default or a registered group, and its rank in
        `group` for a directly constructed backend (which torch.distributed does not know)."""
        self.plan = plan
        self.src = src
        self.group = group
        self.rank = group.rank() if isinstance(group, C10dBackend) else dist.get_rank()
        self.device = torch.device(device)
        self._buffers = [torch.empty(n, dtype=plan.dtype, device=self.device) for n in plan.bucket_numels]
        # Slots and buffer views per bucket, computed once: a refit does no planning work.
        self._slots = [plan.bucket_slots(b) for b in range(plan.num_buckets)]
        self._view_lists = [
            [buf[s.offset : s.offset + s.numel].view(s.shape) for s in slots]
            for buf, slots in zip(self._buffers, self._slots, strict=True)
        ]
        # `receive` runs on a stream of its own: a collective waits for everything queued on the
        # stream it is issued on, and the receiver's default stream holds its queued decode work.
        self._receive_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # type: ignore[no-untyped-call]
        self._unpacked: torch.cuda.Event | None = None  # the last unpack's copies, queued

    def _views(self, bucket: int) -> list[torch.Tensor]:
        return self._view_lists[bucket]

    def _tensors(self, bucket: int, tensors: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for s in self._slots[bucket]:
            t = tensors[s.name]
            if tuple(t.shape) != s.shape:
                raise ValueError(f"{s.name}: shape {tuple(t.shape)} != planned {s.shape}")
            out.append(t)
        return out

    def _broadcast(self, bucket: int) -> dist.Work:
        buf = self._buffers[bucket]
        if isinstance(self.group, C10dBackend):
            opts = dist.BroadcastOptions()
            opts.rootRank = self.src
            direct: dist.Work = self.group.broadcast([buf], opts)  # type: ignore[attr-defined]
            return direct
        work: dist.Work | None = dist.broadcast(buf, self.src, group=self.group, async_op=True)
        assert work is not None
        return work

    @torch.no_grad()
    def sync(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Broadcast `tensors` from src into every other rank's `tensors` (same names and shapes).

        Returns once this rank's part is done (on CUDA: queued on the current stream; the
        received values are visible to work queued after this call).
        """
        sender = self.rank == self.src
        works = []
        for b in range(self.plan.num_buckets):
            if sender:
                _copy(self._views(b), self._tensors(b, tensors))
            works.append(self._broadcast(b))
        for b, work in enumerate(works):
            work.wait()
            if not sender:
                _copy(self._tensors(b, tensors), self._views(b))

    def receive(self) -> None:
        """A receiver's half of `sync` without the unpack: every bucket lands in this object's
        buffers and the call blocks until they are complete (on CUDA too), so it may run in a
        thread while the caller's model stays in use; `unpack` then writes the model.

        On CUDA the broadcasts run on the receive stream, which waits only for the previous
        unpack's copies out of the same buffers, not for the decode work queued meanwhile: the
        sender (and the trainer behind it) is not held up by the engine's queued chunk."""
        if self.rank == self.src:
            raise RuntimeError("the sender calls sync, not receive")
        if self._receive_stream is None:
            for work in [self._broadcast(b) for b in range(self.plan.num_buckets)]:
                work.wait()
            return
        with torch.cuda.stream(self._receive_stream):
            if self._unpacked is not None:
                self._receive_stream.wait_event(self._unpacked)
            for work in [self._broadcast(b) for b in range(self.plan.num_buckets)]:
                work.wait()
        self._receive_stream.synchronize()

    def received(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of the last `receive`, as views of this object's buffers in the plan's
        dtype, valid until the next receive: for a receiver that copies them itself (vLLM's
        `load_weights` fuses and shards them on its way into its own parameters)."""
        for slots, views in zip(self._slots, self._view_lists, strict=True):
            yield from zip((s.name for s in slots), views, strict=True)

    @torch.no_grad()
    def unpack(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the last received buckets into `tensors`, in place (on CUDA: queued on the
        current stream, so work queued before sees the old values and work queued after the new)."""
        for b in range(self.plan.num_buckets):
            _copy(self._tensors(b, tensors), self._views(b))
        if self._receive_stream is not None:
            self._unpacked = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._unpacked.record()


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Many small copies as few kernels (multi-tensor apply), casting dtype and moving device."""
    if all(d.device == s.device for d, s in zip(dst, src, strict=True)):
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src, strict=True):
            d.copy_(s, non_blocking=True)


def naive_broadcast(
    tensors: Mapping[str, torch.Tensor], *, src: int, group: dist.ProcessGroup | None = None
) -> None:
    """One broadcast per tensor, in name order: the baseline the buckets are measured against."""
    for name in sorted(tensors):
        dist.broadcast(tensors[name], src, group=group)


REFIT_STORE_PREFIX = "asyncgrpo-refit"


@dataclass(frozen=True)
class RefitSpec:
    """What every member of a refit group needs to join it (a picklable message)."""

    host: str
    port: int
    world: int
    backend: str  # nccl or gloo
    bucket_bytes: int
    timeout_seconds: float

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_seconds)


def serve_store(host: str, world: int, timeout_seconds: float) -> TCPStore:
    """The refit group's rendezvous, served by its rank 0 on a free port (`store.port`): no port
    is picked and then bound separately, so two jobs on one node cannot race for it."""
    timeout = datetime.timedelta(seconds=timeout_seconds)
    return TCPStore(host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)


class RefitGroup:
    """One member of the refit group (see the module docstring); rank 0 sends.

    Joining checks `named` (the member's parameters) against the plan of the model recipe, which
    every member derives alone. Constructing it joins the group: with gloo the constructor returns
    once every member has connected, so the members must construct concurrently; NCCL connects
    at the first broadcast. Rank 0 passes the store it serves.
    """

    def __init__(
        self,
        spec: RefitSpec,
        *,
        rank: int,
        build: ModelBuild,
        named: Iterable[tuple[str, torch.Tensor]],
        device: torch.device,
        store: TCPStore | None = None,
    ) -> None:
        self.plan = refit_plan(build, spec.bucket_bytes)
        self.plan.check(named)
        if store is None:
            store = TCPStore(spec.host, spec.port, spec.world, is_master=False, timeout=spec.timeout)
        prefixed = PrefixStore(REFIT_STORE_PREFIX, store)
        pg: C10dBackend
        if spec.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = spec.timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, spec.world, opts)
        elif spec.backend == "gloo":
            pg = dist.ProcessGroupGloo(prefixed, rank, spec.world, spec.timeout)
        else:
            raise ValueError(f"refit backend {spec.backend!r}: expected nccl or gloo")
        self.store, self.pg = store, pg  # the store must outlive the group
        self.broadcast = BucketedBroadcast(self.plan, src=0, device=device, group=pg)
