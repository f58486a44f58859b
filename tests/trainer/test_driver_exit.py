"""The driver's contract with the operator: exit codes, the error as the last stderr line and in
/progress (answered during the grace period), and resume after SIGKILL with no lost or repeated step.

Drivers run as real subprocesses (`python -m asyncgrpo_trainer --job-spec FILE`) that join the
session's Ray cluster, as the driver joins the head pod's Ray in a RayCluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import checkpoint
from tests.trainer import jobs

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    job: dict[str, Any],
    tmp_path: Path,
    ray_address: str,
    *,
    port: int,
    grace: float = 0,
    attempt: int | None = None,
) -> subprocess.Popen[str]:
    spec = tmp_path / f"job-{time.monotonic_ns()}.yaml"
    spec.write_text(yaml.safe_dump(job))
    env = {
        **os.environ,
        **({"ASYNCGRPO_ATTEMPT": str(attempt)} if attempt is not None else {}),
        "RAY_ADDRESS": ray_address,
        "ASYNCGRPO_EXIT_GRACE_SECONDS": str(grace),
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "asyncgrpo_trainer", "--job-spec", str(spec), "--progress-port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _steps(stdout: str) -> list[int]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "step":
                out.append(record["step"])
    return out


def test_an_invalid_spec_exits_1_and_names_the_field(tmp_path: Path) -> None:
    job = jobs.manifest("sync", steps=3, checkpoint_dir=str(tmp_path / "ck"))
    job["spec"]["trainer"]["asyncRL"]["overSampling"] = True  # rule 1: sync mode cannot over-sample
    proc = _start(job, tmp_path, "127.0.0.1:1", port=0)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("asyncgrpo: training failed: SpecError") and "overSampling" in last


@pytest.mark.trainer
def test_a_failing_rollout_pump_stops_the_run_with_exit_1_and_reports_failed(
    ray_address: str, tmp_path: Path
) -> None:
    job = jobs.manifest("async-in-order", steps=5, checkpoint_dir=str(tmp_path / "ck"))
    # Every generation misses its deadline and there is one attempt: RolloutFailed in the pump.
    job["spec"]["trainer"]["asyncRL"].update({"rolloutTimeoutSeconds": 0.000001, "maxRolloutAttempts": 1})
    port = _free_port()
    proc = _start(job, tmp_path, ray_address, port=port, grace=30)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # the error line comes before the grace period
        lines.append(line)
        if line.startswith("asyncgrpo: training failed"):
            break
    assert "RolloutFailed" in lines[-1] and "failed 1 attempt" in lines[-1]
    doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=10))
    assert doc["state"] == "failed" and "RolloutFailed" in doc["error"]
    proc.send_signal(signal.SIGTERM)  # skip the rest of the grace period
    proc.wait(timeout=60)


@pytest.mark.trainer
@pytest.mark.budget(300, "a driver process on the session's Ray until its train pump fails: 24-114 s in CI")
def test_an_error_in_the_train_pump_exits_1_with_that_error(ray_address: str, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should be")
    job = jobs.manifest("sync", steps=3, checkpoint_dir=str(blocker))
    job["spec"]["checkpoint"]["everySteps"] = 1
    proc = _start(job, tmp_path, ray_address, port=0)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("asyncgrpo: training failed: FileExistsError"), last
    assert _steps(out) == [1]  # the step ran; its checkpoint failed and stopped the run


@pytest.mark.trainer
def test_a_killed_driver_resumes_from_its_checkpoint_without_losing_or_repeating_a_step(
    ray_address: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ck"
    steps = 30
    job = jobs.manifest("async-in-order", steps=steps, checkpoint_dir=str(ckpt))
    job["spec"]["checkpoint"].update({"everySteps": 1, "keepLast": 3})
    first = _start(job, tmp_path, ray_address, port=0, attempt=0)
    deadline = time.monotonic() + 240
    while (checkpoint.latest(ckpt) or 0) < 3:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    out1, _ = first.communicate(timeout=60)
    saved = checkpoint.latest(ckpt)
    assert saved is not None and saved < steps, "the run finished before it could be killed"
    payload = checkpoint.load(ckpt, saved)
    second = _start(job, tmp_path, ray_address, port=0, attempt=1)
    out2, err2 = second.communicate(timeout=300)
    assert second.returncode == 0, err2
    resumed = _steps(out2)
    assert resumed == list(range(saved + 1, steps + 1))
    assert set(_steps(out1)) <= set(range(1, saved + 2))  # the killed run got at most one step further
    assert payload["step"] == saved
    # Exactly one dispatch batch per step was drawn over both runs: the groups in flight at the
    # checkpoint were generated again from their saved prompts, not drawn again from the loader.
    final = checkpoint.load(ckpt, steps)
    assert final["batch_index"] == steps
    assert final["loader"] == {"epoch": 0, "position": steps * jobs.P}
    assert final["counters"]["samples_trained"] == steps * jobs.P * jobs.N
    # What outlives the pods, on the checkpoint volume: each attempt's whole log, and the step
    # records with every step once (the killed attempt's steps after its checkpoint were dropped).
    first_log = (ckpt / "logs" / "driver-attempt-0.log").read_text()
    second_log = (ckpt / "logs" / "driver-attempt-1.log").read_text()
    assert out1 in first_log
    assert out2 in second_log and err2 in second_log
    assert f"resuming from the checkpoint of step {saved}" in second_log
    records = [json.loads(line) for line in (ckpt / "logs" / "steps.jsonl").read_text().splitlines()]
    trained = [(r["step"], r["attempt"]) for r in records if r["event"] == "step"]
    assert [step for step, _ in trained] == list(range(1, steps + 1))
    assert {attempt for step, attempt in trained if step > saved} == {1}
    assert any((ckpt / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.trainer
def test_a_sigterm_checkpoints_the_step_reached_and_the_resumed_run_neither_repeats_nor_skips_a_step(
    ray_address: str, tmp_path: Path
) -> None:
    """What a Kueue preemption or a suspend does to the driver: its pod is deleted, so it gets
    SIGTERM and has terminationGracePeriodSeconds to stop. It finishes the step in progress, saves
    it (no periodic checkpoint would have: everySteps is larger than the run) and exits 143."""
    ckpt = tmp_path / "ck"
    steps = 120  # a tiny step takes ~60 ms: SIGTERM at step 3 must land while steps remain
    job = jobs.manifest("async-in-order", steps=steps, checkpoint_dir=str(ckpt))
    job["spec"]["checkpoint"].update({"everySteps": 1000, "keepLast": 2})
    port = _free_port()
    first = _start(job, tmp_path, ray_address, port=port, attempt=0)
    deadline = time.monotonic() + 240

    def step() -> int:
        try:
            return int(
                json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5))["step"]
            )
        except OSError:
            return 0

    while step() < 3:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, out1 + err1
    trained = _steps(out1)
    saved = checkpoint.latest(ckpt)
    assert saved is not None and saved == trained[-1] < steps, (saved, trained)  # the last step, saved
    assert f"stopped by SIGTERM after step {saved}, which is checkpointed" in err1
    second = _start(job, tmp_path, ray_address, port=0, attempt=1)
    out2, err2 = second.communicate(timeout=300)
    assert second.returncode == 0, err2
    assert _steps(out2) == list(range(saved + 1, steps + 1))  # right after the saved step
    records = [json.loads(line) for line in (ckpt / "logs" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "step"] == list(range(1, steps + 1))
    final = checkpoint.load(ckpt, steps)
    assert final["counters"]["samples_trained"] == steps * jobs.P * jobs.N  # no sample trained twice
