"""Continuous collection of prompt groups into `StaticDecoder` batches, for the torch engine.

Why: decoding one group (N rows of one prompt) at a time leaves a GPU launch-bound; the controller
keeps many groups in flight, so the engine decodes all of them as one batch instead. Each
`submit` (one `generate` call) queues its N rows; a single runner task takes queued rows, oldest
first and with the same sampling distribution as the oldest, up to `max_rows`, decodes them as one
left-padded batch, and hands each caller its own rows. A group larger than the room left is split
over consecutive batches. Rows that arrive while a batch decodes wait for the next batch (they do
not join at a chunk boundary: the static cache has one write slot for the whole batch, and a
prompt joining late would need its prefill at other slots). Before each batch the runner waits
for the rest of a dispatch wave, `collect_seconds` at a time for as long as rows keep arriving
(cheap next to a batch's decode), so the first groups after idle do not run alone while their
siblings wait for the next batch.

Weights: the runner queues one chunk of `sync_every` steps at a time under the worker's weights
lock and, while the device runs it, leaves the event loop to other calls (a refit's receive
starts at once). A weight update (in place + `refresh_weights`) queued under the lock lands
between two chunks, and the rest of the batch decodes with the new weights on the KV it already
has. Each result's first/last version
are the engine versions when its first batch prefilled and when its last batch ended. No KV
survives a batch (each batch prefills), so there is nothing to reset after an update, and a
sample's oldest version (its staleness stamp) is the version its batch prefilled with: a group
split over batches has the versions of each of its batches.

Busy seconds of a batch (from queuing the prefill or a chunk until the device has finished it,
not the yields between chunks) are split over its groups by their share of its rows: every row
runs the same steps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder

POLL_SECONDS = 0.0002
"""How often the runner looks whether the device finished a chunk (a chunk takes milliseconds)."""

MAX_COLLECT_WAITS = 8
"""Collection waits at most this many `collect_seconds` while rows keep arriving."""


@dataclass(eq=False)
class GroupRun:
    """One `submit`: its rows not yet in a batch, and what its finished batches produced.

    `submit` returns it once all n rows are decoded; the worker turns it into `Generated`.
    """

    prompt_ids: list[int]
    n: int
    params: sampling.SamplingParams
    seed: int
    future: asyncio.Future[GroupRun]
    unscheduled: int
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    oldest_versions: list[int] = field(default_factory=list)
    """Per decoded row: the version its batch prefilled with."""
    first_version: int = -1
    last_version: int = -1
    busy_seconds: float = 0.0


def distribution(params: sampling.SamplingParams) -> DecodeParams:
    """The part of the params a decoder bakes in (its captured graph samples from it)."""
    return DecodeParams(params.temperature, params.top_p, params.top_k)


class GroupBatcher:
    """Queues groups and decodes them in shared batches; see the module docstring.

    `decoder_for(params)` returns the decoder of that distribution and length (the worker keeps one
    per distinct pair); `version()` is the engine's current weights version; `weights_lock` is held
    while a chunk runs, so a writer holding it (across awaits) never sees a decode step midway.
    """

    def __init__(
        self,
        decoder_for: Callable[[sampling.SamplingParams], StaticDecoder],
        version: Callable[[], int],
        weights_lock: asyncio.Lock,
        *,
        max_rows: int,
        collect_seconds: float,
    ) -> None:
        self._decoder_for, self._version, self._lock = decoder_for, version, weights_lock
        self.max_rows, self.collect_seconds = max_rows, collect_seconds
        self._queue: deque[GroupRun] = deque()
        self._runner: asyncio.Task[None] | None = None
        self.busy_seconds = 0.0
        self.tokens_generated = 0
        self.batches = 0

    async def submit(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> GroupRun:
        """Queue n rows of one prompt; resolves when all of them are decoded."""
        future: asyncio.Future[GroupRun] = asyncio.get_running_loop().create_future()
        self._queue.append(GroupRun(list(prompt_ids), n, params, seed, future, unscheduled=n))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="generation-batcher")
        return await future  # a cancelled caller cancels its future; its rows are then skipped

    async def _run(self) -> None:
        while True:
            await self._collect()
            pieces = self._take()
            if not pieces:
                return
            try:
                await self._decode(pieces)
            except Exception as exc:  # the runner serves every caller: fail this batch's, go on
                for group, _ in pieces:
                    if not group.future.done():
                        group.future.set_exception(exc)

    async def _collect(self) -> None:
        """Wait for the rest of a dispatch wave: `collect_seconds` at a time while rows keep arriving
        (the calls of one wave reach the actor one by one), until the batch is full."""

        def queued() -> int:
            return sum(g.unscheduled for g in self._queue)

        for _ in range(MAX_COLLECT_WAITS if self.collect_seconds > 0 else 0):
            before = queued()
            if before >= self.max_rows:
                return
            await asyncio.sleep(self.collect_seconds)
            if queued() == before:
                return

    def _take(self) -> list[tuple[GroupRun, int]]:
        """(group, rows) pieces of the next batch: oldest first, one distribution, <= max_rows."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        if not self._queue:
            return []
        params = self._queue[0].params
        pieces: list[tuple[GroupRun, int]] = []
        room = self.max_rows
        for group in list(self._queue):
            if room == 0:
                break
            if group.params != params or group.future.done():
                continue
            rows = min(group.unscheduled, room)
            group.unscheduled -= rows
            room -= rows
            pieces.append((group, rows))
            if group.unscheduled == 0:
                self._queue.remove(group)
        return pieces

    async def _decode(self, pieces: list[tuple[GroupRun, int]]) -> None:
        params = pieces[0][0].params
        decoder = self._decoder_for(params)
        prompts = [g.prompt_ids for g, rows in pieces for _ in range(rows)]
        async with self._lock:
            first = self._version()
            t0 = time.perf_counter()
            decoding = decoder.start(prompts, seed=pieces[0][0].seed, max_new_tokens=params.max_new_tokens)
        busy = 0.0
        while True:
            async with self._lock:  # queue the chunk; a weight copy queued later runs after it
                decoding.launch()
            while not decoding.ready():  # the device decodes; the actor serves other calls
                await asyncio.sleep(POLL_SECONDS)
            busy += time.perf_counter() - t0
            if decoding.collect() or all(g.future.done() for g, _ in pieces):  # ended, or nobody waits
                break
            await asyncio.sleep(0)  # a weight update, new submissions, other actor calls
            t0 = time.perf_counter()
        t0 = time.perf_counter()
        tokens, logprobs, finished = decoding.output().to_lists() if decoding.finished else ([], [], [])
        busy += time.perf_counter() - t0
        last = self._version()
        self.busy_seconds += busy
        self.tokens_generated += sum(len(t) for t in tokens)
        self.batches += 1
        start = 0
        for group, rows in pieces:
            end = start + rows
            if decoding.finished:
                if not group.tokens:
                    group.first_version = first
                group.tokens += tokens[start:end]
                group.logprobs += logprobs[start:end]
                group.finished += finished[start:end]
                group.oldest_versions += [first] * rows
            group.last_version = last
            group.busy_seconds += busy * rows / len(prompts)
            start = end
            if len(group.tokens) == group.n and not group.future.done():
                group.future.set_result(group)
