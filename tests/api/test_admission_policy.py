"""The chart's ValidatingAdmissionPolicy and the webhook's rules agree, evaluated for real.

The policy's CEL is evaluated by cel-python (celpy) on jobs as the API server stores them
(defaults filled in, unset fields absent); the rules by `validate_manifest`, as the webhook runs
them. Every invariant is checked on a table of a good and a bad job, then on a few hundred jobs
drawn around every threshold; the whole policy on creates and updates. That the real API server
evaluates the same CEL the same way is tests/e2e/test_admission_policy.py.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import celpy
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncgrpo_api import admissionpolicy
from asyncgrpo_api.admissionpolicy import FINDINGS, NOW, broken, message, spec_schema
from asyncgrpo_api.expressions import Field, Printer, UnprovableError, UnsetFieldError, evaluate, render
from asyncgrpo_api.invariants import INVARIANTS
from asyncgrpo_api.rules import Finding, validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from tests.chart.helm import CHART

SCHEMA = spec_schema()
BY_NAME = {invariant.name: invariant for invariant in INVARIANTS}


def job(name: str = "job", cluster: dict[str, Any] | None = None, **trainer: Any) -> dict[str, Any]:
    """A job with these trainer blocks, and spec.cluster when given."""
    manifest: dict[str, Any] = {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "image": "trainer:test",
            "trainer": {"grpo": {"numPromptsPerStep": 8, "numGenerationsPerPrompt": 4}},
        },
    }
    merge(manifest["spec"]["trainer"], trainer)
    if cluster is not None:
        manifest["spec"]["cluster"] = copy.deepcopy(cluster)
    return manifest


def merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def stored(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The object as the API server stores it and a policy sees it: defaults in, unset fields out."""
    return AsyncGRPOJob.model_validate(manifest).to_manifest()


@functools.cache
def program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions={"join": _join})


def _join(items: Any, separator: Any) -> celpy.celtypes.StringType:
    """CEL's strings extension (Kubernetes has it; cel-python does not): list.join(separator)."""
    return celpy.celtypes.StringType(str(separator).join(str(item) for item in items))


def cel(expression: str, **activation: Any) -> Any:
    return program(expression).evaluate({key: celpy.json_to_cel(value) for key, value in activation.items()})


Verdicts = dict[str, tuple[bool, str]]
"""Per invariant: whether the job breaks it, and the finding's `path: message` if so."""


def webhook_verdicts(manifest: Mapping[str, Any]) -> Verdicts:
    """What the webhook's rules say (`validate_manifest`), invariant by invariant."""
    report = validate_manifest(manifest)
    assert report.parsed is not None, report.errors
    spec = report.parsed.spec.model_dump(mode="json", by_alias=True)
    verdicts: Verdicts = {}
    for invariant in INVARIANTS:
        if evaluate(invariant.broken, spec):
            finding = Finding(invariant.path, render(invariant.message, spec))
            assert finding in report.errors, "the webhook reports it"
            verdicts[invariant.name] = (True, str(finding))
        else:
            verdicts[invariant.name] = (False, "")
    return verdicts


def policy_verdicts(manifest: Mapping[str, Any]) -> Verdicts:
    """What the policy's CEL says, invariant by invariant, on the object as stored."""
    obj = stored(manifest)
    verdicts: Verdicts = {}
    for invariant in INVARIANTS:
        if cel(broken(invariant, NOW, SCHEMA), object=obj):
            verdicts[invariant.name] = (True, str(cel(message(invariant, NOW, SCHEMA), object=obj)))
        else:
            verdicts[invariant.name] = (False, "")
    return verdicts


# --- each invariant on a good and a bad job -------------------------------------------------------

