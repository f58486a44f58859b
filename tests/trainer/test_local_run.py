"""`asyncgrpo run`: where checkpoints go on a laptop, how many CPUs Ray is given, and what a
person sees (where to look, a bar, a summary; JSON lines only with --jsonl)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ray._private import state as ray_state

from asyncgrpo_api import rules
from asyncgrpo_api.v1alpha1 import DRIVER_PROGRESS_PORT
from asyncgrpo_trainer import console, driver, local_run, progress
from asyncgrpo_trainer.console import HumanProgress
from tests.trainer import jobs

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "async-exact.yaml"


def test_a_checkpoint_mount_path_missing_here_is_redirected_to_a_local_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"path": "/checkpoints/demo"}}}
    out = local_run.localize(job, None, None)
    assert out["spec"]["checkpoint"]["path"] == str(tmp_path / ".asyncgrpo" / "demo" / "checkpoints")


def test_explicit_checkpoint_dir_and_step_cap_override_the_job(tmp_path: Path) -> None:
    job = {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"path": str(tmp_path)}}}
    out = local_run.localize(job, str(tmp_path / "mine"), 7)
    assert out["spec"]["checkpoint"]["path"] == str(tmp_path / "mine")
    assert out["spec"]["trainer"]["grpo"]["maxNumSteps"] == 7


def test_an_existing_writable_checkpoint_directory_is_kept(tmp_path: Path) -> None:
    job = {"spec": {"checkpoint": {"path": str(tmp_path)}}}
    assert local_run.localize(job, None, None)["spec"]["checkpoint"]["path"] == str(tmp_path)


def test_required_cpus_counts_one_per_rank_plus_the_controller() -> None:
    job = {"spec": {"cluster": {"policyWorkers": {"replicas": 2}, "generationWorkers": {"replicas": 1}}}}
    assert local_run.required_cpus(job) == 4
    assert local_run.required_cpus({"spec": {}}) == 3


def test_a_local_checkpoint_directory_stands_in_for_the_volume_so_the_job_gets_no_checkpoint_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example mounts a hostPath at /checkpoints; here checkpoints go to a local directory,
    which is this machine's disk: validation has nothing to warn about."""
    monkeypatch.chdir(tmp_path)
    manifest = local_run.localize(driver.read_manifest(EXAMPLE), None, None)
    report = rules.validate_manifest(manifest)
    assert not report.errors
    assert not [w for w in report.warnings if "checkpoint" in str(w)], report.warnings
    local = str(tmp_path / ".asyncgrpo" / "tiny-async-exact" / "checkpoints")
    assert manifest["spec"]["storage"]["checkpoints"] == {"hostPath": {"path": local}, "mountPath": local}


