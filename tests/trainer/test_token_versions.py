"""Staleness meets multi-turn (issue 31 item 5): every token of a conversation carries the weight
version that produced it, the staleness window of a conversation is measured on its newest token,
and the bound is applied per token, so a conversation that outlived refits keeps its fresh turns."""

from __future__ import annotations

from pathlib import Path

from asyncgrpo_trainer import sampler
from asyncgrpo_trainer.buffer import GroupRecord, ReplayBuffer
from asyncgrpo_trainer.envs.base import Example
from tests.trainer.test_controller_pumps import FakeGeneration, _controller


def _conversation(versions: list[int], mask: list[int]) -> GroupRecord:
    n = len(versions)
    return GroupRecord(
        prompt_ids=[1],
        response_ids=[[5] * n],
        generation_logprobs=[[-1.0] * n],
        rewards=[1.0],
        correct=[True],
        finished=[True],
        oldest_version=min(versions),
        first_version=min(versions),
        last_version=max(versions),
        loss_masks=[mask],
        token_versions=[versions],
    )


def _single_turn(version: int) -> GroupRecord:
    return GroupRecord([1], [[5, 6]], [[-1.0, -1.0]], [1.0], [True], [True], version, version, version)


def test_policy_tokens_older_than_the_bound_and_environment_tokens_are_not_trained() -> None:
    rec = _conversation([3, 3, 3, 4, 4, 5, 5], [1, 1, 0, 1, 0, 1, 1])
    assert rec.trainable_mask(0, oldest_version=4) == [0, 0, 0, 1, 0, 1, 1]
    assert rec.trainable_mask(0, oldest_version=3) == [1, 1, 0, 1, 0, 1, 1]
    assert rec.trainable_mask(0, oldest_version=6) == [0] * 7


def test_a_single_turn_sample_is_one_version_and_all_policy_tokens() -> None:
    rec = _single_turn(2)
    assert rec.versions_of(0) == [2, 2] and rec.loss_mask_of(0) == [1, 1]


def test_a_conversation_that_outlived_refits_is_kept_while_its_newest_tokens_are_in_the_window() -> None:
    buf = ReplayBuffer()
    long_talk = buf.reserve(Example("a", "a"), start_version=0, target_step=None)
    one_turn = buf.reserve(Example("b", "b"), start_version=0, target_step=None)
    buf.commit(long_talk, _conversation([0, 0, 2, 2, 3], [1, 1, 0, 1, 1]), end_version=3)
    buf.commit(one_turn, _single_turn(0), end_version=0)
    windowed = sampler.for_spec(max_staleness_versions=1, over_sampling=True, force_in_order=False)
    # At trainer version 3 with S = 1, versions >= 2 may be trained: the single-turn group (version 0)
    # is evicted whole; the conversation stays, and only its tokens of version 3 and 2 will train.
    evicted = windowed.evict(buf, 3)
    assert [s.group_id for s in evicted] == [one_turn]
    chosen = windowed.select(buf, 3, min_groups=1, max_groups=4)
    assert chosen is not None and [s.group_id for s in chosen] == [long_talk]
    record = chosen[0].record
    assert record is not None
    assert record.trainable_mask(0, oldest_version=windowed.oldest_version(3)) == [0, 0, 0, 1, 1]


def test_a_conversation_whose_newest_token_is_too_old_is_evicted() -> None:
    buf = ReplayBuffer()
    gid = buf.reserve(Example("a", "a"), start_version=0, target_step=None)
    buf.commit(gid, _conversation([0, 0, 1], [1, 0, 1]), end_version=1)
    windowed = sampler.for_spec(max_staleness_versions=1, over_sampling=True, force_in_order=False)
    assert [s.group_id for s in windowed.evict(buf, 3)] == [gid]


def test_token_versions_survive_a_checkpoint_of_the_buffer() -> None:
    buf = ReplayBuffer()
    gid = buf.reserve(Example("a", "a"), start_version=0, target_step=None)
    buf.commit(gid, _conversation([0, 1, 1], [1, 0, 1]), end_version=1)
    restored = ReplayBuffer.from_state_dict(buf.state_dict())
    record = restored.slots[gid].record
    assert record is not None and record.token_versions == [[0, 1, 1]] and record.loss_masks == [[1, 0, 1]]


def test_the_controller_trains_a_conversation_only_on_its_policy_tokens_within_the_bound(
    tmp_path: Path,
) -> None:
    ctl, _ = _controller(tmp_path, "streaming-oversampled", FakeGeneration())  # S = 1
    ctl.version = 3
    buf = ReplayBuffer()
    gid = buf.reserve(Example("a", "a"), start_version=1, target_step=None)
    buf.commit(gid, _conversation([1, 1, 2, 2, 3], [1, 0, 1, 0, 1]), end_version=3)
    (row,) = ctl._rows([buf.slots[gid]])
    assert row.loss_mask == [0, 0, 1, 0, 1]
    assert row.generation_logprobs == [-1.0] * 5  # each token's importance weight uses its own version's
