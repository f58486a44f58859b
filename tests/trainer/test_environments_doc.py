"""docs/guides/environments.md's worked examples, run: every job in it passes admission, the
reward functions it shows are those the jobs name, the single-turn reward functions' jobs (per
response, with the data row, per group) and the reward model's job (with the tests' taught judge)
train (two small steps each, through the real driver, controller and workers), and the environment
class of the guide holds conversations on the torch engine. The calculator's job trains to the end
in test_calculator_learning.py, from the checkpoint the guide's command makes."""

from __future__ import annotations

import asyncio
import copy
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1.trainer import DEFAULT_JUDGE_TEMPLATE
from asyncgrpo_trainer import driver, envs
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.conversation import Budget, converse
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tokenizer import CharTokenizer
from tests.trainer import judge_checkpoint, reward_functions

REPO = Path(__file__).parents[2]
GUIDE = REPO / "docs" / "guides" / "environments.md"
DATA = "/data/"
"""Where the guide's jobs find their data files: docs/examples/data in the repository."""


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def _jobs() -> dict[str, dict[str, Any]]:
    jobs = [yaml.safe_load(b) for b in _blocks("yaml")]
    return {j["metadata"]["name"]: j for j in jobs}


def test_every_job_of_the_guide_passes_admission() -> None:
    jobs = _jobs()
    assert set(jobs) == {
        "reverse-own-reward",
        "reverse-row-reward",
        "reverse-group-reward",
        "reverse-judge",
        "calculator-cpu",
        "guess-cpu",
    }
    for name, job in jobs.items():
        report = validate_manifest(job)
        assert report.ok, (name, [str(e) for e in report.errors])


def test_the_reward_functions_the_guide_shows_are_those_its_jobs_run() -> None:
    shown = [b for b in _blocks("python") if b.startswith("def ")]
    assert len(shown) == 2
    for source in shown:
        name = source.partition("(")[0].removeprefix("def ")
        assert source == inspect.getsource(getattr(reward_functions, name))


def test_the_guide_shows_the_reward_models_default_template() -> None:
    (shown,) = re.findall(r"the default template is\n\n```\n(.*?)\n```", GUIDE.read_text(), flags=re.DOTALL)
    assert shown == DEFAULT_JUDGE_TEMPLATE


def test_the_guides_judge_is_the_one_the_tests_teach() -> None:
    assert _jobs()["reverse-judge"]["spec"]["trainer"]["rewardModel"]["template"] == judge_checkpoint.TEMPLATE


@pytest.mark.trainer
@pytest.mark.parametrize(
    "name",
    ["reverse-own-reward", "reverse-row-reward", "reverse-group-reward", "reverse-judge"],
)
@pytest.mark.budget(
    300,
    "each guide job as written; the judge's, on a cold cache, first teaches the judge (8.5 min in CI)",
)
def test_the_guides_jobs_train(
    name: str, ray_address: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    job = copy.deepcopy(_jobs()[name])
    t = job["spec"]["trainer"]
    data = t.get("data", {})
    if "trainPath" in data:
        data["trainPath"] = str(REPO / "docs/examples/data" / data["trainPath"].removeprefix(DATA))
    if "rewardModel" in t:
        t["rewardModel"]["path"] = str(request.getfixturevalue("taught_judge"))
    job["spec"]["checkpoint"] = {"path": str(tmp_path), "everySteps": 1000, "keepLast": 1}
    t = job["spec"]["trainer"]
    t["grpo"] = {"numPromptsPerStep": 4, "numGenerationsPerPrompt": 4, "maxNumSteps": 2, "valAtEnd": True}
    t["asyncRL"] = {"maxStalenessVersions": 1, "overSampling": False, "forceInOrder": True}
    t.setdefault("data", {})["numValidationPrompts"] = 8
    summary = driver.execute(job)
    assert summary["steps"] == 2
    assert summary["validation_accuracy"] is not None
    steps = [r for r in summary["records"] if "reward_mean" in r]
    assert len(steps) == 2 and all(r["tokens"] > 0 for r in steps)
    assert all(r["reward_failures"] == 0 for r in steps)


def test_the_guides_environment_class_holds_conversations() -> None:
    (source,) = [b for b in _blocks("python") if "class GuessEnvironment" in b]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(GUIDE), "exec"), namespace)
    env = namespace["GuessEnvironment"]()
    assert isinstance(env, envs.MultiTurnEnvironment)
    tok = CharTokenizer(env.alphabet)
    build = ModelBuild(
        tiny_config(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=64,
            max_positions=64,
            position_embedding="rope",
        ),
        seed=0,
        dtype="float32",
        pad_id=tok.pad_id,
        eos_ids=tok.eos_ids,
    )
    engine = generation.TorchGenerationWorker(build, device="cpu", engine="per-group")
    examples = env.builtin_examples(split="train", count=8, seed=0)
    budget = Budget(max_turns=5, tokens_per_turn=2, max_new_tokens=20)
    params = sampling.SamplingParams(max_new_tokens=2)

    async def scenario() -> list[Any]:
        await engine.adopt_weights(0)
        return list(
            await asyncio.gather(
                *(
                    converse(engine, tokenizer=tok, env=env, example=e, params=params, budget=budget, seed=i)
                    for i, e in enumerate(examples)
                )
            )
        )

    for example, conv in zip(examples, asyncio.run(scenario()), strict=True):
        assert 1 <= len(conv.turns) <= 5
        replies = [t for t, m in zip(conv.response_ids, conv.loss_mask, strict=True) if not m]
        assert all(tok.decode([t]) in "<>" for t in replies)
        score = env.score(example, conv.answer, finished=conv.finished)
        assert score.correct == (conv.finished and conv.answer == example.answer)
