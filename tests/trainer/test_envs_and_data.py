"""The shipped environments, the tokenizer, the resumable prompt loader, and the data row an
example carries through a checkpoint."""

from __future__ import annotations

import io

import pytest
import torch

from asyncgrpo_trainer import data, envs
from asyncgrpo_trainer.buffer import ReplayBuffer
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.tokenizer import CharTokenizer


def test_reverse_is_correct_only_for_the_whole_reversed_string_and_credits_positions() -> None:
    env = envs.build("reverse")
    ex = Example("1234=", "4321")
    assert env.score(ex, "4321", finished=True) == Score(1.0, True)
    assert env.score(ex, "4391", finished=True) == Score(0.75, False)
    assert env.score(ex, "43210000", finished=True) == Score(0.5, False)  # padding never pays
    assert env.score(ex, "43", finished=True) == Score(0.5, False)
    assert env.score(ex, "4321", finished=False) == Score(0.0, False)  # truncated
    assert env.score(ex, "", finished=True) == Score(0.0, False)


def test_reverse_cannot_be_solved_by_a_constant_answer_or_by_copying_the_prompt() -> None:
    """The issue-16 bar: held-out accuracy below 0.1 for any constant and for the prompt itself,
    and no reward above chance (one digit in ten) for either."""
    env = envs.build("reverse")
    held_out = env.builtin_examples(split="validation", count=1000, seed=0)
    assert len({e.prompt for e in held_out}) == 1000  # the whole held-out set, once each
    policies = {f"constant {d * 4}": (lambda e, d=d: d * 4) for d in "0123456789"}
    policies |= {"constant 1234": lambda e: "1234", "copy the prompt": lambda e: e.prompt.rstrip("=")}
    for name, answer in policies.items():
        scores = [env.score(e, answer(e), finished=True) for e in held_out]
        accuracy = sum(s.correct for s in scores) / len(scores)
        reward = sum(s.reward for s in scores) / len(scores)
        assert accuracy < 0.1 and reward < 0.13, (name, accuracy, reward)
    assert sum(env.score(e, e.answer, finished=True).correct for e in held_out) == 1000


def test_reverse_validation_strings_are_held_out_of_training_whatever_the_seed() -> None:
    env = envs.build("reverse")
    val = {e.prompt for e in env.builtin_examples(split="validation", count=1000, seed=0)}
    for seed in (0, 1):
        train = {e.prompt for e in env.builtin_examples(split="train", count=9000, seed=seed)}
        assert len(train) == 9000 and not train & val
    assert val == {e.prompt for e in env.builtin_examples(split="validation", count=1000, seed=5)}


def test_tokenizer_round_trips_and_rejects_unknown_characters() -> None:
    tok = CharTokenizer("0123456789=")
    ids = tok.encode("1234=")
    assert ids[0] == tok.bos_id and tok.decode([*ids[1:], tok.eos_id, 5]) == "1234="
    with pytest.raises(ValueError, match="alphabet"):
        tok.encode("x")


def test_loader_resumes_exactly_where_it_stopped_across_epochs() -> None:
    examples = [Example(str(i), str(i)) for i in range(10)]
    a = data.PromptLoader(examples, 4, seed=7)
    seen = [a.next_batch() for _ in range(2)]
    b = data.PromptLoader(examples, 4, seed=7)
    b.load_state_dict(a.state_dict())
    assert [a.next_batch() for _ in range(4)] == [b.next_batch() for _ in range(4)]
    assert sorted(e.prompt for batch in seen for e in batch[:]) != []  # epochs wrap without error


def test_a_checkpointed_buffer_keeps_each_examples_row_and_one_written_before_rows_still_loads() -> None:
    row = {"prompt": "1234=", "answer": "4321", "meta": {"source": "web", "tags": ["a", 1, None]}}
    buf = ReplayBuffer()
    buf.reserve(Example("1234=", "4321", row=row), start_version=0, target_step=0)
    buf.reserve(Example("5678=", "8765"), start_version=0, target_step=0)
    saved = io.BytesIO()
    torch.save(buf.state_dict(), saved)  # as the controller's checkpoint holds it
    saved.seek(0)
    back = ReplayBuffer.from_state_dict(torch.load(saved, weights_only=False))
    first, second = (s.example for s in back.ordered())
    assert first.row == row
    assert second.row == {"prompt": "5678=", "answer": "8765"}  # a built-in prompt's small row
    old = buf.state_dict()
    for slot in old["slots"]:
        del slot["example"]["row"]  # a checkpoint from before examples kept their row
    assert [s.example.row for s in ReplayBuffer.from_state_dict(old).ordered()] == [
        {"prompt": "1234=", "answer": "4321"},
        {"prompt": "5678=", "answer": "8765"},
    ]