TABLE: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "generationMinAboveReplicas": (
        {"cluster": {"generationWorkers": {"replicas": 2, "minReplicas": 2, "maxReplicas": 3}}},
        {"cluster": {"generationWorkers": {"replicas": 2, "minReplicas": 3, "maxReplicas": 3}}},
    ),
    "generationMaxBelowReplicas": (
        {"cluster": {"generationWorkers": {"replicas": 2, "maxReplicas": 2}}},
        {"cluster": {"generationWorkers": {"replicas": 2, "minReplicas": 1, "maxReplicas": 1}}},
    ),
    "syncModeOverSampled": (
        {"asyncRL": {"maxStalenessVersions": 1, "overSampling": True, "maxBufferedRollouts": 16}},
        {"asyncRL": {"maxStalenessVersions": 0, "overSampling": True}},
    ),
    "inOrderOverSampled": (
        {"asyncRL": {"forceInOrder": True}},
        {"asyncRL": {"forceInOrder": True, "overSampling": True}},
    ),
    "bufferNotExact": ({"asyncRL": {"maxBufferedRollouts": 16}}, {"asyncRL": {"maxBufferedRollouts": 17}}),
    "bufferBelowCapacity": (
        {"asyncRL": {"overSampling": True, "maxBufferedRollouts": 40}},
        {"asyncRL": {"overSampling": True, "maxBufferedRollouts": 15}},
    ),
    "streamingChunkAboveStep": (
        {"asyncRL": {"minGroupsForStreamingTrain": 8}},
        {"asyncRL": {"minGroupsForStreamingTrain": 9}},
    ),
    "globalBatchNotADivisor": (
        {"policy": {"trainGlobalBatchSize": 16}},
        {"policy": {"trainGlobalBatchSize": 12}},
    ),
    "miniBatchesOnMegatron": (
        {"policy": {"trainGlobalBatchSize": 32, "backend": "megatron"}},
        {"policy": {"trainGlobalBatchSize": 16, "backend": "megatron"}},
    ),
    "watchdogBeforeRolloutTimeout": (
        {"asyncRL": {"rolloutTimeoutSeconds": 60, "stallTimeoutSeconds": 61}},
        {"asyncRL": {"rolloutTimeoutSeconds": 60, "stallTimeoutSeconds": 60}},
    ),
    "dynamicSamplingOneSample": (
        {"grpo": {"dynamicSampling": True, "numGenerationsPerPrompt": 2}},
        {"grpo": {"dynamicSampling": True, "numGenerationsPerPrompt": 1}},
    ),
    "overlongPenaltyAboveMaxNewTokens": (
        {"grpo": {"overlongPenaltyTokens": 16}, "generation": {"maxNewTokens": 16}},
        {"grpo": {"overlongPenaltyTokens": 17}, "generation": {"maxNewTokens": 16}},
    ),
    "sequenceRatiosWithSequenceMask": (
        {"loss": {"sequenceLevelImportanceRatios": True, "tokenLevelLoss": False}},
        {
            "loss": {
                "sequenceLevelImportanceRatios": True,
                "tokenLevelLoss": False,
                "truncatedImportanceSamplingType": "seq-mask-tis",
                "truncatedImportanceSamplingRatioMin": 0.999,
                "truncatedImportanceSamplingRatio": 1.002,
            }
        },
    ),
    "sequenceRatiosWithTokenLoss": (
        {"loss": {"sequenceLevelImportanceRatios": True, "tokenLevelLoss": False}},
        {"loss": {"sequenceLevelImportanceRatios": True}},
    ),
    "constantNormalizerWithoutTokenLoss": (
        {"loss": {"constantNormalizer": True}},
        {"loss": {"constantNormalizer": True, "tokenLevelLoss": False}},
    ),
    "megatronTopP": (
        {"policy": {"backend": "megatron"}},
        {"policy": {"backend": "megatron"}, "generation": {"topP": 0.9}},
    ),
    "megatronTopK": (
        {"generation": {"topK": 20}},
        {"policy": {"backend": "megatron"}, "generation": {"topK": 20}},
    ),
    "pretrainedWithoutPath": (
        {"model": {"source": "pretrained", "path": "/models/qwen"}},
        {"model": {"source": "pretrained"}},
    ),
    "chatTemplateOnTinyModel": ({"data": {"chatTemplate": False}}, {"data": {"chatTemplate": True}}),
    "systemPromptWithoutTemplate": (
        {"model": {"source": "pretrained", "path": "/m"}, "data": {"systemPrompt": "be brief"}},
        {"data": {"systemPrompt": "be brief"}},
    ),
    "vllmOnTinyModel": (
        {"model": {"source": "pretrained", "path": "/m"}, "generation": {"backend": "vllm"}},
        {"generation": {"backend": "vllm"}},
    ),
    "headsSplitHidden": (
        {"model": {"tiny": {"hiddenSize": 64, "numHeads": 4}}},
        {"model": {"tiny": {"numHeads": 3, "numKvHeads": 1}}},
    ),
    "kvHeadsSplitHeads": ({"model": {"tiny": {"numKvHeads": 4}}}, {"model": {"tiny": {"numKvHeads": 3}}}),
    "sequenceTooLong": (
        {"data": {"maxPromptLength": 100}, "generation": {"maxNewTokens": 28}},
        {"data": {"maxPromptLength": 100}, "generation": {"maxNewTokens": 29}},
    ),
    "tokenBudgetBelowLongestRow": (
        {
            "data": {"maxPromptLength": 64},
            "generation": {"maxNewTokens": 16},
            "policy": {"maxTokensPerMicroBatch": 80},
        },
        {
            "data": {"maxPromptLength": 64},
            "generation": {"maxNewTokens": 16},
            "policy": {"maxTokensPerMicroBatch": 79},
        },
    ),
    "megatronTokenBudget": (
        {"policy": {"maxTokensPerMicroBatch": 256}},
        {"policy": {"backend": "megatron", "maxTokensPerMicroBatch": 256}},
    ),
    "fsdpOnMegatron": (
        {"policy": {"sharding": {"strategy": "fsdp"}}},
        {"policy": {"backend": "megatron", "sharding": {"strategy": "fsdp"}}},
    ),
    "activationCheckpointingOnMegatron": (
        {"policy": {"activationCheckpointing": True}},
        {"policy": {"backend": "megatron", "activationCheckpointing": True}},
    ),
    "promptsWithoutData": (
        {"env": {"name": "gsm8k"}, "data": {"trainPath": "/data/train.jsonl"}},
        {"env": {"name": "gsm8k"}},
    ),
    "answerKeyIsPromptKey": ({"data": {"answerKey": "solution"}}, {"data": {"answerKey": "prompt"}}),
    "rewardFunctionShape": (
        {"env": {"function": "my_rewards.scoring:score"}},
        {"env": {"function": "my_rewards.scoring.score"}},
    ),
    "twoRewardSources": (
        {"rewardModel": {"path": "/models/judge"}},
        {"rewardModel": {"path": "/models/judge"}, "env": {"function": "my_rewards.scoring:score"}},
    ),
    "judgeTemplateWithoutResponse": (
        {"rewardModel": {"path": "/models/judge", "template": "Q: {prompt}\nA: {response}\nRight?"}},
        {"rewardModel": {"path": "/models/judge", "template": "Q: {prompt}\nRight?"}},
    ),
    "environmentClassShape": (
        {"env": {"class": "my_envs.tools:Calculator"}},
        {"env": {"class": "my_envs.tools.Calculator"}},
    ),
    "environmentNamedTwice": (
        {"env": {"class": "my_envs.tools:Calculator"}},
        {"env": {"class": "my_envs.tools:Calculator", "name": "calculator"}},
    ),
    "turnsOfSingleTurnEnvironment": (
        {"env": {"name": "calculator", "maxTurns": 3}},
        {"env": {"name": "reverse", "maxTurns": 3}},
    ),
    "turnTokensOfSingleTurnEnvironment": (
        {"env": {"class": "my_envs.tools:Calculator", "maxTokensPerTurn": 4}},
        {"env": {"name": "reverse", "maxTokensPerTurn": 4}},
    ),
    "turnTokensOverResponse": (
        {"env": {"name": "calculator", "maxTokensPerTurn": 16}, "generation": {"maxNewTokens": 16}},
        {"env": {"name": "calculator", "maxTokensPerTurn": 17}, "generation": {"maxNewTokens": 16}},
    ),
}


