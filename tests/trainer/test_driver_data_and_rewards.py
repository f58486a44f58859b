"""The driver with data files and reward functions, as real subprocesses joining the session's Ray
(as in test_driver_exit): unusable data, an unimportable reward function or a missing reward model
fails before Ray with the InvalidData exit code and a message naming the field and the file; a
GSM8K-shaped file trains by key mapping with a user's reward function, its skipped rows reported
once; a reward function that always fails (raising, or a group function returning too few
rewards) stops the run with that reason and is counted, never trained on as 0."""

from __future__ import annotations

import json
import shutil
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_api import exitcodes
from tests.trainer import jobs
from tests.trainer.test_driver_exit import REPO, _free_port, _start

pytestmark = pytest.mark.trainer
GSM8K = REPO / "docs/examples/data/gsm8k-tiny.jsonl"
FUNCTIONS = "tests.trainer.reward_functions"


def _gsm8k_job(tmp_path: Path, train: Path, *, steps: int, function: str) -> dict[str, Any]:
    """The tiny model on GSM8K-shaped rows: 4 prompts x 2 samples a step, 4 new tokens (jobs.py)."""
    job = jobs.manifest("sync", steps=steps, checkpoint_dir=str(tmp_path / "ck"))
    trainer = job["spec"]["trainer"]
    trainer["model"]["maxSequenceLength"] = 112
    trainer["grpo"].update({"numPromptsPerStep": 4, "numGenerationsPerPrompt": 2})
    trainer["asyncRL"]["maxBufferedRollouts"] = 4
    trainer["policy"]["trainMicroBatchSize"] = 8
    trainer["data"] = {
        "trainPath": str(train),
        "promptKey": "question",
        "maxPromptLength": 100,  # the 12 longest questions (113-115 characters) are skipped
        "numValidationPrompts": 4,
    }
    trainer["env"] = {"name": "gsm8k", "function": function, "timeoutSeconds": 60}
    return job


def _until(proc: Any, prefix: str, stream: str = "stderr") -> list[str]:
    lines = []
    for line in getattr(proc, stream):
        lines.append(line)
        if line.startswith(prefix):
            return lines
    # The stream ended: say how the driver ended too (a clean-clone run once saw its stderr end two
    # lines after the start, with no error line; an exit code or a signal tells which it was).
    code = proc.wait(timeout=60)
    raise AssertionError(
        f"no line starting with {prefix!r}; the driver exited with {code}; got {''.join(lines[-20:])}"
    )


def _get(port: int, path: str) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read().decode()


NO_RAY = "127.0.0.1:1"
"""Nothing listens there: a driver that gets as far as joining Ray fails differently."""


def test_a_job_whose_data_file_has_no_usable_row_fails_at_start_with_invalid_data_naming_the_file(
    tmp_path: Path,
) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"question": "q", "answer": "no final number"}) + "\n")
    job = _gsm8k_job(tmp_path, train, steps=2, function=f"{FUNCTIONS}:exact")
    t0 = time.monotonic()
    proc = _start(job, tmp_path, NO_RAY, port=0)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == exitcodes.INVALID_DATA
    assert time.monotonic() - t0 < 60  # before Ray, before any worker
    assert err.strip().splitlines()[-1] == (
        f"asyncgrpo: training failed: InvalidDataError: data.trainPath {train}: no usable row of 1: the "
        f"first bad row is line 1: 'answer' has no final number (GSM8K answers end in '#### 42'); got "
        f"'no final number'"
    )


def test_a_reward_function_that_cannot_be_imported_fails_at_start_with_invalid_data(tmp_path: Path) -> None:
    job = _gsm8k_job(tmp_path, GSM8K, steps=2, function="no_such_package.rewards:score")
    proc = _start(job, tmp_path, NO_RAY, port=0)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == exitcodes.INVALID_DATA
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "asyncgrpo: training failed: InvalidDataError: env.function: cannot import 'no_such_package.rewards'"
    )


