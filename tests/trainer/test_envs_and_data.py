"""The shipped environments, the tokenizer and the resumable prompt loader."""

from __future__ import annotations

import pytest

from asyncgrpo_trainer import data, envs
from asyncgrpo_trainer.envs import math as math_env
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.models.tokenizer import CharTokenizer


def test_arithmetic_rewards_exact_answers_partial_numbers_and_nothing_else() -> None:
    env = envs.build("arithmetic")
    ex = Example("3+4=", "7")
    assert env.score(ex, "7", finished=True) == 1.0
    assert env.score(ex, "8", finished=True) == pytest.approx(0.1 + 0.4 * 0.9)
    assert env.score(ex, "7", finished=False) == 0.0  # truncated
    assert env.score(ex, "7+", finished=True) == 0.0
    assert env.score(ex, "", finished=True) == 0.0


def test_arithmetic_validation_pairs_are_held_out_of_training() -> None:
    env = envs.build("arithmetic")
    train = {e.prompt for e in env.builtin_examples(split="train", count=500, seed=0)}
    val = {e.prompt for e in env.builtin_examples(split="validation", count=50, seed=0)}
    assert train and val and not train & val


@pytest.mark.parametrize(
    ("response", "answer", "reward"),
    [
        ("so \\boxed{42}.", "42", 1.0),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("42", "42", 0.0),
        ("\\boxed{4", "4", 0.0),
    ],
)
def test_math_checks_the_last_boxed_answer(response: str, answer: str, reward: float) -> None:
    assert envs.build("math").score(Example("q", answer), response, finished=True) == reward


def test_nested_braces_in_boxed_are_balanced() -> None:
    assert math_env.last_boxed("\\boxed{\\frac{a}{b}} x") == "\\frac{a}{b}"


def test_tokenizer_round_trips_and_rejects_unknown_characters() -> None:
    tok = CharTokenizer("0123456789+=")
    ids = tok.encode("12+3=")
    assert ids[0] == tok.bos_id and tok.decode([*ids[1:], tok.eos_id, 5]) == "12+3="
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
