"""The replay buffer: group-granular slots from dispatch to training, in dispatch order.

A slot is reserved when a prompt group is dispatched (so buffer order is dispatch order and
`start_version` never decreases along it), filled by `commit` when all N samples of the group have
been generated and scored, and removed when the trainer selects it, the sampler evicts it, the
controller aborts it, or its rollout fails. Only whole groups ever become ready: a failed or
timed-out generation never turns into zero-reward rows (the reference system's silent bias).

The buffer is a plain object owned by the controller actor; the rollout pump writes and the train
pump reads on the same event loop, so it needs no locks. Its state (ready groups with their data,
and the prompts of groups still in flight) is part of every checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from asyncgrpo_trainer.envs.base import Example


@dataclass(frozen=True)
class GroupRecord:
    """The N samples of one prompt group, as generated and scored."""

    prompt_ids: list[int]
    response_ids: list[list[int]]
    generation_logprobs: list[list[float]]
    rewards: list[float]
    """Per sample: the environment's reward plus the overlong penalty, if any; advantages use these."""
    correct: list[bool]
    """Per sample: exactly the reference answer (`envs.base.Score.correct`); train accuracy."""
    finished: list[bool]
    oldest_version: int
    """The staleness stamp: the oldest weight version that shaped any of its tokens, through their
    KV or logits (`generation.Generated.oldest_versions`). A prompt prefilled from an engine's prefix
    cache makes it older than `first_version`; the staleness gates and metrics measure it."""
    first_version: int
    """Weight version of the generation worker when the first token was sampled."""
    last_version: int
    """Weight version when the last token was sampled (> first_version after an in-flight update)."""
    loss_masks: list[list[int]] | None = None
    """Per sample and response token of a conversation (`conversation`): 1 where the policy spoke,
    0 on the environment's tokens, which are never trained; None for single-turn samples (all 1)."""
    token_versions: list[list[int]] | None = None
    """Per sample and response token of a conversation: the weight version that produced it (its
    turn's stamp); None for single-turn samples (all oldest_version)."""
    tool_outcomes: list[str] = field(default_factory=list)
    """How each tool call of the group's conversations ended (`envs.multiturn.Reply.outcome`)."""

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    def versions_of(self, sample: int) -> list[int]:
        """The weight version of each response token of `sample`."""
        if self.token_versions is not None:
            return self.token_versions[sample]
        return [self.oldest_version] * len(self.response_ids[sample])

    def loss_mask_of(self, sample: int) -> list[int]:
        """Which response tokens of `sample` the policy produced (1) and may be trained on."""
        if self.loss_masks is not None:
            return self.loss_masks[sample]
        return [1] * len(self.response_ids[sample])

    def trainable_mask(self, sample: int, *, oldest_version: int) -> list[int]:
        """The staleness bound per token: `sample`'s policy tokens produced by weight version
        `oldest_version` or newer (1); environment tokens and older policy tokens are 0."""
        versions = self.versions_of(sample)
        return [
            m if v >= oldest_version else 0 for m, v in zip(self.loss_mask_of(sample), versions, strict=True)
        ]


@dataclass
class Slot:
    """One dispatched prompt group."""

    group_id: int
    example: Example
    start_version: int
    """Generation weight version at dispatch: the buffer's order, and the staleness of a group still
    in flight (a ready group's is its record's stamp, `window_version`)."""
    target_step: int | None = None
    """The trainer step this group was dispatched for (in-order samplers only)."""
    record: GroupRecord | None = None
    end_version: int | None = None

    @property
    def ready(self) -> bool:
        return self.record is not None

    @property
    def window_version(self) -> int:
        """The version the staleness window is measured on: the start version while the group is in
        flight (the best known before its samples say which weights shaped them), then its record's
        stamp, the oldest version that shaped any of its tokens; for a generated conversation the
        newest token's version instead. A conversation may outlive several refits; the bound then
        applies per token (`GroupRecord.trainable_mask` drops its policy tokens that are too old)
        rather than to the whole conversation, which would discard its fresh turns with its first."""
        rec = self.record
        if rec is None:
            return self.start_version
        if rec.token_versions is None:
            return rec.oldest_version
        return max((max(v) for v in rec.token_versions if v), default=rec.oldest_version)


@dataclass
class ReplayBuffer:
    """Ordered slots keyed by group id; see the module docstring."""

    slots: dict[int, Slot] = field(default_factory=dict)
    next_group_id: int = 0

    def reserve(self, example: Example, *, start_version: int, target_step: int | None) -> int:
        gid = self.next_group_id
        self.next_group_id += 1
        self.slots[gid] = Slot(gid, example, start_version, target_step)
        return gid

    def commit(self, group_id: int, record: GroupRecord, *, end_version: int) -> None:
        slot = self.slots[group_id]
        if slot.ready:
            raise RuntimeError(f"group {group_id} committed twice")
        slot.record, slot.end_version = record, end_version

    def restart(self, group_id: int, *, start_version: int) -> None:
        """Re-dispatch an unready slot (a retry) from the current weights, keeping its place."""
        self.slots[group_id].start_version = start_version

    def remove(self, group_ids: Iterable[int]) -> list[Slot]:
        return [self.slots.pop(gid) for gid in list(group_ids) if gid in self.slots]

    def ordered(self) -> list[Slot]:
        return list(self.slots.values())

    def ready(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.ready]

    def in_flight(self) -> list[Slot]:
        return [s for s in self.slots.values() if not s.ready]

    def __len__(self) -> int:
        return len(self.slots)

    def state_dict(self) -> dict[str, Any]:
        """Plain data: every slot (in-flight ones without a record are re-dispatched on resume)."""
        return {
            "next_group_id": self.next_group_id,
            "slots": [
                {
                    "group_id": s.group_id,
                    "example": asdict(s.example),
                    "start_version": s.start_version,
                    "target_step": s.target_step,
                    "end_version": s.end_version,
                    "record": asdict(s.record) if s.record is not None else None,
                }
                for s in self.slots.values()
            ],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ReplayBuffer:
        buf = cls(next_group_id=int(state["next_group_id"]))
        for item in state["slots"]:
            rec = item["record"]
            if rec is not None and "oldest_version" not in rec:
                # A checkpoint written before groups carried their stamp: the version its first token
                # was sampled with is the oldest this record knows of.
                rec = {**rec, "oldest_version": rec["first_version"]}
            buf.slots[item["group_id"]] = Slot(
                group_id=item["group_id"],
                example=Example(**item["example"]),
                start_version=item["start_version"],
                target_step=item["target_step"],
                record=GroupRecord(**rec) if rec is not None else None,
                end_version=item["end_version"],
            )
        return buf
