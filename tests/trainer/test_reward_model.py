"""A reward model (spec.trainer.rewardModel) as a reward source, on real Ray with the torch engine:
a judge taught to say 1 for the reference answer and 0 otherwise gives rewards that separate right
from wrong responses on strings it was never taught on, through the same reward pool as env.function;
a verdict that is no reward fails the group naming rewardModel (never a 0); a missing checkpoint is
invalid data naming rewardModel.path; the verdict rule reads what the guide says it reads."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
import ray

from asyncgrpo_api.v1alpha1.trainer import RewardModelSpec
from asyncgrpo_trainer import judge, reward_model, rewards
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from tests.trainer import judge_checkpoint


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("yes", 1.0),
        ("No.", 0.0),
        (" YES, it is", 1.0),
        ("1", 1.0),
        ("0", 0.0),
        ("0.25 because", 0.25),
        (".5", 0.5),
        ("7", None),
        ("10", None),
        ("-0.5", None),
        ("maybe", None),
        ("yesterday", None),
        ("", None),
    ],
)
def test_the_verdict_is_the_first_word_yes_no_or_a_number_within_0_and_1(
    text: str, reward: float | None
) -> None:
    assert reward_model.verdict(text) == reward


def test_the_template_names_prompt_response_and_reference_and_nothing_else_is_special() -> None:
    example = Example("What is {x}?", "4")
    assert (
        reward_model.render(
            '{"q": "{prompt}", "a": "{response}", "ref": "{reference}"}', example, "{reference}"
        )
        == '{"q": "What is {x}?", "a": "{reference}", "ref": "4"}'
    )


def _pool(directory: Path, **spec: Any) -> rewards.RewardPool:
    settings = RewardModelSpec(path=str(directory), **spec)
    source, ready = judge.start(judge.read(settings, seed=0))
    pool = rewards.RewardPool("reverse", None, 2, 120, reward_model=source)
    ray.get([ready, *pool.ready()], timeout=300)
    return pool


def _score(pool: rewards.RewardPool, example: Example, responses: list[str]) -> list[Score]:
    return asyncio.run(pool.score(example, responses, [True] * len(responses)))


@pytest.mark.trainer
def test_a_taught_judge_separates_right_from_wrong_responses_on_strings_it_never_saw(
    ray_address: str, taught_judge: Path
) -> None:
    pool = _pool(
        taught_judge,
        template=judge_checkpoint.TEMPLATE,
        chatTemplate=False,
        maxNewTokens=2,
        maxSequenceLength=judge_checkpoint.MAX_POSITIONS,
    )
    rng = random.Random(7)
    right, wrong = [], []
    try:
        for text in judge_checkpoint.held_out_strings(24):
            example = Example(f"{text[::-1]}=", text)  # reverse: the reference is the prompt reversed
            scores = _score(pool, example, [text, judge_checkpoint.wrong_answer(rng, text), text])
            assert [s.correct for s in scores] == [True, False, True]  # the environment's accuracy
            right += [scores[0].reward, scores[2].reward]
            wrong.append(scores[1].reward)
    finally:
        for actor in pool.owned_actors():
            ray.kill(actor)
    assert set(right) | set(wrong) <= {0.0, 1.0}
    # The tiny judge is imperfect both ways (judge_checkpoint: about 4 in 5 wrong answers judged 0; its
    # training is not bit-for-bit the same on every machine, and in one CI run 3 of the 24 right
    # strings were judged 0 on both tries: 0.875), but a judge that ignored the response (all 1,
    # all 0, or a coin) could not pass these.
    right_rate, wrong_rate = sum(right) / len(right), sum(wrong) / len(wrong)
    assert right_rate >= 0.75 and wrong_rate <= 0.4 and right_rate - wrong_rate >= 0.5, (right, wrong)


@pytest.mark.trainer
def test_a_verdict_that_gives_no_reward_fails_the_group_naming_reward_model_never_a_zero(
    ray_address: str, tmp_path: Path
) -> None:
    """An untaught (random) judge writes no yes, no or number: each call fails, is retried once, and
    the group's scoring fails, as an env.function that raises does."""
    untaught = make_tiny_checkpoint(tmp_path / "random-judge", max_positions=256)
    pool = _pool(untaught, maxNewTokens=3, maxSequenceLength=256)
    try:
        with pytest.raises(rewards.RewardFailedError) as failed:
            _score(pool, Example("1234=", "4321"), ["4321", "1111"])
    finally:
        for actor in pool.owned_actors():
            ray.kill(actor)
    assert str(failed.value).startswith(
        "scoring failed 2 times; last: ValueError: rewardModel: the judge's verdict "
    )
    assert str(failed.value).endswith(
        "on response 1 of 2 is neither yes, no nor a number in [0, 1]; make rewardModel.template ask for one"
    )


def test_a_missing_judge_checkpoint_is_invalid_data_naming_the_field_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "no-judge"
    with pytest.raises(InvalidDataError) as err:
        judge.read(RewardModelSpec(path=str(missing)), seed=0)
    assert str(err.value) == (
        f"rewardModel.path: {missing} does not exist (is the models volume mounted there?); point it at the "
        "judge's Hugging Face checkpoint directory"
    )
    small = make_tiny_checkpoint(tmp_path / "small-judge", max_positions=256)
    with pytest.raises(InvalidDataError) as err:
        judge.read(RewardModelSpec(path=str(small)), seed=0)  # maxSequenceLength's default: 1024
    assert str(err.value).startswith("rewardModel.maxSequenceLength 1024 exceeds the checkpoint's")
