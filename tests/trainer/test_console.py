"""What a person sees from `asyncgrpo run`: the bar and the summary (console.HumanProgress),
fed the controller's progress documents at a clock the test moves."""

from __future__ import annotations

import io
from typing import Any

import pytest

from asyncgrpo_trainer import console
from asyncgrpo_trainer.console import HumanProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(console.time, "monotonic", fake)
    return fake


def doc(step: int, *, total: int = 10, samples: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "max_steps": total,
        "reward_mean": 0.25,
        "mean_staleness": 1.0,
        "mode": "async-in-order",
        "counters": {"samples_trained": samples},
        **extra,
    }


def test_on_a_terminal_the_bar_is_one_line_with_step_reward_samples_per_second_and_eta(clock: Clock) -> None:
    out = io.StringIO()
    bar = HumanProgress(out, tty=True)
    bar.update(doc(0), [])
    clock.now += 10
    bar.update(doc(5, samples=320.0), [])
    bar.end()
    text = out.getvalue()
    assert "\n" not in text.rstrip("\n") and text.endswith("\n")  # redrawn in place, one newline at the end
    last = text.split("\r")[-1]
    assert last.startswith("[" + "#" * (console.BAR_WIDTH // 2) + "." * (console.BAR_WIDTH // 2) + "] 5/10")
    assert "reward 0.250" in last and "32 samples/s" in last and "ETA 10.0 s" in last
    assert "accuracy" not in last


def test_the_bar_shows_accuracy_once_the_environment_reports_it(clock: Clock) -> None:
    out = io.StringIO()
    bar = HumanProgress(out, tty=True)
    bar.update(doc(1, accuracy=0.5, validation_accuracy=None), [])
    assert "accuracy 0.50" in out.getvalue() and "validation accuracy" not in out.getvalue()


def test_without_a_terminal_it_writes_a_line_per_tenth_of_the_run(clock: Clock) -> None:
    out = io.StringIO()
    bar = HumanProgress(out, tty=False)
    for step in range(0, 101):
        clock.now += 1
        bar.update(doc(step, total=100, samples=64.0 * step), [])
    bar.end()
    lines = out.getvalue().splitlines()
    assert [line.split("]")[1].split()[0] for line in lines] == [
        f"{s}/100" for s in (1, *range(11, 100, 10), 100)
    ]
    assert "\r" not in out.getvalue()


def test_a_run_that_ends_before_the_first_update_still_shows_its_full_bar(clock: Clock) -> None:
    out = io.StringIO()
    bar = HumanProgress(out, tty=False)
    clock.now += 1
    bar.update(doc(6, total=6, samples=384.0), [])
    bar.end()
    assert out.getvalue().startswith("[" + "#" * console.BAR_WIDTH + "] 6/6  reward ")


def test_the_summary_says_how_far_how_well_how_fast_and_where_the_checkpoint_is(clock: Clock) -> None:
    out = io.StringIO()
    run = HumanProgress(out, checkpoints="/tmp/ckpt", tty=False)
    clock.now += 30  # Ray and the workers start
    run.update(doc(0), [])
    records = [{"step": s, "reward_mean": 0.1 * s} for s in (1, 2, 3)] + [{"event": "checkpoint", "step": 3}]
    run.update(doc(3, total=3, samples=192.0, last_checkpoint_step=3, validation_reward=0.4), records)
    run.end()
    run.summary({"steps": 3, "wall_seconds": 2.5, "samples": 192.0, "samples_per_second": 76.8})
    summary = out.getvalue().split("\n", 1)[1]
    assert summary.splitlines() == [
        "trained 3/3 steps (async-in-order) in 2.5 s (30.0 s with start-up)",
        "  reward              0.100 at step 1 -> 0.300 at step 3",
        "  validation reward   0.400",
        "  throughput          76.8 samples/s (192 samples)",
        "  staleness           1.00 versions (last step)",
        "  checkpoint          step 3 in /tmp/ckpt",
    ]


def test_durations_read_as_seconds_minutes_or_hours() -> None:
    assert [console.duration(s) for s in (3.21, 245, 3720)] == ["3.2 s", "4 min 05 s", "1 h 02 min"]


@pytest.mark.parametrize("tty", [True, False])
def test_a_final_validation_after_the_last_update_redraws_the_bar_so_bar_and_summary_agree(
    clock: Clock, tty: bool
) -> None:
    out = io.StringIO()
    run = HumanProgress(out, tty=tty)
    run.update(doc(0, total=60), [])
    clock.now += 10
    run.update(doc(60, total=60, samples=640.0, validation_accuracy=0.99), [])  # step 50's validation
    run.end()
    clock.now += 5  # the final validation ran after the last update
    run.summary({"steps": 60, "wall_seconds": 15.0, "validation_accuracy": 0.98})
    text = out.getvalue()
    bar = [line.split("\r")[-1] for line in text.splitlines() if "] 60/60" in line][-1]
    assert "validation accuracy 0.98" in bar and "64 samples/s" in bar, text  # as of the last update
    assert "  validation accuracy 0.980" in text
    if tty:  # redrawn over the old bar, not printed as a second one
        assert text.count("\x1b[A\r") == 1 and text.endswith("\n"), text


def test_the_bar_is_not_redrawn_when_the_summary_adds_nothing_new(clock: Clock) -> None:
    out = io.StringIO()
    run = HumanProgress(out, tty=False)
    run.update(doc(10, validation_accuracy=0.5), [])
    run.end()
    run.summary({"steps": 10, "wall_seconds": 1.0, "validation_accuracy": 0.5})
    assert len([line for line in out.getvalue().splitlines() if line.startswith("[")]) == 1
