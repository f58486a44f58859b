"""Start, record, check and stop the control-plane processes.

Every process gets its own session (so its process group id is its pid) and its own log file. The
launcher records pid and kernel start time in <state>/pids.json as soon as a process starts, so a
half-finished `up` can still be torn down, and `down` never signals a recycled pid: it only kills a
process group whose leader still has the recorded start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcRecord:
    """What `down` needs to stop one process safely."""

    name: str
    pid: int
    start_ticks: int
    log: str
    argv: list[str]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces; everything after the last ')' is space separated.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks (field 22 of /proc/<pid>/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(rec: ProcRecord) -> bool:
    """True if the recorded process still runs (same pid AND same start time, not a zombie)."""
    fields = _stat_fields(rec.pid)
    if fields is None or int(fields[19]) != rec.start_ticks:
        return False
    child = _CHILDREN.get(rec.pid)
    if child is not None and child.poll() is not None:  # our own child: reap it
        del _CHILDREN[rec.pid]
        return False
    return fields[0] not in ("Z", "X")


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of one process (VmRSS), 0 if it is gone. `field="VmHWM"`: its peak since
    it started, as the kernel counts it (no sampling can miss a brief one)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """A process's resident memory read every `interval` seconds on a thread, from `start` until
    `stop`: the peak a test bounds, which one reading before and one after would miss."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(rss_bytes(self.pid))
            self._stop.wait(self.interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        """The peak VmRSS in bytes (0 when the process was gone throughout)."""
        self._stop.set()
        self._thread.join(timeout=5)
        return max(self.samples, default=0)


class PidFile:
    """<state>/pids.json: the only processes `down` will ever signal."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcRecord]:
        if not self.path.exists():
            return []
        return [ProcRecord(**r) for r in json.loads(self.path.read_text())]

    def add(self, rec: ProcRecord) -> None:
        recs = [*self.load(), rec]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in recs], indent=1))
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def spawn(
    name: str, argv: list[str], *, logs: Path, env: dict[str, str], cwd: Path, pids: PidFile
) -> ProcRecord:
    """Start `argv` in a new session with output to <logs>/<name>.log and record it."""
    log = logs / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    ticks = start_ticks(proc.pid)
    rec = ProcRecord(name=name, pid=proc.pid, start_ticks=ticks or 0, log=str(log), argv=argv)
    pids.add(rec)
    _CHILDREN[proc.pid] = proc  # so this process can reap it; `down` may also run elsewhere
    return rec


def stop(rec: ProcRecord, *, grace: float = 10.0) -> bool:
    """SIGTERM the process group of `rec`, SIGKILL after `grace` s; False if it was already gone."""
    if not is_alive(rec):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(rec):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rec.pid, signal.SIGKILL)
    while is_alive(rec):
        time.sleep(0.05)
    return True


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (bind test, like the servers do it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: str | Path, lines: int = 30) -> str:
    """Last lines of a log file, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
