"""The staleness policy shared by both pumps: admission (rollout side), selection and eviction.

One object answers all of it, so the dispatch gate and the train-side window cannot drift apart.
v is the trainer version (optimizer steps taken), S = asyncRL.maxStalenessVersions, and a
dispatch batch is P prompts. The four modes of docs/guides/async-modes.md map to three classes:

| mode                       | class             | admit batch b | select at version v              |
|----------------------------|-------------------|---------------|----------------------------------|
| sync (S = 0)               | InOrderSampler    | b <= v        | ready groups stamped for step v  |
| async, exact batch-to-step | InOrderSampler    | b <= v + S    | ready groups stamped for step v  |
| streaming, gated dispatch  | WeightFifoSampler | b <= v + S    | ready groups of the oldest       |
|                            |                   |               | in-window start version (waits)  |
| streaming, over-sampled    | WindowedSampler   | always        | ready groups, stamp >= v - S     |

The window is measured on a group's staleness stamp (`buffer.Slot.window_version`): while it is
in flight its start version, once ready the oldest weight version that shaped any of its tokens
(`buffer.GroupRecord.oldest_version`), which an engine's prefix cache can make up to S versions
older than its start. A generated conversation (a multi-turn environment's group) is measured on
its newest token's version instead, and the bound then holds per token: the controller trains only
its policy tokens of version >= v - S.

Eviction removes ready groups that can never be trained on (stamp < v - S, or stamped for a step
already taken). The streaming modes' gates measure the stamp, so a group whose prompt came from an
old cache entry is evicted as soon as its oldest weights leave the window; the gated one then has
the group replaced (`replaces_evicted`). Only the over-sampled mode aborts in-flight groups that
aged out (their start version is already < v - S). The in-order modes select by target step: their
bound is the dispatch gate, on the start version, so by the stamp their data can be up to 2S
versions old when prefixes are cached (the step records' max_oldest_staleness shows it).
Selection never waits to fill a chunk: it returns None when fewer than `min_groups` qualify.
"""

from __future__ import annotations

import abc

from asyncgrpo_trainer.buffer import ReplayBuffer, Slot


class Sampler(abc.ABC):
    """Staleness policy; see the module docstring for the per-mode rules."""

    name: str = ""
    gated: bool = True
    """Whether the rollout pump waits for the trainer before dispatching the next batch."""
    replaces_evicted: bool = False
    """Whether the controller replaces each group this sampler evicts with the loader's next prompt."""

    def __init__(self, max_staleness_versions: int) -> None:
        if max_staleness_versions < 0:
            raise ValueError("maxStalenessVersions must be >= 0")
        self.window = max_staleness_versions

    def may_dispatch(self, batch_index: int, trainer_version: int) -> bool:
        """Whether dispatch batch `batch_index` (0-based) may start at trainer version v."""
        return not self.gated or batch_index <= trainer_version + self.window

    def target_step(self, batch_index: int) -> int | None:
        """The step stamped on groups of `batch_index`; None when selection ignores it."""
        return None

    def required_capacity(self, prompts_per_step: int) -> int:
        """Buffer slots the gated pump may hold at once: P x (S+1)."""
        return prompts_per_step * (self.window + 1)

    def evict(self, buffer: ReplayBuffer, trainer_version: int) -> list[Slot]:
        """Remove and return ready groups that can never be trained on at or after v."""
        return buffer.remove(s.group_id for s in buffer.ready() if self._expired(s, trainer_version))

    def select(
        self, buffer: ReplayBuffer, trainer_version: int, *, min_groups: int, max_groups: int
    ) -> list[Slot] | None:
        """Remove and return between min and max ready groups to train on at v, or None."""
        chosen = self._candidates(buffer, trainer_version)[:max_groups]
        if len(chosen) < min_groups or not chosen:
            return None
        return buffer.remove(s.group_id for s in chosen)

    def should_abort_inflight(self, slot: Slot, trainer_version: int) -> bool:
        """Whether an in-flight group can no longer be trained on, so generating it is waste."""
        return False

    def oldest_version(self, trainer_version: int) -> int:
        """The oldest weight version whose tokens may be trained on at trainer version v: v - S."""
        return trainer_version - self.window

    def _stale(self, slot: Slot, trainer_version: int) -> bool:
        return slot.window_version < self.oldest_version(trainer_version)

    @abc.abstractmethod
    def _expired(self, slot: Slot, trainer_version: int) -> bool: ...

    @abc.abstractmethod
    def _candidates(self, buffer: ReplayBuffer, trainer_version: int) -> list[Slot]: ...


