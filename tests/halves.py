"""`make test`: the suite as two pytest processes side by side, the operator's half and the trainer's.

Why two: the operator's tests that drive the local control plane (tests/cluster, e2e, reliability,
webhook, chart) spend most of their time waiting on the API server, controllers, kubelet and pods.
On the 2-core CI machine they kept the load near 1.5 while they ran, and the trainer's tests, which
keep both cores busy, waited behind them: one after the other the suite took 46-48 minutes warm
(issue 26 asks under 45). Side by side, each half takes the CPU the other leaves.

How:
- The trainer's half is every test outside OPERATOR_HALF (a new test folder lands there by
  default), run at nice 10: when both want the CPU, the operator's tests, whose deadlines are real
  time (leases, poll intervals, pod start, the operator's unit tests of its pollers and queues
  among them), get it first; the trainer's tests count steps, not seconds. (With tests/operator in
  the niced half, two of its poller tests failed at load 17.)
- Each half has its own TMPDIR, a folder of this one, so `--fail-on-leftovers` judges only its own
  run and the two never share a temp folder; both are removed at the end. Its name is one letter
  and mkdtemp's eight: Ray's sockets live four levels under it (`RAY_TMPDIR`, tests/leftovers.py)
  and a socket's path may not exceed 107 bytes (a longer name failed every Ray test). torch's
  compile cache, which would follow TMPDIR, stays where it was, so it stays warm between runs.
- Every line either half prints is relayed as it ends, prefixed with the half's name; each half's
  own summary (failures, slowest durations) closes its lines, and the exit status is the first
  non-zero of the two (pytest's own codes: 5 still means a half collected nothing).
- The log ends with both halves' verdicts: each half's short test summary (its failed and errored
  tests) and final count line, printed again once both have exited. The half that ends first
  would otherwise have its failures somewhere in the middle of a long log.

    python -m tests.halves [pytest args...]    # what `make test` runs after building
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
OPERATOR_HALF = (
    "tests/api",
    "tests/chart",
    "tests/cluster",
    "tests/e2e",
    "tests/operator",
    "tests/reliability",
    "tests/webhook",
)
"""The operator's tests: its API, chart, local control plane, end-to-end and reliability runs."""
TRAINER_NICENESS = 10


def commands(pytest_args: list[str]) -> dict[str, list[str]]:
    """Each half's pytest command line: the operator's by folder, the trainer's by --ignore."""
    pytest = [sys.executable, "-m", "pytest"]
    return {
        "operator": [*pytest, *OPERATOR_HALF, *pytest_args],
        "trainer": [
            *("nice", "-n", str(TRAINER_NICENESS)),
            *pytest,
            "tests",
            *(f"--ignore={path}" for path in OPERATOR_HALF),
            *pytest_args,
        ],
    }


SHORT_SUMMARY = re.compile(r"^=+ short test summary info =+$")
FINAL_COUNTS = re.compile(r"\b(passed|failed|errors?|skipped|deselected|no tests ran)\b.* in [0-9.]+s\b")


def verdict(lines: list[str]) -> list[str]:
    """What a pytest run's output ends on: its short test summary (from its header) and its final
    count line; just the count line when nothing failed; the last line when neither is there (a
    crash before pytest summarised)."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if SHORT_SUMMARY.match(lines[i])), None)
    end = next((i for i in range(len(lines) - 1, -1, -1) if FINAL_COUNTS.search(lines[i])), None)
    if end is None:
        return lines[-1:]
    return lines[start : end + 1] if start is not None and start < end else [lines[end]]


def _relay(name: str, stream: IO[str], lock: threading.Lock, kept: list[str]) -> None:
    for line in stream:
        kept.append(line.rstrip("\n"))
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()


def run(pytest_args: list[str]) -> int:
    """Both halves at once; the exit status of the first that failed (in the order started)."""
    lock = threading.Lock()
    started: list[tuple[str, subprocess.Popen[str], threading.Thread, list[str]]] = []
    temps: list[Path] = []
    compile_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(
        Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    )
    try:
        for name, command in commands(pytest_args).items():
            temps.append(Path(tempfile.mkdtemp(prefix=name[0])))
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "TMPDIR": str(temps[-1]), "TORCHINDUCTOR_CACHE_DIR": compile_cache},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
            assert proc.stdout is not None
            kept: list[str] = []
            relay = threading.Thread(target=_relay, args=(name, proc.stdout, lock, kept), daemon=True)
            relay.start()
            started.append((name, proc, relay, kept))
        codes = []
        for _, proc, relay, _ in started:
            codes.append(proc.wait())
            relay.join()
        print("=== both halves, as each ended ===", flush=True)
        for (name, _, _, kept), code in zip(started, codes, strict=True):
            for line in verdict(kept):
                print(f"[{name}] {line}")
            print(f"[{name}] pytest exited {code}", flush=True)
        return next((code for code in codes if code), 0)
    finally:
        for _, proc, _, _ in started:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