def test_every_invariant_has_a_good_and_a_bad_job_in_the_table() -> None:
    assert set(TABLE) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_policy_and_the_webhook_judge_the_good_and_the_bad_job_alike(name: str) -> None:
    invariant = BY_NAME[name]
    good, bad = (job(name.lower(), **changes) for changes in TABLE[name])
    assert webhook_verdicts(good)[name] == policy_verdicts(good)[name] == (False, "")
    refused, finding = webhook_verdicts(bad)[name]
    assert refused and finding.startswith(f"{invariant.path}: ")
    assert policy_verdicts(bad)[name] == (True, finding), "the policy's message is the webhook's finding"


# --- every invariant on jobs drawn around its thresholds ----------------------------------------

UNSET = None


def unset_or(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from((UNSET, *values))


TRAINERS = st.fixed_dictionaries(
    {
        "cluster": st.fixed_dictionaries(
            {
                "generationWorkers": st.fixed_dictionaries(
                    {
                        "replicas": st.sampled_from((1, 2, 3)),
                        "minReplicas": unset_or(1, 2, 3),
                        "maxReplicas": unset_or(1, 2, 3, 4),
                    }
                )
            }
        ),
        "grpo": st.fixed_dictionaries(
            {
                "numPromptsPerStep": st.sampled_from((1, 2, 4, 8)),
                "numGenerationsPerPrompt": st.sampled_from((1, 2, 4)),
                "dynamicSampling": st.booleans(),
                "overlongPenaltyTokens": unset_or(1, 16, 64, 65),
            }
        ),
        "asyncRL": st.fixed_dictionaries(
            {
                "maxStalenessVersions": st.sampled_from((0, 1, 2)),
                "overSampling": st.booleans(),
                "forceInOrder": unset_or(True, False),
                "maxBufferedRollouts": unset_or(1, 4, 8, 15, 16, 17, 24, 40),
                "minGroupsForStreamingTrain": unset_or(1, 4, 8, 9),
                "stallTimeoutSeconds": st.sampled_from((5.0, 60.0, 600.0)),
                "rolloutTimeoutSeconds": unset_or(5.0, 60.0),
            }
        ),
        "policy": st.fixed_dictionaries(
            {
                "backend": st.sampled_from(("torch", "megatron")),
                "trainGlobalBatchSize": unset_or(1, 3, 4, 8, 12, 32, 40),
                "maxTokensPerMicroBatch": unset_or(63, 64, 80, 112, 113, 128),
            }
        ),
        "loss": st.fixed_dictionaries(
            {
                "sequenceLevelImportanceRatios": st.booleans(),
                "truncatedImportanceSamplingType": st.sampled_from(("tis", "icepop", "seq-mask-tis")),
                "truncatedImportanceSamplingRatioMin": st.just(0.5),
                "truncatedImportanceSamplingRatio": st.just(5.0),
                "tokenLevelLoss": st.booleans(),
                "constantNormalizer": st.booleans(),
            }
        ),
        "generation": st.fixed_dictionaries(
            {
                "backend": st.sampled_from(("torch", "vllm")),
                "topP": st.sampled_from((1.0, 0.9)),
                "topK": unset_or(20),
                "maxNewTokens": st.sampled_from((16, 64, 65)),
            }
        ),
        "model": st.fixed_dictionaries(
            {
                "source": st.sampled_from(("tiny", "pretrained")),
                "path": unset_or("/models/qwen"),
                "maxSequenceLength": st.sampled_from((64, 128)),
                "tiny": st.fixed_dictionaries(
                    {
                        "hiddenSize": st.sampled_from((60, 64)),
                        "numHeads": st.sampled_from((3, 4)),
                        "numKvHeads": st.sampled_from((1, 2, 3)),
                    }
                ),
            }
        ),
        "data": st.fixed_dictionaries(
            {
                "trainPath": unset_or("/data/train.jsonl"),
                "promptKey": st.sampled_from(("prompt", "answer")),
                "answerKey": st.sampled_from(("answer", "prompt")),
                "maxPromptLength": st.sampled_from((48, 64)),
                "chatTemplate": unset_or(True, False),
                "systemPrompt": unset_or("be brief"),
            }
        ),
        "env": st.fixed_dictionaries(
            {
                "name": st.sampled_from(("reverse", "math", "gsm8k")),
                "function": unset_or(
                    "rewards:score", "a.b.c:f_1", "rewards.score", "1x:f", "rewards:score\n"
                ),
            }
        ),
    }
)


def without_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_unset(v) for k, v in value.items() if v is not UNSET}
    return value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TRAINERS)
