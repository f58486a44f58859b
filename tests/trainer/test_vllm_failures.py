"""What the driver does when vLLM is the problem (no engine started here: these are the rules).

- The image has no vLLM: the driver refuses at start, naming spec.trainer.generation.backend.
- vLLM refuses the checkpoint (its engine's constructor raises): InvalidModel, never retried.
- The engine dies mid-run: an infrastructure failure (RAY_WORKER_LOST), retried from the checkpoint
  even after the rollout manager gave up on the group it was generating.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import ray

from asyncgrpo_api import exitcodes
from asyncgrpo_trainer import driver
from asyncgrpo_trainer.backends import vllm_engine
from asyncgrpo_trainer.backends.generation import EngineLostError
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.rollout import RolloutFailedError
from tests.trainer import jobs


def test_a_vllm_job_without_vllm_in_the_image_is_refused_naming_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    manifest: dict[str, Any] = jobs.manifest("sync", steps=1, checkpoint_dir="/tmp/x")
    trainer = manifest["spec"]["trainer"]
    trainer["model"] = {"source": "pretrained", "path": "/models/m", "maxSequenceLength": 64}
    trainer["generation"]["backend"] = "vllm"
    trainer["data"]["maxPromptLength"] = 16
    job = driver.parse_job(manifest)
    with pytest.raises(vllm_engine.VLLMUnavailableError, match=r"spec.trainer.generation.backend is vllm"):
        driver.check_supported(job)


def test_an_engine_that_refused_the_checkpoint_fails_the_job_as_invalid_model() -> None:
    creation = ray.exceptions.RayActorError(
        error_msg="The actor died because of an error raised in its creation task, "
        "InvalidModelError: spec.trainer.model.path: vLLM could not start on /models/m: ...",
        actor_init_failed=True,
    )
    assert driver.exit_code(creation) == exitcodes.INVALID_MODEL
    assert driver.exit_code(InvalidModelError("config.json: model_type 'gpt2'")) == exitcodes.INVALID_MODEL


def test_an_engine_that_died_mid_run_is_retried_from_the_checkpoint() -> None:
    try:
        try:
            raise EngineLostError("the vLLM engine died: EngineCore encountered an issue")
        except EngineLostError as lost:
            raise RolloutFailedError("prompt group 18 failed 3 attempt(s)") from lost
    except RolloutFailedError as exc:
        assert driver.exit_code(exc) == exitcodes.RAY_WORKER_LOST
    assert driver.exit_code(RuntimeError("a bug")) == exitcodes.TRAINING_ERROR
