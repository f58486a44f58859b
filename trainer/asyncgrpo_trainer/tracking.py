"""Curves: the driver's step and validation records as TensorBoard scalars, and on W&B.

The driver relays every record of the controller here (`Curves.write`). TensorBoard event files go
to `<checkpoint.path>/tensorboard` (the checkpoint volume, so they outlive the pods and a
resumed attempt appends to them; `tensorboard --logdir` and `asyncgrpo plot` read them). A
resumed attempt starts its writer with `purge_step` at the first step it will train, so the steps
its predecessor logged after the last checkpoint, which are trained again, are dropped from the
curves instead of appearing twice.

The x axis is the RL step; `train/samples` maps it to trained samples (P x N per step), the axis on
which modes compare (`asyncgrpo plot`). With WANDB_API_KEY in the driver's environment the same
scalars go to Weights & Biases (WANDB_MODE=offline works without network; WANDB_PROJECT names the
project, default "asyncgrpo"); without the `wandb` package the driver says so once and goes on.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from asyncgrpo_api import outputs

log = logging.getLogger(__name__)

TENSORBOARD_DIR = outputs.TENSORBOARD_DIR
"""Under checkpoint.path."""
WANDB_RUN_ID_FILE = "wandb-run-id"
"""In TENSORBOARD_DIR: the W&B run of this checkpoint path, reused by every attempt."""

SCALARS: dict[str, tuple[str, float]] = {
    # record key: (tag, scale)
    "reward_mean": ("train/reward", 1.0),
    "accuracy": ("train/accuracy", 1.0),
    "reward_spread": ("train/reward_spread", 1.0),
    "zero_advantage_groups": ("train/zero_advantage_groups", 1.0),
    "samples_trained": ("train/samples", 1.0),
    "loss": ("train/loss", 1.0),
    "entropy": ("train/entropy", 1.0),
    "kl": ("train/kl", 1.0),
    "grad_norm": ("train/grad_norm", 1.0),
    "lr": ("train/lr", 1.0),
    "clip_fraction": ("train/clip_fraction", 1.0),
    "reward_failures": ("train/reward_failures", 1.0),
    "groups_dropped_uninformative": ("train/groups_dropped_uninformative", 1.0),
    "groups_generated": ("train/groups_generated", 1.0),
    "response_length_mean": ("gen/response_length_mean", 1.0),
    "response_length_max": ("gen/response_length_max", 1.0),
    "truncated_fraction": ("gen/truncated_fraction", 1.0),
    "gen_logprob_error": ("gen/logprob_error", 1.0),
    "gen_kl_error": ("gen/kl_error", 1.0),
    "mean_staleness": ("async/staleness_mean", 1.0),
    "max_staleness": ("async/staleness_max", 1.0),
    "mean_oldest_staleness": ("async/staleness_oldest_mean", 1.0),
    "max_oldest_staleness": ("async/staleness_oldest_max", 1.0),
    "behaviour_kl": ("async/behaviour_kl", 1.0),
    "is_weight_mean": ("async/is_weight_mean", 1.0),
    "is_weight_max": ("async/is_weight_max", 1.0),
    "is_out_of_bounds": ("async/is_out_of_bounds", 1.0),
    "evicted_groups": ("async/evicted_groups", 1.0),
    "tokens_per_second": ("perf/tokens_per_second", 1.0),
    "refit": ("perf/refit_ms", 1000.0),
    "refit_seconds": ("perf/weight_transfer_ms", 1000.0),
    "generation_pause_seconds": ("perf/generation_pause_ms", 1000.0),
    "step_seconds": ("perf/step_seconds", 1.0),
    "exposed_generation": ("perf/exposed_generation_seconds", 1.0),
    "policy_idle_share": ("fleet/policy_idle_share", 1.0),
    "policy_busy_share": ("fleet/policy_busy_share", 1.0),
    "generation_idle_share": ("fleet/generation_idle_share", 1.0),
    "generation_gated_share": ("fleet/generation_gated_share", 1.0),
    "generation_engines": ("fleet/generation_engines", 1.0),
    "buffer_fill": ("fleet/buffer_fill", 1.0),
    "weight_version": ("fleet/weight_version", 1.0),
    "samples_untrained": ("fleet/samples_untrained", 1.0),
    "validation_reward": ("val/reward", 1.0),
    "validation_accuracy": ("val/accuracy", 1.0),
}
"""What each record contributes: the step records' metrics and the validation records' results."""


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's scalars by tag (only the keys it has, and only numbers)."""
    out = {}
    for key, (tag, scale) in SCALARS.items():
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[tag] = float(value) * scale
    return out


class Sink(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    """Event files under `directory` (torch's SummaryWriter)."""

    def __init__(self, directory: Path, *, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (tensorboard is heavy)

        self.writer = SummaryWriter(str(directory), purge_step=purge_step, flush_secs=10)

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per job: its id is kept next to the event files (`WANDB_RUN_ID_FILE`), so a
    resumed attempt, which finds it there, continues the run."""

    def __init__(
        self, wandb: Any, *, run_id: str, name: str, config: dict[str, Any], directory: Path
    ) -> None:
        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "asyncgrpo"),
            id=run_id,
            name=name,
            config=config,
            dir=str(directory),
            resume="allow",
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class Curves:
    """Every sink the driver writes to; see the module docstring. A `progress.Reporter`: the
    driver relays each step record to it as it relays them to the console."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def write(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        values = scalars(record)
        if not isinstance(step, int) or not values:
            return
        for sink in self.sinks:
            sink.log(step, values)

    def update(self, progress: Mapping[str, Any], records: list[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def summary(self, summary: dict[str, Any]) -> None:
        return

    def end(self) -> None:
        self.close()

    def close(self) -> None:
        """Close every sink (once: later calls do nothing)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception:  # closing a curve sink must not fail a finished run
                log.warning("closing %s failed", type(sink).__name__, exc_info=True)


def open_curves(
    checkpoint_path: str,
    *,
    job_name: str,
    config: dict[str, Any],
    resumed_step: int | None,
    environ: Mapping[str, str] = os.environ,
) -> Curves:
    """TensorBoard under the checkpoint path, plus W&B when WANDB_API_KEY is set."""
    directory = Path(outputs.tensorboard_dir(checkpoint_path))
    purge = None if resumed_step is None else resumed_step + 1
    sinks: list[Sink] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        sinks.append(TensorBoardSink(directory, purge_step=purge))
    except OSError as exc:
        # Curves are not worth failing a run for; an unusable checkpoint path fails the first
        # checkpoint anyway, with the error that names it.
        log.warning("no TensorBoard curves: cannot write %s: %s", directory, exc)
        return Curves(sinks)
    if environ.get("WANDB_API_KEY"):
        try:
            import wandb  # noqa: PLC0415 (optional: only with WANDB_API_KEY)
        except ImportError:
            log.warning(
                "WANDB_API_KEY is set but the wandb package is not installed in the trainer image; "
                "curves go to TensorBoard only (%s). Install wandb to log to Weights & Biases",
                directory,
            )
        else:
            run_id = _wandb_run_id(directory, job_name)
            sinks.append(WandbSink(wandb, run_id=run_id, name=job_name, config=config, directory=directory))
    return Curves(sinks)


def _wandb_run_id(directory: Path, job_name: str) -> str:
    path = directory / WANDB_RUN_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    run_id = f"{job_name}-{uuid.uuid4().hex[:8]}"
    path.write_text(run_id + "\n")
    return run_id