def test_on_jobs_around_every_threshold_each_invariant_is_judged_alike(trainer: dict[str, Any]) -> None:
    manifest = job("drawn", **without_unset(trainer))
    assert webhook_verdicts(manifest) == policy_verdicts(manifest)


# --- the whole policy, as the API server runs it --------------------------------------------------


@functools.cache
def policy_spec() -> dict[str, Any]:
    return yaml.safe_load((CHART / "files" / "admission-policy.yaml").read_text())  # type: ignore[no-any-return]


def policy(operation: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """(denied, message) of the chart's policy: match conditions, variables, validation."""
    spec = policy_spec()
    context: dict[str, Any] = {"object": obj, "oldObject": old, "request": {"operation": operation}}
    if not all(cel(c["expression"], **context) for c in spec["matchConditions"]):
        return False, ""
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = cel(variable["expression"], **context, variables=variables)
        variables[variable["name"]] = _plain(variables[variable["name"]])
    (validation,) = spec["validations"]
    if cel(validation["expression"], **context, variables=variables):
        return False, ""
    return True, str(cel(validation["messageExpression"], **context, variables=variables))


def _plain(value: Any) -> Any:
    if isinstance(value, celpy.celtypes.BoolType):
        return bool(value)
    if isinstance(value, celpy.celtypes.ListType):
        return [str(item) for item in value]
    return value


def test_the_policy_lists_every_invariant_a_job_breaks_in_the_webhooks_words() -> None:
    bad = job(
        "bad",
        asyncRL={"maxStalenessVersions": 0, "overSampling": True, "minGroupsForStreamingTrain": 9},
        generation={"backend": "vllm"},
    )
    denied, text = policy("CREATE", stored(bad))
    findings = [str(f) for f in validate_manifest(bad).errors]
    assert denied
    assert text == f'AsyncGRPOJob "bad" is invalid (3 errors): {" | ".join(findings)}'
    assert policy("CREATE", stored(job("fine"))) == (False, "")


def test_an_update_is_refused_only_for_what_it_breaks_as_the_webhook_does() -> None:
    old = stored(job("old", asyncRL={"maxStalenessVersions": 0, "overSampling": True}))
    suspended = copy.deepcopy(old)
    suspended["spec"]["suspend"] = True
    assert policy("UPDATE", suspended, old) == (False, ""), "Kueue may suspend a job stored under older rules"
    worse = copy.deepcopy(old)
    worse["spec"]["trainer"]["generation"] = {**worse["spec"]["trainer"]["generation"], "backend": "vllm"}
    denied, text = policy("UPDATE", worse, old)
    assert denied and "(1 error): spec.trainer.generation.backend: vllm serves" in text
    deleting = copy.deepcopy(worse)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert policy("UPDATE", deleting, old) == (False, ""), "an object being deleted is never judged"


def test_the_committed_policy_is_generated_from_the_invariants() -> None:
    assert admissionpolicy.main(["--check"]) == 0
    assert policy_spec()["failurePolicy"] == "Fail"


# --- what the proof refuses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        pytest.param(
            Field("trainer.asyncRL.maxBufferedRollouts").gt(1), "test is_set", id="unset-field-read"
        ),
        pytest.param(
            Field("trainer.loss.truncatedImportanceSamplingRatio").gt(1.0), "nullable", id="nullable"
        ),
        pytest.param(
            (
                Field("trainer.asyncRL.maxStalenessVersions") % Field("trainer.asyncRL.maxStalenessVersions")
            ).eq(0),
            "divisor of at least 1",
            id="modulo-by-zero",
        ),
        pytest.param(
            (Field("trainer.grpo.seed") * Field("trainer.grpo.seed") * Field("trainer.grpo.seed")).gt(0),
            "overflow",
            id="int64-overflow",
        ),
        pytest.param(Field("trainer.generation.topP").eq(1), "comparing double with int", id="mixed-types"),
    ],
)
def test_an_expression_that_could_fail_on_the_api_server_is_refused(expression: Any, why: str) -> None:
    with pytest.raises(UnprovableError, match=why):
        Printer(SCHEMA, NOW).guarded(expression)


def test_the_python_side_refuses_to_read_an_unset_field_too() -> None:
    with pytest.raises(UnsetFieldError):
        evaluate(Field("trainer.asyncRL.maxBufferedRollouts").gt(1), {"trainer": {"asyncRL": {}}})


def test_findings_variable_is_what_the_validation_reads() -> None:
    names = [v["name"] for v in policy_spec()["variables"]]
    assert names == [*(i.name for i in INVARIANTS), FINDINGS]
