"""The reward workers as real Ray actors: a user's reward function by import path, the deadline and
the one retry, and a failure that ends as RewardFailedError (the group is dropped), never as 0."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest
import ray

from asyncgrpo_api.v1alpha1.trainer import FunctionScope
from asyncgrpo_trainer import data, envs, reward_function, rewards
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

pytestmark = pytest.mark.trainer
FUNCTIONS = "tests.trainer.reward_functions"


def _pool(
    function: str, workers: int, timeout_seconds: float, scope: FunctionScope = "response"
) -> rewards.RewardPool:
    """A started pool: the driver waits for its workers too (`RewardPool.ready`), so that a deadline
    never covers a worker's start."""
    pool = rewards.RewardPool(
        "reverse", f"{FUNCTIONS}:{function}", workers, timeout_seconds, function_scope=scope
    )
    ray.get(pool.ready(), timeout=300)
    return pool


def _score(pool: rewards.RewardPool, example: Example, responses: list[str]) -> list[Score]:
    return asyncio.run(pool.score(example, responses, [True] * len(responses)))


def test_a_user_function_gives_the_reward_and_the_environment_the_accuracy(ray_address: str) -> None:
    pool = _pool("exact", 1, timeout_seconds=30)
    scores = _score(pool, Example("1234=", "4321"), ["4321", "4329", "x"])
    # reverse alone would give 1.0, 0.75, 0.0; the function's rewards replace those
    assert scores == [Score(1.0, True), Score(0.25, False), Score(0.0, False)]


def test_a_reward_function_that_raises_is_called_twice_then_the_group_fails(
    ray_address: str, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    pool = _pool("logs_then_raises", 2, timeout_seconds=30)
    with pytest.raises(rewards.RewardFailedError, match="RuntimeError: the reward service is down"):
        _score(pool, Example(str(calls), "4321"), ["4321", "4329"])
    assert calls.read_text().splitlines() == ["4321", "4321"]  # the call and one retry, each failing at once


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("returns_text", "TypeError: .*returned str '1.0'; it must return a float"),
        ("always_raises", "ValueError"),
    ],
)
def test_a_reward_that_is_not_a_float_or_an_error_is_a_failure_not_a_zero(
    ray_address: str, function: str, error: str
) -> None:
    pool = _pool(function, 1, timeout_seconds=30)
    with pytest.raises(rewards.RewardFailedError, match=error):
        _score(pool, Example("1234=", "4321"), ["4321"])


def test_a_stuck_function_is_cut_at_the_deadline_its_worker_replaced_and_the_pool_keeps_scoring(
    ray_address: str,
) -> None:
    pool = _pool("hangs_on_hang", 1, timeout_seconds=5)
    first = pool.actors[0]
    assert _score(pool, Example("1234=", "4321"), ["4321"]) == [Score(1.0, True)]  # the worker is up

    async def stuck_then_fine() -> list[Score]:
        with pytest.raises(
            rewards.RewardFailedError, match=re.escape("timed out after 5s (env.timeoutSeconds)")
        ):
            await pool.score(Example("1234=", "4321"), ["hang"], [True])
        return await pool.score(Example("1234=", "4321"), ["4321"], [True])

    t0 = time.monotonic()
    assert asyncio.run(stuck_then_fine()) == [Score(1.0, True)]
    assert time.monotonic() - t0 < 60  # two deadlines and two fresh workers, not an hour
    assert pool.actors[0] is not first
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(first.score.remote(Example("1234=", "4321"), ["4321"], [True]), timeout=30)  # killed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:f", "env.function: cannot import 'no_such_module_xyz' (ModuleNotFoundError"),
        (f"{FUNCTIONS}:missing", f"env.function: {FUNCTIONS}:missing: {FUNCTIONS}.missing does not exist"),
        (f"{FUNCTIONS}:NOT_A_FUNCTION", "NOT_A_FUNCTION is not callable"),
    ],
)
def test_a_reward_function_that_cannot_be_used_is_invalid_data(spec: str, message: str) -> None:
    with pytest.raises(InvalidDataError) as err:
        reward_function.check(spec)
    assert message in str(err.value)


def test_the_driver_checks_the_function_without_running_user_code_in_its_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, FUNCTIONS, raising=False)
    reward_function.check(f"{FUNCTIONS}:exact")
    assert FUNCTIONS not in sys.modules  # imported in a child process, not here


def _actor(
    function: str, *, score_truncated: bool = False, scope: FunctionScope = "response"
) -> rewards.RewardActor:
    """The reward actor's class in this process (Ray only hosts it)."""
    return rewards.RewardActor("reverse", f"{FUNCTIONS}:{function}", score_truncated, function_scope=scope)


def test_a_truncated_response_is_rewarded_0_without_the_function_that_ignores_truncation() -> None:
    """`exact` rewards the right digits however the response ended: a policy that writes the answer
    and never stops would collect full reward from it."""
    actor = _actor("exact")
    scores = actor.score(Example("1234=", "4321"), ["4321", "4321", "43"], [True, False, False])
    assert scores == [Score(1.0, True), Score(0.0, False), Score(0.0, False)]


