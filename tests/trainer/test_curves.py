"""Curves: the driver's records as TensorBoard scalars (and W&B), read back by `asyncgrpo plot`.

The records here have the driver's shape; tests/trainer/test_modes_learn.py reads the event files
of real runs."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_cli import main as cli
from asyncgrpo_trainer import plot, tracking

SAMPLES = 64


def _step(step: int, accuracy: float) -> dict[str, Any]:
    return {
        "step": step,
        "samples_trained": step * SAMPLES,
        "reward_mean": accuracy / 2 + 0.1,
        "accuracy": accuracy,
        "loss": 0.1,
        "entropy": 1.5,
        "kl": 0.0,
        "grad_norm": 0.3,
        "mean_staleness": 1.0,
        "max_staleness": 1,
        "is_weight_mean": 1.0,
        "is_weight_max": 1.5,
        "tokens_per_second": 900.0,
        "refit": 0.004,
        "step_seconds": 0.2,
        "refit_transport": "object-store",  # not a number: not a scalar
    }


def _write(path: Path, records: list[dict[str, Any]], resumed_step: int | None = None) -> None:
    curves = tracking.open_curves(str(path), job_name="j", config={}, resumed_step=resumed_step, environ={})
    for record in records:
        curves.write(record)
    curves.close()


def test_every_curve_the_issue_names_is_a_scalar_of_the_step_records() -> None:
    tags = set(tracking.scalars({**_step(3, 0.5), "validation_accuracy": 0.4, "validation_reward": 0.6}))
    for name in (
        "reward",
        "accuracy",
        "loss",
        "entropy",
        "kl",
        "grad_norm",
        "staleness_mean",
        "is_weight_mean",
        "is_weight_max",
        "tokens_per_second",
        "refit_ms",
        "step_seconds",
    ):
        assert any(tag.endswith("/" + name) for tag in tags), name
    assert {"val/accuracy", "val/reward", "train/samples"} <= tags
    assert tracking.scalars(_step(1, 0.0))["perf/refit_ms"] == pytest.approx(4.0)


def test_plot_reads_accuracy_and_reward_against_trained_samples_from_the_event_files(tmp_path: Path) -> None:
    run = tmp_path / "sync"
    _write(
        run,
        [_step(s, s / 10) for s in range(1, 6)]
        + [{"event": "validation", "step": 5, "validation_accuracy": 0.75}],
    )
    assert (run / "tensorboard").is_dir()
    loaded = plot.load(run)
    assert loaded.label == "sync"
    assert loaded.accuracy == [(s * SAMPLES, pytest.approx(s / 10)) for s in range(1, 6)]
    assert loaded.validation_accuracy == [(5 * SAMPLES, 0.75)]
    assert [x for x, _ in loaded.reward] == [s * SAMPLES for s in range(1, 6)]


def test_a_resumed_run_replaces_the_steps_it_trains_again(tmp_path: Path) -> None:
    """The first attempt logged steps 1-6 but checkpointed at 4; the retry trains 5 and 6 again."""
    _write(tmp_path, [_step(s, 0.1) for s in range(1, 7)])
    _write(tmp_path, [_step(s, 0.9) for s in range(5, 9)], resumed_step=4)
    acc = plot.load(tmp_path).accuracy
    assert [x for x, _ in acc] == [s * SAMPLES for s in range(1, 9)]
    assert [round(v, 3) for _, v in acc] == [0.1] * 4 + [0.9] * 4


def test_a_resumed_writers_tenth_file_of_the_same_second_is_still_read_after_its_ninth(
    tmp_path: Path,
) -> None:
    """Event files are named `<second>.<host>.<pid>.<n>`, n counting a process's writers: two
    attempts written in one second by one process, the first its 9th writer and the second its
    10th, must load in that order (as text, `.10` sorts first and the older values won)."""
    names = []
    for records, resumed in (
        ([_step(s, 0.1) for s in range(1, 7)], None),
        ([_step(s, 0.9) for s in range(5, 9)], 4),
    ):
        before = set(tmp_path.rglob("events.*"))
        _write(tmp_path, records, resumed_step=resumed)
        (new,) = set(tmp_path.rglob("events.*")) - before
        names.append(new)
    stamp, host = "1800000000", "host.example"
    for file, number in zip(names, (9, 10), strict=True):
        file.rename(file.parent / f"events.out.tfevents.{stamp}.{host}.4242.{number}")
    acc = plot.load(tmp_path).accuracy
    assert [round(v, 3) for _, v in acc] == [0.1] * 4 + [0.9] * 4


def test_asyncgrpo_plot_writes_a_png_of_several_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, slope in (("sync", 10), ("async", 8)):
        _write(
            tmp_path / name,
            [_step(s, s / slope) for s in range(1, 8)] + [{"step": 7, "validation_accuracy": 0.6}],
        )
    out = tmp_path / "curves.png"
    assert cli.main(["plot", str(tmp_path / "sync"), str(tmp_path / "async"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert cli.main(["plot", str(tmp_path / "missing"), "-o", str(out)]) == 1
    assert "no TensorBoard event files" in capsys.readouterr().err


def test_without_the_wandb_package_a_wandb_key_is_reported_once_and_tensorboard_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with caplog.at_level(logging.WARNING, logger="asyncgrpo_trainer.tracking"):
        curves = tracking.open_curves(
            str(tmp_path), job_name="j", config={}, resumed_step=None, environ={"WANDB_API_KEY": "k"}
        )
        for s in range(1, 4):
            curves.write(_step(s, 0.2))
        curves.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "wandb package is not installed" in warnings[0]
    assert len(plot.load(tmp_path).accuracy) == 3


class FakeWandb(types.ModuleType):
    """Records what the trainer asks of the wandb package (the package itself is optional)."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.inits: list[dict[str, Any]] = []
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.finished = 0

    def init(self, **kwargs: Any) -> Any:
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, values: dict[str, float], step: int) -> None:
                fake.logged.append((step, values))

            def finish(self) -> None:
                fake.finished += 1

        return Run()


def test_with_a_wandb_key_the_same_scalars_go_to_one_wandb_run_that_a_resumed_attempt_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for attempt in range(2):
        curves = tracking.open_curves(
            str(tmp_path),
            job_name="demo",
            config={"grpo": {}},
            resumed_step=attempt or None,
            environ={"WANDB_API_KEY": "k"},
        )
        curves.write(_step(attempt + 1, 0.5))
        curves.close()
    assert fake.inits[0]["id"] == fake.inits[1]["id"] and fake.inits[0]["id"].startswith("demo-")
    assert all(i["resume"] == "allow" and i["config"] == {"grpo": {}} for i in fake.inits)
    assert [step for step, _ in fake.logged] == [1, 2] and fake.finished == 2
    assert fake.logged[0][1] == tracking.scalars(_step(1, 0.5))


def test_a_checkpoint_path_that_cannot_hold_curves_costs_the_curves_not_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    curves = tracking.open_curves(str(blocker), job_name="j", config={}, resumed_step=None, environ={})
    curves.write(_step(1, 0.5))  # nothing to write to, and no error
    curves.close()
    assert curves.sinks == []
