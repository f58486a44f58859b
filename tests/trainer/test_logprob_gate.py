"""The log-prob gate: genLogprobError above spec.trainer.logprobGate.threshold for `steps` measured
steps in a row sets /progress's logprobMismatch (the operator's LogprobMismatch condition, tested
in tests/operator/test_job_phase_transitions.py) and, with failJob, fails the run; the step's
figures reach /metrics and TensorBoard."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncgrpo_trainer import logprob_gate, progress, tracking
from tests.trainer.test_controller_pumps import FakeGeneration, FakePolicy, _controller, _steps

GATE = logprob_gate.GateSettings(threshold=1.1, steps=3)


def test_the_gate_trips_after_k_measured_steps_in_a_row_above_the_threshold() -> None:
    gate = logprob_gate.LogprobGate(GATE)
    for step, error in enumerate([1.5, 1.2, 1.05, 1.3, None, 1.4], start=1):
        gate.observe(step, error)
        assert gate.mismatch is None, step  # 1.05 broke the first run; a step without rows is skipped
    gate.observe(7, 1.25)
    assert gate.mismatch is not None
    assert "above logprobGate.threshold 1.1 for 3 measured steps in a row (steps 4-7" in gate.mismatch
    assert "latest 1.2500, highest 1.4000" in gate.mismatch
    gate.observe(8, 1.1)  # at the threshold is not above it
    assert gate.mismatch is None


def test_with_fail_job_the_gate_raises_when_it_trips_and_not_before() -> None:
    gate = logprob_gate.LogprobGate(logprob_gate.GateSettings(threshold=1.1, steps=2, fail=True))
    gate.observe(1, 2.0)
    with pytest.raises(logprob_gate.LogprobMismatchError, match=r"steps 1-2.*failJob is set"):
        gate.observe(2, 3.0)


def test_without_a_threshold_the_gate_never_trips() -> None:
    gate = logprob_gate.LogprobGate(logprob_gate.GateSettings(threshold=None, steps=1, fail=True))
    gate.observe(1, 50.0)
    assert gate.mismatch is None


def test_the_step_figures_the_issue_names_are_curves_and_gauges() -> None:
    record = {
        "gen_logprob_error": 1.02,
        "gen_kl_error": 0.01,
        "reward_failures": 1,
        "entropy": 0.7,
        "response_length_mean": 4.5,
        "response_length_max": 5,
        "truncated_fraction": 0.25,
        "clip_fraction": 0.1,
    }
    tags = tracking.scalars(record)
    assert len(tags) == len(record)
    text = progress.prometheus_text(
        progress.Progress(
            **{k: v for k, v in record.items() if k != "reward_failures"},  # type: ignore[arg-type]
            logprob_mismatch="why",
            counters={"reward_failures": 1.0},
        )
    )
    for name in [*(k for k in record if k != "reward_failures"), "logprob_mismatch", "reward_failures_total"]:
        assert f"\nasyncgrpo_{name} " in text, name


class DriftingPolicy(FakePolicy):
    """A policy whose steps measure the given log-prob gate values, one per step (what the real
    worker computes is tested in test_grpo_math.py; this is about what the controller does with it)."""

    def __init__(self, errors: list[float | None]) -> None:
        super().__init__()
        self.errors = errors

    async def finish_step(self) -> dict[str, float]:
        out = await super().finish_step()
        error = self.errors[self.steps - 1]
        return out if error is None else {**out, "gen_logprob_error": error}


def test_the_controller_publishes_the_mismatch_and_the_step_figures_on_progress(tmp_path: Path) -> None:
    pol = DriftingPolicy([1.01, 1.3, 1.4, None, 1.2, 1.5])
    ctl, _ = _controller(tmp_path, "sync", FakeGeneration(), policy=pol, gate=GATE)
    summary = asyncio.run(ctl.run())
    assert len(_steps(summary)) == 6
    shown = ctl.poll(0)["progress"]
    assert shown["logprob_mismatch"].startswith(
        "genLogprobError above logprobGate.threshold 1.1 for 4 measured steps in a row (steps 2-6"
    )
    # The fakes answer 2 tokens, the second one end-of-sequence: every sample finished.
    assert (shown["response_length_mean"], shown["response_length_max"], shown["truncated_fraction"]) == (
        2,
        2,
        0,
    )
    served = progress.Progress(**{k: v for k, v in shown.items() if k not in ("reward_failures",)})
    assert served.to_json()["logprobMismatch"] == shown["logprob_mismatch"]


def test_with_fail_job_the_run_stops_at_the_step_that_trips_the_gate(tmp_path: Path) -> None:
    pol = DriftingPolicy([1.3, 1.01, 1.3, 1.3, 1.3, 1.3])
    gate = logprob_gate.GateSettings(threshold=1.1, steps=3, fail=True)
    ctl, _ = _controller(tmp_path, "sync", FakeGeneration(), policy=pol, gate=gate)
    with pytest.raises(logprob_gate.LogprobMismatchError, match=r"steps 3-5.*failJob is set"):
        asyncio.run(ctl.run())
    assert pol.steps == 5 and ctl.state == "failed"