class InOrderSampler(Sampler):
    """Each dispatch batch b is stamped for step b, and step v trains only on its own batch."""

    name = "in_order"

    def target_step(self, batch_index: int) -> int | None:
        return batch_index

    def _expired(self, slot: Slot, trainer_version: int) -> bool:
        return slot.target_step is not None and slot.target_step < trainer_version

    def _candidates(self, buffer: ReplayBuffer, trainer_version: int) -> list[Slot]:
        return [s for s in buffer.ready() if s.target_step == trainer_version]


class WeightFifoSampler(Sampler):
    """Gated streaming: train on the oldest in-window weight version first, a version at a time."""

    name = "weight_fifo"
    replaces_evicted = True
    """Its pump admits one batch of P per trainer version and a step takes P groups, so every group
    evicted (its stamp aged out of the window) must be replaced, or the steps would run short of
    groups until one waited forever."""

    def _expired(self, slot: Slot, trainer_version: int) -> bool:
        return self._stale(slot, trainer_version)

    def _candidates(self, buffer: ReplayBuffer, trainer_version: int) -> list[Slot]:
        live = [s for s in buffer.ordered() if not self._stale(s, trainer_version)]
        if not live:
            return []
        oldest = min(s.start_version for s in live)
        return [s for s in live if s.ready and s.start_version == oldest]

    def select(
        self, buffer: ReplayBuffer, trainer_version: int, *, min_groups: int, max_groups: int
    ) -> list[Slot] | None:
        # A refit in the middle of a dispatch batch splits it over two start versions, so the
        # oldest version can hold fewer groups than a chunk's minimum. Once none of them is still
        # generating, waiting cannot add any: take them as a smaller chunk instead of stalling.
        live = [s for s in buffer.ordered() if not self._stale(s, trainer_version)]
        if live:
            oldest = min(s.start_version for s in live)
            if all(s.ready for s in live if s.start_version == oldest):
                min_groups = 1
        return super().select(buffer, trainer_version, min_groups=min_groups, max_groups=max_groups)


class WindowedSampler(Sampler):
    """Over-sampled streaming: any ready group within the window, in dispatch order."""

    name = "windowed"
    gated = False

    def _expired(self, slot: Slot, trainer_version: int) -> bool:
        return self._stale(slot, trainer_version)

    def _candidates(self, buffer: ReplayBuffer, trainer_version: int) -> list[Slot]:
        return [s for s in buffer.ready() if not self._stale(s, trainer_version)]

    def should_abort_inflight(self, slot: Slot, trainer_version: int) -> bool:
        return self._stale(slot, trainer_version)


def for_spec(*, max_staleness_versions: int, over_sampling: bool, force_in_order: bool) -> Sampler:
    """The sampler of an asyncRL block (force_in_order is ignored in sync mode, S = 0)."""
    if max_staleness_versions == 0:
        if over_sampling:
            raise ValueError("overSampling needs maxStalenessVersions >= 1 (sync mode gates each batch)")
        return InOrderSampler(0)
    if over_sampling:
        if force_in_order:
            raise ValueError("forceInOrder and overSampling exclude each other")
        return WindowedSampler(max_staleness_versions)
    if force_in_order:
        return InOrderSampler(max_staleness_versions)
    return WeightFifoSampler(max_staleness_versions)


def mode_name(*, max_staleness_versions: int, over_sampling: bool, force_in_order: bool) -> str:
    """Human name of the mode, as in the docs' modes table."""
    if max_staleness_versions == 0:
        return "sync"
    if over_sampling:
        return "streaming-oversampled"
    return "async-in-order" if force_in_order else "streaming-gated"