def test_score_truncated_hands_truncated_responses_to_the_function() -> None:
    actor = _actor("exact", score_truncated=True)
    scores = actor.score(Example("1234=", "4321"), ["4321", "43"], [False, False])
    assert scores == [Score(1.0, False), Score(0.25, False)]  # the function's rewards; never correct


def test_a_function_that_takes_the_stop_reason_gets_finished_or_truncated() -> None:
    actor = _actor("half_for_truncated", score_truncated=True)
    scores = actor.score(Example("1234=", "4321"), ["4321", "4321"], [True, False])
    assert [s.reward for s in scores] == [1.0, 0.5]
    assert reward_function.load(f"{FUNCTIONS}:takes_keywords").takes_stop_reason
    assert not reward_function.load(f"{FUNCTIONS}:exact").takes_stop_reason


def test_a_group_function_ranks_each_response_against_its_siblings(ray_address: str) -> None:
    pool = _pool("best_in_group", 2, timeout_seconds=30, scope="group")
    example = Example("1234=", "4321")
    # "4329" has three positions right: the worst of a group with the answer, the best of one without
    assert _score(pool, example, ["4321", "4329", "x"]) == [
        Score(1.0, True),
        Score(0.0, False),
        Score(0.0, False),
    ]
    assert _score(pool, example, ["4329", "4300", "x"]) == [
        Score(1.0, False),
        Score(0.0, False),
        Score(0.0, False),
    ]


def test_a_group_function_sees_only_the_finished_responses_unless_score_truncated() -> None:
    example = Example("1234=", "4321")
    responses, finished = ["4321", "4321", "43"], [True, False, False]
    ranked = _actor("best_in_group", scope="group").score(example, responses, finished)
    assert [s.reward for s in ranked] == [1.0, 0.0, 0.0]  # the truncated ones: 0, never shown
    seen = _actor("finished_one_truncated_half", score_truncated=True, scope="group").score(
        example, responses, finished
    )
    assert [s.reward for s in seen] == [1.0, 0.5, 0.5]  # shown, with their stop reasons
    none_finished = _actor("one_reward_short", scope="group").score(example, ["43", "4"], [False, False])
    assert [s.reward for s in none_finished] == [0.0, 0.0]  # not called: it would have failed


def test_a_group_function_returning_the_wrong_number_of_rewards_fails_the_group_naming_the_field(
    ray_address: str,
) -> None:
    pool = _pool("one_reward_short", 1, timeout_seconds=30, scope="group")
    with pytest.raises(rewards.RewardFailedError) as failed:
        _score(pool, Example("1234=", "4321"), ["4321", "4329", "1"])
    assert str(failed.value) == (
        f"scoring failed 2 times; last: ValueError: env.function {FUNCTIONS}:one_reward_short returned 2 "
        "rewards for 3 responses; with env.functionScope group it must return one float per response, in "
        "their order"
    )


def test_a_function_reads_a_metadata_column_of_its_data_row(ray_address: str, tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    rows = [
        {"prompt": "1234=", "answer": "4321", "points": 3},
        {"prompt": "5678=", "answer": "8765", "points": 7},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = data.load_prompts(
        envs.build("reverse"),
        CharTokenizer("0123456789="),
        train_path=str(train),
        validation_path=None,
        prompt_key="prompt",
        answer_key="answer",
        num_validation=0,
        max_prompt_length=16,
        seed=0,
    )
    pool = _pool("points_from_row", 1, timeout_seconds=30)
    first, second = prompts.train
    assert [s.reward for s in _score(pool, first, ["4321", "4320"])] == [3.0, 0.0]
    assert [s.reward for s in _score(pool, second, ["8765"])] == [7.0]


@pytest.mark.parametrize(
    ("function", "scope", "message"),
    [
        (
            "exact",
            "group",
            f"env.function: {FUNCTIONS}:exact: its parameter 'response' is annotated str, but "
            "env.functionScope group passes the list of a group's responses; set env.functionScope response "
            "or change the function",
        ),
        (
            "best_in_group",
            "response",
            f"env.function: {FUNCTIONS}:best_in_group: its parameter 'responses' is annotated list, "
            "but env.functionScope response passes one response's text; set env.functionScope group or "
            "change the function",
        ),
    ],
)
def test_a_function_annotated_for_the_other_scope_is_invalid_data(
    function: str, scope: FunctionScope, message: str
) -> None:
    with pytest.raises(InvalidDataError) as err:
        reward_function.check(f"{FUNCTIONS}:{function}", scope)
    assert str(err.value) == message


def test_a_function_that_cannot_take_three_arguments_is_invalid_data() -> None:
    with pytest.raises(
        InvalidDataError, match=r"cannot be called as function\(prompt, responses, reference_answer\)"
    ):
        reward_function.load("builtins:len", "group")