def test_jsonl_writes_the_step_lines_to_its_file_and_dash_means_stdout(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        human, to_file = local_run.reporters_for(str(tmp_path / "steps.jsonl"), io.StringIO(), None, stack)
        to_file.update({}, [{"step": 1, "reward_mean": 0.5}])
        to_file.summary({"steps": 1, "records": []})
        assert isinstance(human, HumanProgress)
        (only_human,) = local_run.reporters_for(None, io.StringIO(), None, stack)
        assert isinstance(only_human, HumanProgress)
        _, to_stdout = local_run.reporters_for("-", io.StringIO(), None, stack)
        assert isinstance(to_stdout, progress.JsonLines) and to_stdout.stream is sys.stdout
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert lines == [{"event": "step", "step": 1, "reward_mean": 0.5}, {"event": "summary", "steps": 1}]


def test_the_driver_turns_off_rays_usage_stats_unless_the_user_set_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(driver.ray, "init", lambda **_: seen.append(os.environ.get(driver.USAGE_STATS_ENV)))
    monkeypatch.delenv(driver.USAGE_STATS_ENV, raising=False)
    driver.init_ray(num_cpus=1)
    monkeypatch.setenv(driver.USAGE_STATS_ENV, "1")
    driver.init_ray(num_cpus=1)
    assert seen == ["0", "1"]


def test_a_ray_node_not_up_in_time_is_started_again_without_its_leftovers_and_other_failures_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray gives the node it starts 30 s; on a busy machine a later start comes up where the first
    did not, and the processes the failed start left running (its GCS server, raylet, agents; here a
    process the stand-in for ray.init starts) are stopped before the next one competes with them.
    Starts go on until RAY_START_SECONDS have passed, then Ray's error is the user's to see, as is
    any other failure of ray.init (a refused address, bad options) at once."""
    outcomes: list[Exception | None] = [Exception("The current node timed out during startup."), None]
    calls: list[dict[str, object]] = []
    leftovers: list[subprocess.Popen[bytes]] = []

    def init(**options: object) -> None:
        calls.append(options)
        outcome = outcomes.pop(0) if outcomes else Exception("The current node timed out during startup.")
        if outcome is not None:
            leftovers.append(subprocess.Popen(["sleep", "600"]))  # what Ray leaves of a failed start
            time.sleep(0.1)
            raise outcome

    monkeypatch.setattr(driver.ray, "init", init)
    monkeypatch.setattr(driver.ray, "shutdown", lambda: None)
    driver.init_ray(num_cpus=1)
    assert calls == [{"num_cpus": 1}, {"num_cpus": 1}]
    assert leftovers[0].poll() is not None  # stopped, and reaped
    monkeypatch.setattr(driver, "RAY_START_SECONDS", 0.5)
    calls.clear()
    with pytest.raises(Exception, match="timed out during startup"):
        driver.init_ray(num_cpus=1)
    assert 3 <= len(calls) <= 7, len(calls)  # started again until the half second had passed
    assert all(p.poll() is not None for p in leftovers[1:-1])  # each failed start's, but the last's
    leftovers[-1].kill()
    leftovers[-1].wait()
    outcomes[:] = [ValueError("When connecting to an existing cluster, num_cpus must not be provided")]
    calls.clear()
    with pytest.raises(ValueError, match="existing cluster"):
        driver.init_ray(num_cpus=1)
    assert len(calls) == 1


@dataclass(frozen=True)
class Relayed:
    """What a 6-step async-in-order run relayed: the person's text, the machine's lines, the summary."""

    checkpoints: Path
    text: str
    events: list[dict[str, Any]]
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def relayed(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Relayed:
    tmp_path = tmp_path_factory.mktemp("relay")
    person, machine = io.StringIO(), io.StringIO()
    reporters = [HumanProgress(person, checkpoints=str(tmp_path), tty=False), progress.JsonLines(machine)]
    job = jobs.manifest("async-in-order", steps=6, checkpoint_dir=str(tmp_path), name="relay")
    summary = driver.execute(job, reporters=reporters)
    for reporter in reporters:
        reporter.summary(summary)
    events = [json.loads(line) for line in machine.getvalue().splitlines()]
    return Relayed(tmp_path, person.getvalue(), events, summary)


@pytest.mark.trainer
def test_a_run_relays_a_bar_and_a_summary_for_a_person_and_one_json_line_per_step(relayed: Relayed) -> None:
    text, tmp_path = relayed.text, relayed.checkpoints
    bars = [line for line in text.splitlines() if line.startswith("[")]
    assert bars and bars[-1].startswith("[" + "#" * console.BAR_WIDTH + "] 6/6  reward "), text
    assert "trained 6/6 steps (async-in-order) in " in text and " with start-up)" in text, text
    assert "  reward              " in text and "at step 1 -> " in text and "at step 6" in text, text
    assert f"  checkpoint          step 6 in {tmp_path}" in text, text
    assert "{" not in text
    events = relayed.events
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))
    assert events[-1]["event"] == "summary" and events[-1]["steps"] == 6
    # The log-prob gate of step 1, all of whose samples the untrained weights generated: the torch
    # engine samples the policy's own float32 distribution. Stale-only steps report none.
    assert steps[0]["mean_staleness"] == 0 and steps[0]["gen_logprob_error"] == pytest.approx(1.0, abs=1e-3)
    stale_only = [e for e in steps if e["mean_staleness"] == 1]
    assert stale_only and all(e["gen_logprob_error"] is None for e in stale_only), steps


@pytest.mark.trainer
def test_each_step_says_who_waited_for_whom_and_what_was_generated_but_not_trained(relayed: Relayed) -> None:
    """The measured shares of each step's window: the policy's wait for rollouts and its compute
    are disjoint parts of the window, each engine's idle time behind the gate is part of its idle
    time; and the samples never trained on are exactly those still waiting in the buffer (an
    in-order run evicts and drops none)."""
    steps = [e for e in relayed.events if e["event"] == "step"]
    config = jobs.manifest("async-in-order", steps=6, checkpoint_dir="-")["spec"]["trainer"]
    samples_per_group = config["grpo"]["numGenerationsPerPrompt"]
    capacity = config["grpo"]["numPromptsPerStep"] * (config["asyncRL"]["maxStalenessVersions"] + 1)
    for e in steps:
        idle, busy = e["policy_idle_share"], e["policy_busy_share"]
        assert 0 <= idle <= 1 and 0 < busy <= 1 and idle + busy <= 1 + 1e-9, e
        assert e["generation_engines"] == len(e["generation_idle_shares"]) == 1, e
        assert all(0 <= x <= 1 for x in e["generation_idle_shares"]), e
        assert 0 <= e["generation_gated_share"] <= e["generation_idle_share"] + 1e-9 <= 1 + 1e-9, e
        assert e["weight_version"] == e["step"] and 0 <= e["buffer_fill"] <= 1, e
        waiting = round(e["buffer_fill"] * capacity)
        assert e["samples_untrained"] == e["samples_generated"] - e["samples_trained"], e
        assert e["samples_untrained"] == waiting * samples_per_group, e
    assert steps[-1]["samples_trained"] == relayed.summary["counters"]["samples_trained"]
    assert [e["samples_generated"] for e in steps] == sorted(e["samples_generated"] for e in steps)


@pytest.mark.trainer
def test_asyncgrpo_run_says_where_to_look_then_shows_a_bar_and_a_summary_and_no_json(tmp_path: Path) -> None:
    """The README's `asyncgrpo run` for a newcomer, as a real process with its own embedded Ray:
    the first lines name the checkpoint directory and /progress (127.0.0.1, a free port), which
    answers while it runs; no warning about the checkpoint directory it chose or Ray's auth mode; no
    JSON lines."""
    unset = ("RAY_ADDRESS", driver.USAGE_STATS_ENV, local_run.RAY_AUTH_MODE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "asyncgrpo"), "run", str(EXAMPLE), "--max-steps", "6"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its Ray processes too are ended if the test fails midway
    )
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(3)]
        url = banner[2].split()[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/progress"), banner
        assert not url.startswith(f"http://127.0.0.1:{DRIVER_PROGRESS_PORT}/"), banner
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["state"] in ("starting", "running") and "step" in answer, answer
        out, err = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(banner) + out
    assert proc.returncode == 0, (text, err)
    checkpoints = tmp_path / ".asyncgrpo" / "tiny-async-exact" / "checkpoints"
    assert banner[0].startswith("asyncgrpo run tiny-async-exact: 6 steps on an embedded Ray ("), banner
    assert banner[1].split() == ["checkpoints", str(checkpoints)], banner
    assert "] 6/6  reward " in text and "trained 6/6 steps (async-in-order) in " in text, text
    assert f"  checkpoint          step 6 in {checkpoints}" in text, text
    assert not [line for line in (text + err).splitlines() if line.lstrip().startswith("{")], text
    assert "checkpoint" not in err, err
    assert "Token authentication" not in err, err  # the run set its own Ray's auth mode


@pytest.mark.trainer
def test_asyncgrpo_run_trains_on_its_own_ray_not_the_one_ray_address_names_and_without_rays_auth_warning(
    ray_address: str, tmp_path: Path
) -> None:
    """Issue 34 item 5, with a real Ray at RAY_ADDRESS (the suite's, running): `asyncgrpo run`
    starts its own node instead of joining it (a bare ray.init() would join it, then refuse the
    run's num_cpus), says so in its banner, and picks its own node's auth mode, so Ray's "Token
    authentication is enabled" warning is not printed. No driver of the run reaches the other Ray."""
    drivers_before = _drivers_of_the_suites_ray()
    unset = (driver.USAGE_STATS_ENV, local_run.RAY_AUTH_MODE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"RAY_ADDRESS": ray_address}
    code, out, err = _asyncgrpo_run([str(EXAMPLE), "--max-steps", "1"], tmp_path, env, timeout=600)
    assert code == 0, (out, err)
    assert f"  ray          its own on this machine; RAY_ADDRESS={ray_address} is not joined\n" in out, out
    assert "trained 1/1 steps (async-in-order) in " in out, out
    assert "Token authentication" not in out + err, err
    assert _drivers_of_the_suites_ray() == drivers_before


def _drivers_of_the_suites_ray() -> set[str]:
    """The jobs (one per connected driver, ended ones included) of the Ray this process joined."""
    return {job["JobID"] for job in ray_state.jobs()}  # type: ignore[no-untyped-call]


def _asyncgrpo_run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """`asyncgrpo run ARGS` as a user runs it: its exit code, stdout and stderr. It runs in a session
    of its own, so its Ray processes are ended with it if the test fails midway."""
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "asyncgrpo"), "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


@pytest.mark.parametrize(
    ("requested", "needed", "available", "gpus"),
    [(None, 0, 0, 0), (None, 0, 2, 0), (None, 2, 2, 2), (None, 1, 8, 1), (2, 1, 2, 2), (0, 0, 0, 0)],
)
def test_the_gpus_of_the_embedded_ray_are_the_jobs_when_the_machine_has_them(
    requested: int | None, needed: int, available: int, gpus: int
) -> None:
    assert local_run.choose_gpus(requested, needed, available) == gpus


@pytest.mark.parametrize(
    ("requested", "needed", "available", "text"),
    [
        (None, 2, 0, "the job asks for 2 GPUs"),
        (None, 2, 1, "this machine has 1 GPU;"),
        (1, 0, 0, "--gpus 1 but this machine has 0 GPUs"),
        (1, 2, 4, "--gpus 1 is fewer than the job needs"),
    ],
)
def test_gpus_the_machine_cannot_give_are_refused_naming_what_is_asked_and_had(
    requested: int | None, needed: int, available: int, text: str
) -> None:
    with pytest.raises(local_run.GpuError, match=text) as err:
        local_run.choose_gpus(requested, needed, available)
    assert "--gpus" in str(err.value) and f"has {available} GPU" in str(err.value)


def _gpu_job(tmp_path: Path, gpus_per_replica: int) -> Path:
    manifest = driver.read_manifest(EXAMPLE)
    pools = manifest["spec"].setdefault("cluster", {})
    for pool in ("policyWorkers", "generationWorkers"):
        pools.setdefault(pool, {}).update({"replicas": 1, "gpusPerReplica": gpus_per_replica})
    path = tmp_path / "job.json"
    path.write_text(json.dumps(manifest))
    assert local_run.required_gpus(driver.read_manifest(path)) == 2 * gpus_per_replica
    return path


@pytest.mark.parametrize(
    ("gpus_per_replica", "args", "text"),
    [
        (1, [], "the job asks for 2 GPUs"),
        (0, ["--gpus", "1"], "--gpus 1 but this machine has 0 GPUs"),
    ],
    ids=["job-asks-for-gpus", "gpus-flag-beyond-the-machine"],
)
def test_asyncgrpo_run_without_the_gpus_it_needs_fails_at_once_naming_gpus_and_the_machine(
    tmp_path: Path, gpus_per_replica: int, args: list[str], text: str
) -> None:
    """Issue 29 item 11: not the placement group's 180 s wait and Ray's resource dump."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"CUDA_VISIBLE_DEVICES": ""}
    job = _gpu_job(tmp_path, gpus_per_replica)
    started = time.monotonic()
    code, out, err = _asyncgrpo_run([str(job), *args], tmp_path, env, timeout=90)
    assert code == 1, (out, err)
    assert time.monotonic() - started < 90
    assert text in err and "--gpus" in err and "this machine has 0 GPUs" in err, err
    assert "embedded Ray" not in out, out


RAY_UNDER_TMPDIR = """
import pathlib, ray
from asyncgrpo_trainer import local_run
local_run.start_own_ray(num_cpus=1, num_gpus=0)
try:
    print(ray.get(ray.remote(lambda: 6 * 7).remote()))
    print(ray._private.worker._global_node.get_session_dir_path())
finally:
    ray.shutdown()
"""


@pytest.mark.trainer
def test_ray_starts_under_a_tmpdir_too_long_for_its_sockets(tmp_path: Path) -> None:
    """Ray's sockets go under its temp folder and may not pass 107 bytes: under a TMPDIR longer
    than that allows, `asyncgrpo run` puts Ray's session under /tmp/ray instead of failing."""
    long_tmp = tmp_path / ("t" * 70)
    long_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS")}
    out = subprocess.run(
        [sys.executable, "-c", RAY_UNDER_TMPDIR],
        env={**env, "TMPDIR": str(long_tmp)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    answer, session = out.stdout.split()[-2:]
    try:
        assert answer == "42"
        assert Path(session).parent == Path("/tmp/ray"), session
    finally:
        subprocess.run(["rm", "-rf", session], check=False)


def test_a_ray_tmpdir_too_long_for_rays_sockets_is_refused_with_the_variable_and_a_length_that_fits() -> None:
    with pytest.raises(ValueError, match=r"RAY_TMPDIR=/x+ is 81 bytes long.*at most 39 bytes"):
        local_run.ray_temp_dir({"RAY_TMPDIR": "/" + "x" * 80})
    assert local_run.ray_temp_dir({"RAY_TMPDIR": "/tmp/mine"}) == "/tmp/mine/ray"
    assert local_run.ray_temp_dir({"TMPDIR": "/scratch/me"}) == "/scratch/me/ray"
    assert local_run.ray_temp_dir({}) == "/tmp/ray"
