"""Attempt fencing with two drivers (processes) racing on one prefix: once a newer attempt has
started, an older one that is still alive completes no checkpoint and deletes nothing, and a
resume takes the newer attempt's newest checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asyncgrpo_trainer import checkpoint, durable_checkpoints
from asyncgrpo_trainer.durable_layout import CheckpointId
from asyncgrpo_trainer.object_store import Store
from tests.objectstore.helpers import store_config, with_object_store
from tests.objectstore.s3server import S3Server
from tests.trainer import jobs

KEEP_LAST = 2


def _job_file(tmp_path: Path, server: S3Server, bucket: str, attempt: int) -> Path:
    """The job as attempt `attempt`'s pod sees it: its own local checkpoint folder (no shared volume)."""
    manifest = jobs.manifest("sync", steps=1000, checkpoint_dir=str(tmp_path / f"pod-{attempt}"), name="race")
    manifest["spec"]["checkpoint"]["keepLast"] = KEEP_LAST
    path = tmp_path / f"job-{attempt}.json"
    path.write_text(json.dumps(with_object_store(manifest, server, bucket)))
    return path


def _driver(job: Path, attempt: int, steps: int, stop_file: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tests.objectstore.racing_driver", "--job", str(job)]
    argv += ["--attempt", str(attempt), "--steps", str(steps), "--stop-file", str(stop_file)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _lines(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _wait_for(store: Store, attempt: int, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            c.attempt == attempt and c.step >= step for c in durable_checkpoints.complete_checkpoints(store)
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"attempt {attempt} made no checkpoint of step {step} durable in {timeout:g} s")


def test_an_old_attempt_still_running_cannot_complete_or_delete_after_a_newer_one_starts(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    store = Store(store_config(s3_server, bucket, root="tests/race"))
    stop = tmp_path / "stop-attempt-1"
    old = _driver(_job_file(tmp_path, s3_server, bucket, 1), 1, 10_000, stop)
    _wait_for(store, 1, 3)

    new = _driver(_job_file(tmp_path, s3_server, bucket, 2), 2, 4, tmp_path / "never")
    new_lines = _lines(new)  # the old attempt writes local checkpoints all along
    time.sleep(2.0)
    stop.touch()
    old_state = _lines(old)[-1]

    resumed_from = new_lines[0]["resumed_from"]
    new_state = new_lines[-1]
    assert resumed_from >= 3
    assert new_state["durable_step"] == resumed_from + 4
    assert old_state["fenced"] is True
    complete = durable_checkpoints.complete_checkpoints(store)
    mine = sorted(c for c in complete if c.attempt == 2)
    assert mine[-1] == CheckpointId(2, resumed_from + 4) and len(mine) <= KEEP_LAST  # the mirror may skip
    # steps written faster than it uploads: it always takes the newest
    assert all(c.step <= resumed_from + 1 for c in complete if c.attempt == 1), complete
    assert durable_checkpoints.restore_newest(store, tmp_path / "next-pod") == CheckpointId(
        2, resumed_from + 4
    )
    assert checkpoint.load(tmp_path / "next-pod", resumed_from + 4)["step"] == resumed_from + 4
