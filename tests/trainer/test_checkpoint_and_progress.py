"""Atomic checkpoints with pruning, and the /progress and /metrics documents."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from asyncgrpo_trainer import checkpoint, progress


def test_checkpoints_are_renamed_into_place_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, {"step": step}, keep_last=2)
    assert checkpoint.list_steps(tmp_path) == [2, 3]
    assert checkpoint.latest(tmp_path) == 3
    assert checkpoint.load(tmp_path, 3) == {"step": 3}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_torn_write_is_invisible_and_cleaned_up_by_the_next_save(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, {"step": 1}, keep_last=3)
    torn = tmp_path / ".tmp-00000002-dead"
    torn.mkdir()
    (torn / checkpoint.STATE_FILE).write_bytes(b"partial")
    (tmp_path / "step-00000009").mkdir()  # no meta file: not a checkpoint
    assert checkpoint.latest(tmp_path) == 1
    checkpoint.save(tmp_path, 2, {"step": 2}, keep_last=3)
    assert not torn.exists() and checkpoint.latest(tmp_path) == 2


def test_no_checkpoint_directory_means_no_resume(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "missing") is None


def test_progress_server_serves_camel_case_json_and_prometheus_text() -> None:
    server = progress.ProgressServer(0, host="127.0.0.1")
    try:
        server.update(
            step=3,
            max_steps=10,
            reward_mean=0.5,
            state="failed",
            error="boom",
            counters={"groups_committed": 7},
        )
        base = f"http://127.0.0.1:{server.port}"
        doc = json.load(urllib.request.urlopen(f"{base}/progress"))
        for key in (
            "step",
            "maxSteps",
            "policyVersion",
            "rewardMean",
            "meanStaleness",
            "tokensPerSecond",
            "lastCheckpointStep",
            "validationReward",
            "state",
            "error",
        ):
            assert key in doc
        assert (doc["step"], doc["state"], doc["error"]) == (3, "failed", "boom")
        text = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert "asyncgrpo_step 3" in text and 'asyncgrpo_state{state="failed"} 1' in text
        assert "asyncgrpo_groups_committed_total 7" in text
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/nope")
    finally:
        server.close()
