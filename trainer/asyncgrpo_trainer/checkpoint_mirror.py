"""The driver's background copy of the checkpoint directory and the run's logs to the object store.

Why a thread in the driver and not a step in the controller: training never waits for the store.
The controller writes checkpoints locally as before (`checkpoint.commit`); this thread notices each
new complete step directory, uploads the log files, freezes the checkpoint with hard links (so the
controller's local retention may delete it meanwhile without tearing the upload), uploads it with
its manifest, then applies `keepLast` in the store. An upload that fails (the server away, a full
quota) is retried with backoff, always for the newest local checkpoint; the run goes on. The
driver's log, the step records and the TensorBoard files are uploaded before each checkpoint,
every logUploadIntervalSeconds and at the end.
`durable_step` is what the job's status reports as durableCheckpointStep.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from asyncgrpo_api.object_store_keys import logs_prefix
from asyncgrpo_trainer import checkpoint, durable_checkpoints
from asyncgrpo_trainer.durable_checkpoints import FencedError
from asyncgrpo_trainer.durable_layout import CheckpointId
from asyncgrpo_trainer.object_store import Store, TransientError

log = logging.getLogger(__name__)
MAX_BACKOFF_SECONDS = 30.0


@dataclass
class MirrorState:
    """What the mirror has achieved: read by the progress report and the tests."""

    durable_step: int | None = None
    uploads: int = 0
    failures: int = 0
    fenced: bool = False
    last_error: str = ""


@dataclass
class CheckpointMirror:
    """Copies new local checkpoints and the log files to the store until `close`."""

    store: Store
    local_root: Path
    attempt: int
    keep_last: int
    log_files: Callable[[], dict[str, Path]]
    """The log files to upload, by their key under logs/attempt-N/."""
    log_interval_seconds: float = 30.0
    poll_seconds: float = 1.0
    on_durable: Callable[[int], None] = lambda step: None
    state: MirrorState = field(default_factory=MirrorState)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _retry_at: float = 0.0
    _logs_at: float = 0.0
    _log_marks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def start(self) -> CheckpointMirror:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-mirror", daemon=True)
        self._thread.start()
        return self

    def close(self, deadline_seconds: float = 120.0) -> MirrorState:
        """Stop the thread, then upload the newest checkpoint and the logs one last time, retrying
        until `deadline_seconds` (within the pod's grace period on SIGTERM)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end = time.monotonic() + deadline_seconds
        self._retry_at = 0.0
        while time.monotonic() < end and not self.state.fenced:
            if self._sync_checkpoint() and self._sync_logs():
                break
            time.sleep(min(max(self._retry_at - time.monotonic(), 0.1), max(end - time.monotonic(), 0.0)))
        return self.state

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self._sync_checkpoint()
                if time.monotonic() >= self._logs_at:
                    self._sync_logs()
                    self._logs_at = time.monotonic() + self.log_interval_seconds
            except Exception as exc:  # an error no one expected must not end durability
                # A dead thread would stop every later upload while training goes on unaware;
                # counted and retried like a failed request, it shows in Durable-Ckpt and the log.
                self._failed(f"{type(exc).__name__}: {exc}")

    def _sync_checkpoint(self) -> bool:
        """Upload the newest local checkpoint if it is newer than the durable one; True when
        nothing is left to upload."""
        newest = checkpoint.latest(self.local_root)
        if self.state.fenced or newest is None or (self.state.durable_step or -1) >= newest:
            return True
        if time.monotonic() < self._retry_at:
            return False
        # The logs first: a checkpoint that is durable has the step records and the driver's log
        # up to it in the store too, so a resumed attempt's curves (`asyncgrpo plot`) and the killed
        # attempt's log (`asyncgrpo logs --attempt N`) have no gap before the step it resumes from.
        self._sync_logs()
        frozen = self.local_root / f".upload-{newest:08d}"
        try:
            _freeze(checkpoint.step_dir(self.local_root, newest), frozen)
            cid = CheckpointId(self.attempt, newest)
            durable_checkpoints.upload(self.store, frozen, cid)
            self.state.uploads += 1
            self.state.durable_step = newest
            self.on_durable(newest)
            log.info("checkpoint of step %d is durable in the object store", newest)
            durable_checkpoints.prune(self.store, own_attempt=self.attempt, keep_last=self.keep_last)
        except FencedError as exc:
            self.state.fenced = True
            self.state.last_error = str(exc)
            log.warning("%s", exc)
        except FileNotFoundError:
            return False  # pruned locally while freezing: the next poll takes the newer one
        except TransientError as exc:
            self._failed(f"upload of the checkpoint of step {newest}: {type(exc).__name__}: {exc}")
            return False
        finally:
            shutil.rmtree(frozen, ignore_errors=True)
        return True

    def _sync_logs(self) -> bool:
        """Upload the log files that changed since their last upload; True when all are up."""
        if self.state.fenced:
            return True
        ok = True
        for name, path in self.log_files().items():
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            mark = (stat.st_size, stat.st_mtime_ns)
            if self._log_marks.get(name) == mark:
                continue
            try:
                self.store.upload_file(logs_prefix(self.attempt) + name, path)
                self._log_marks[name] = mark
            except TransientError as exc:
                self._failed(f"upload of {name}: {type(exc).__name__}: {exc}")
                ok = False
        return ok

    def _failed(self, what: str) -> None:
        self.state.failures += 1
        self.state.last_error = what
        backoff = min(2.0 ** min(self.state.failures, 5), MAX_BACKOFF_SECONDS)
        self._retry_at = time.monotonic() + backoff
        log.warning("object store: %s; retrying in %.0f s", what, backoff)


def _freeze(step_dir: Path, frozen: Path) -> None:
    """Hard-link every file of `step_dir` under `frozen` (copied where links are refused): the
    upload reads files that local retention can no longer remove under it."""
    shutil.rmtree(frozen, ignore_errors=True)
    for path in sorted(step_dir.rglob("*")):
        target = frozen / path.relative_to(step_dir)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            shutil.copy2(path, target)
    if not (frozen / checkpoint.META_FILE).is_file():
        raise FileNotFoundError(f"{step_dir} was removed while it was frozen for upload")
