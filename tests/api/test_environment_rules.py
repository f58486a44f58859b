"""The admission rules of environments and reward sources: multi-turn environments (env.class,
env.maxTurns, env.maxTokensPerTurn), env.functionScope, and rewardModel (one reward source; a
template that names the response)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncgrpo_api.rules import validate_manifest

from .conftest import job_with

ENV = "spec.trainer.env"

REJECTED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "class-not-a-class-path",
        job_with(env={"class": "tools.Calculator"}),
        f"{ENV}.class",
        'must be "package.module:Class"',
    ),
    (
        "class-and-name",
        job_with(env={"class": "tools:Calculator", "name": "math"}),
        f"{ENV}.name",
        "must be left unset (its default, reverse) with env.class ('tools:Calculator')",
    ),
    (
        "turns-of-a-single-turn-env",
        job_with(env={"name": "reverse", "maxTurns": 3}),
        f"{ENV}.maxTurns",
        "applies to multi-turn environments only (env.name calculator, or an env.class), and env.name "
        "reverse answers in one turn",
    ),
    (
        "turn-tokens-of-a-single-turn-env",
        job_with(env={"name": "math", "maxTokensPerTurn": 8}, data={"trainPath": "/data/x.jsonl"}),
        f"{ENV}.maxTokensPerTurn",
        "applies to multi-turn environments only",
    ),
    (
        "turn-longer-than-the-conversation",
        job_with(env={"name": "calculator", "maxTokensPerTurn": 17}, generation={"maxNewTokens": 16}),
        f"{ENV}.maxTokensPerTurn",
        "(17) must be at most generation.maxNewTokens (16)",
    ),
    (
        "function-scope-not-a-scope",
        job_with(env={"function": "my_team.rewards:score", "functionScope": "batch"}),
        f"{ENV}.functionScope",
        "input should be 'response' or 'group'; got 'batch'",
    ),
    (
        "two-reward-sources",
        job_with(env={"function": "my_team.rewards:score"}, rewardModel={"path": "/models/judge"}),
        f"{ENV}.function",
        "cannot be set together with rewardModel (/models/judge): each would be the reward trained on; "
        "remove env.function or rewardModel",
    ),
    (
        "judge-template-without-the-response",
        job_with(rewardModel={"path": "/models/judge", "template": "Is {prompt} answered by {reference}?"}),
        "spec.trainer.rewardModel.template",
        "must name {response}",
    ),
    (
        "judge-path-relative",
        job_with(rewardModel={"path": "models/judge"}),
        "spec.trainer.rewardModel.path",
        "should match pattern",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "path", "text"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_a_misconfigured_environment_is_rejected_naming_its_field(
    manifest: dict[str, Any], path: str, text: str
) -> None:
    report = validate_manifest(manifest)
    assert not report.ok
    matching = [e for e in report.errors if e.path == path]
    assert matching, f"no error at {path}: {[str(e) for e in report.errors]}"
    assert text in matching[0].message


@pytest.mark.parametrize(
    "env",
    [
        {"name": "calculator", "maxTurns": 3, "maxTokensPerTurn": 8},
        {"name": "calculator"},
        {"class": "tests.trainer.custom_envs:EchoEnvironment", "maxTurns": 2},
    ],
)
def test_a_multi_turn_environment_with_its_budgets_is_accepted_without_data_files(
    env: dict[str, Any],
) -> None:
    report = validate_manifest(job_with(env=env, generation={"maxNewTokens": 16}))
    assert report.ok, [str(e) for e in report.errors]
    assert report.job is not None
    assert report.job.spec.trainer.env.env_class == env.get("class")


def test_a_reward_model_with_its_defaults_is_accepted_and_keeps_the_environment() -> None:
    report = validate_manifest(job_with(rewardModel={"path": "/models/judge"}, env={"scoreTruncated": True}))
    assert report.ok, [str(e) for e in report.errors]
    assert not [w for w in report.warnings if "env." in w.path]  # scoreTruncated acts on the judge
    assert report.job is not None
    judge = report.job.spec.trainer.reward_model
    assert judge is not None and judge.max_new_tokens == 4 and "{response}" in judge.template
    assert report.job.spec.trainer.env.name == "reverse"  # still reads the data and decides correct
