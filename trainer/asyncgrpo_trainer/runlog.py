"""The driver's log and step records as files on the checkpoint volume (asyncgrpo_api.outputs).

A container's log goes with its pod, and cleanupPolicy deletes the pods with the RayCluster; the
files written here stay on the checkpoint volume, where `asyncgrpo logs` points once the pod is
gone:

- `tee_output` copies everything the driver process writes to its stdout and stderr (Python's
  logging, the step lines, tracebacks, and what child processes that inherit them write) into the
  attempt's log file, while the container log still gets it unchanged. It works on the file
  descriptors, so output written by C code or by `print` is copied too.
- `StepsFile` appends one JSON line per step, validation and checkpoint record. The controller
  writes it as it records them, so a step's line is on the volume before that step's checkpoint
  (the driver relays records a poll later, and a driver killed in between would lose the line of
  the step it resumes after). A resumed attempt first drops the lines of the steps after its
  checkpoint, which it trains again, so each step appears once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ATTEMPT_ENV = "ASYNCGRPO_ATTEMPT"
"""Set by the operator on the driver container: which attempt of the job this driver is."""
_CHUNK = 65536


def tee_output(path: Path) -> Callable[[], None]:
    """Copy fds 1 and 2 into `path` (appended) from now on; returns the function that stops it.

    Each fd is replaced by a pipe whose reader thread writes every chunk to the original fd first,
    then to the file, so the container log never waits for the volume and never loses output when
    the file cannot be written (a full volume costs the file copy, not the run).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = path.open("ab", buffering=0)
    lock = threading.Lock()
    threads: list[threading.Thread] = []
    restores: list[tuple[int, int]] = []
    for fd in (1, 2):
        original = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        restores.append((fd, original))
        thread = threading.Thread(
            target=_pump, args=(read_end, original, sink, lock), name=f"tee-fd{fd}", daemon=True
        )
        thread.start()
        threads.append(thread)

    def stop() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in restores:
            os.dup2(original, fd)  # closes the pipe's last write end: the reader sees EOF
        for thread in threads:
            thread.join(timeout=5)
        for _, original in restores:
            os.close(original)
        sink.close()

    return stop


def _pump(read_end: int, original: int, sink: Any, lock: threading.Lock) -> None:
    broken = False
    while chunk := os.read(read_end, _CHUNK):
        os.write(original, chunk)
        if broken:
            continue
        try:
            with lock:
                sink.write(chunk)
        except OSError as exc:
            broken = True
            os.write(original, f"asyncgrpo: the driver log file stopped: {exc}\n".encode())
    os.close(read_end)


def attempt_from_env() -> int | None:
    value = os.environ.get(ATTEMPT_ENV, "")
    return int(value) if value.isdigit() else None


class StepsFile:
    """The run's step and validation records, one JSON line each (see the module docstring)."""

    def __init__(self, path: Path, *, resumed_step: int | None, attempt: int | None) -> None:
        self.path = path
        self.attempt = attempt
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.exists() and resumed_step is not None:
            for line in path.read_text().splitlines():
                step = _step_of(line)
                if step is not None and step <= resumed_step:
                    kept.append(line)
        # A fresh start (no checkpoint) begins an empty file: older lines are another run's.
        path.write_text("".join(f"{line}\n" for line in kept))
        self._file = path.open("a")

    def write(self, record: Mapping[str, Any]) -> None:
        doc = {"event": "step", "attempt": self.attempt, **record}  # validation records say so
        self._file.write(json.dumps(doc, default=float) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> int | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    step = doc.get("step") if isinstance(doc, dict) else None
    return step if isinstance(step, int) else None