def test_a_reward_model_whose_checkpoint_is_missing_fails_at_start_with_invalid_data(tmp_path: Path) -> None:
    job = _gsm8k_job(tmp_path, GSM8K, steps=2, function=f"{FUNCTIONS}:exact")
    del job["spec"]["trainer"]["env"]["function"]
    job["spec"]["trainer"]["rewardModel"] = {"path": str(tmp_path / "no-judge")}
    proc = _start(job, tmp_path, NO_RAY, port=0)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == exitcodes.INVALID_DATA
    assert err.strip().splitlines()[-1] == (
        f"asyncgrpo: training failed: InvalidDataError: rewardModel.path: {tmp_path / 'no-judge'} does not "
        "exist (is the models volume mounted there?); point it at the judge's Hugging Face checkpoint "
        "directory"
    )


def test_gsm8k_rows_train_with_a_user_reward_function_and_the_skipped_rows_are_reported_once(
    ray_address: str, tmp_path: Path
) -> None:
    train = tmp_path / "gsm8k.jsonl"
    shutil.copy(GSM8K, train)
    with train.open("a") as f:
        f.write(json.dumps({"question": 7, "answer": "#### 7"}) + "\n")  # a bad row
    port = _free_port()
    proc = _start(
        _gsm8k_job(tmp_path, train, steps=2, function=f"{FUNCTIONS}:exact"),
        tmp_path,
        ray_address,
        port=port,
        grace=60,
    )
    try:
        out = _until(proc, '{"event": "summary"', stream="stdout")
        steps = [json.loads(line) for line in out if line.startswith('{"event": "step"')]
        assert [s["step"] for s in steps] == [1, 2] and all(s["reward_failures"] == 0 for s in steps)
        doc = json.loads(_get(port, "/progress"))
        assert doc["state"] == "succeeded" and doc["rewardFailures"] == 0
        assert doc["dataWarning"] == (
            f"data.trainPath {train}: 1 bad row(s) skipped (first: line 49: 'question' is an int, not a "
            f"string or chat messages (a list of {{role, content}})), 12 prompt(s) over data.maxPromptLength "
            f"(100 tokens) skipped; 36 of 49 rows used"
        )
        assert "asyncgrpo_reward_failures_total 0" in _get(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)  # skip the rest of the grace period
        _, err = proc.communicate(timeout=60)
    assert err.count("data: data.trainPath") == 1  # the driver log names the skipped rows once


@pytest.mark.parametrize(
    ("function", "scope", "error"),
    [
        ("always_raises", "response", "ValueError: no reward for you"),
        (
            "one_reward_short",
            "group",
            f"ValueError: env.function {FUNCTIONS}:one_reward_short returned 1 rewards for 2 responses; with "
            "env.functionScope group it must return one float per response, in their order",
        ),
    ],
)
@pytest.mark.budget(300, "a driver process on the session's Ray until 5 groups failed: 56-125 s in CI")
def test_a_reward_function_that_always_fails_stops_the_run_and_is_counted_never_trained_on(
    ray_address: str, tmp_path: Path, function: str, scope: str, error: str
) -> None:
    port = _free_port()
    job = _gsm8k_job(tmp_path, GSM8K, steps=3, function=f"{FUNCTIONS}:{function}")
    job["spec"]["trainer"]["env"]["functionScope"] = scope
    # The untrained tiny model's responses run to maxNewTokens; truncated ones reach the function
    # only with scoreTruncated (otherwise they are rewarded 0 without a call).
    job["spec"]["trainer"]["env"]["scoreTruncated"] = True
    proc = _start(job, tmp_path, ray_address, port=port, grace=60)
    try:
        last = _until(proc, "asyncgrpo: training failed")[-1]
        assert "RewardFailuresError: 5 of the last 5 prompt groups scored were dropped" in last
        assert "(10% of 4 x numPromptsPerStep 4, at least 4); the last, for step " in last
        assert last.rstrip().endswith(f"scoring failed 2 times; last: {error}")
        doc = json.loads(_get(port, "/progress"))
        assert doc["state"] == "failed" and doc["rewardFailures"] >= 1 and doc["step"] == 0
        assert f"asyncgrpo_reward_failures_total {doc['rewardFailures']}" in _get(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode != 0
