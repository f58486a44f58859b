"""A run's object-store side, around the driver's `execute`: check the store, raise this attempt's
fence, restore the newest durable checkpoint into the local checkpoint directory, then mirror new
checkpoints and the logs to the store until the run ends (`checkpoint_mirror`).

A job without spec.storage.objectStore gets a no-op; nothing here touches the local behaviour.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from asyncgrpo_api import outputs
from asyncgrpo_api.object_store_keys import DRIVER_LOG, logs_prefix
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_trainer import durable_checkpoints, object_store
from asyncgrpo_trainer.checkpoint_mirror import CheckpointMirror
from asyncgrpo_trainer.object_store import Store

log = logging.getLogger(__name__)
FINAL_UPLOAD_SECONDS = 120.0
"""How long the end of a run waits for the last checkpoint and logs to reach the store."""
VERDICT_UPLOAD_SECONDS = 10.0
"""The request timeout of the driver log's upload after its last line (`upload_driver_log`): the
pod's grace period is spent by then, and the mirror has already uploaded all but the last lines."""


def log_files(checkpoint_path: str, attempt: int | None) -> Callable[[], dict[str, Path]]:
    """The driver's log, the step records and the TensorBoard files, by their key under
    logs/attempt-N/ (TensorBoard adds files as it goes, so the set is read on every call)."""

    def files() -> dict[str, Path]:
        found = {
            DRIVER_LOG: Path(outputs.driver_log(checkpoint_path, attempt)),
            outputs.STEPS_FILE: Path(outputs.steps_file(checkpoint_path)),
        }
        board = Path(outputs.tensorboard_dir(checkpoint_path))
        if board.is_dir():
            for path in board.rglob("*"):
                if path.is_file():
                    found[f"{outputs.TENSORBOARD_DIR}/{path.relative_to(board).as_posix()}"] = path
        return found

    return files


@contextlib.contextmanager
def durable_storage(
    job: AsyncGRPOJob, attempt: int | None, on_durable: Callable[[int], None]
) -> Iterator[CheckpointMirror | None]:
    """Prepare the store for this attempt and mirror the run into it while the block runs. Raises
    `object_store.ObjectStoreRefusedError` when the credentials or the bucket are wrong."""
    spec = job.spec.storage.object_store
    config = object_store.config_of(job)
    if spec is None or config is None:
        yield None
        return
    store = Store(config)
    store.check()
    number = attempt or 0
    durable_checkpoints.register_attempt(store, number)
    local = Path(job.spec.checkpoint.path)
    restored = durable_checkpoints.restore_newest(store, local)
    if restored is not None:
        on_durable(restored.step)
    mirror = CheckpointMirror(
        store=store,
        local_root=local,
        attempt=number,
        keep_last=job.spec.checkpoint.keep_last,
        log_files=log_files(job.spec.checkpoint.path, attempt),
        log_interval_seconds=float(spec.log_upload_interval_seconds),
        on_durable=on_durable,
    )
    if restored is not None:
        mirror.state.durable_step = restored.step
    mirror.start()
    try:
        yield mirror
    finally:
        state = mirror.close(FINAL_UPLOAD_SECONDS)
        log.info(
            "object store: %d checkpoint uploads, durable step %s, %d failed requests%s",
            state.uploads,
            state.durable_step,
            state.failures,
            "; fenced by a newer attempt" if state.fenced else "",
        )


def upload_driver_log(job: AsyncGRPOJob, attempt: int | None) -> None:
    """Upload the driver's log once more, after the driver wrote its last line (the verdict comes
    after `durable_storage` has closed). A failure costs those last lines in the store, said in a
    warning, never the run's exit code."""
    config = object_store.config_of(job)
    path = Path(outputs.driver_log(job.spec.checkpoint.path, attempt))
    if config is None or not path.is_file():
        return
    try:
        Store(config, timeout_seconds=VERDICT_UPLOAD_SECONDS).upload_file(
            logs_prefix(attempt or 0) + DRIVER_LOG, path
        )
    except object_store.TransientError as exc:
        log.warning("the driver log's last lines did not reach the object store: %s", exc)
