"""`make test`: the suite as two pytest processes side by side, the operator's half and the trainer's.

Why two: the operator's tests that drive the local control plane (tests/cluster, e2e, reliability,
webhook, chart) spend most of their time waiting on the API server, controllers, kubelet and pods.
On the 2-core CI machine they kept the load near 1.5 while they ran, and the trainer's tests, which
keep both cores busy, waited behind them: one after the other the suite took 46-48 minutes warm
(issue 26 asks under 45). Side by side, each half takes the CPU the other leaves.

How:
- The operator's half builds the local control plane first (a no-op when cached); a third lane
  builds Kueue, the real node and SeaweedFS beside its tests (`phases`), and each lane's time is
  printed at the end (`timings`), with both halves' counts as the last line (`counts`).
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
import time
from dataclasses import dataclass, field
from pathlib import Path

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
RUN_FAILS = re.compile(r"^=+ .*: the run fails\b.* =+$")
"""The title of a section the suite's own plugins print when they fail a run whose tests all passed
(tests/budget.py, tests/skip_policy.py, tests/leftovers.py)."""
SECTION = re.compile(r"^=+ .* =+$")
FINAL_COUNTS = re.compile(r"\b(passed|failed|errors?|skipped|deselected|no tests ran)\b.* in [0-9.]+s\b")


def verdict(lines: list[str]) -> list[str]:
    """What a pytest run's output ends on: the sections that failed a run whose tests passed (a test
    over the time budget, an unexpected skip, a leftover), its short test summary (from its header)
    and its final count line; just the count line when nothing failed; the last line when no count
    line is there (a crash before pytest summarised).

    Why the run-failing sections: on 2026-12-07 a CI run's operator half exited 1 with every test
    passed, and the log's tail, all CI keeps, did not say why (an image build charged to a test
    without a budget marker)."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if SHORT_SUMMARY.match(lines[i])), None)
    end = next((i for i in range(len(lines) - 1, -1, -1) if FINAL_COUNTS.search(lines[i])), None)
    if end is None:
        return lines[-1:]
    summary = lines[start : end + 1] if start is not None and start < end else [lines[end]]
    return [*run_failing_sections(lines[:end]), *summary]


def run_failing_sections(lines: list[str]) -> list[str]:
    """Each section titled "...: the run fails", with its lines up to the next section's title."""
    kept: list[str] = []
    inside = False
    for line in lines:
        if SECTION.match(line):
            inside = bool(RUN_FAILS.match(line))
        if inside:
            kept.append(line)
    return kept


@dataclass
class Half:
    """One half: its phases, run one after the other, each timed; the first that fails ends it."""

    name: str
    phases: list[tuple[str, list[str]]]
    env: dict[str, str]
    kept: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    code: int = 0
    current: subprocess.Popen[str] | None = None

    def run(self, lock: threading.Lock) -> None:
        for phase, command in self.phases:
            started = time.monotonic()
            self.current = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
            assert self.current.stdout is not None
            for line in self.current.stdout:
                self.kept.append(line.rstrip("\n"))
                with lock:
                    sys.stdout.write(f"[{self.name}] {line}")
                    sys.stdout.flush()
            self.code = self.current.wait()
            self.seconds[phase] = time.monotonic() - started
            if self.code:
                return


def phases(pytest_args: list[str]) -> dict[str, list[tuple[str, list[str]]]]:
    """Each lane's phases. The operator's half builds the control plane (a no-op when cached) and
    then runs its tests; beside them a third lane builds what only some of them start (Kueue, the
    real node, SeaweedFS); the trainer's half runs its tests at once.

    Why: on a fresh machine the Go builds took 26-31 minutes before the first test, and a cold run
    no longer fitted CI's 90. The control plane is 10 of them; the rest now builds while the
    operator's tests, which mostly wait on the API server and pods, run, and the trainer's tests,
    which need none of it, run from the start. A test that starts Kueue, the real node or SeaweedFS
    asks for its build first (`build_optional`, `build_node`): under the build's lock, so it waits
    for the lane's build rather than building twice."""
    pytest = commands(pytest_args)
    python = [sys.executable, "-m", "tests.cluster", "build"]
    return {
        "operator": [("build", python), ("tests", pytest["operator"])],
        "build": [("Kueue, the real node, SeaweedFS", [*python, "--kueue", "--real-node", "--s3"])],
        "trainer": [("tests", pytest["trainer"])],
    }


def run(pytest_args: list[str]) -> int:
    """Both halves at once; the exit status of the first that failed (in the order started)."""
    lock = threading.Lock()
    temps: list[Path] = []
    halves: list[Half] = []
    compile_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(
        Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    )
    started = time.monotonic()
    try:
        threads = []
        for name, steps in phases(pytest_args).items():
            temps.append(Path(tempfile.mkdtemp(prefix=name[0])))
            env = {**os.environ, "TMPDIR": str(temps[-1]), "TORCHINDUCTOR_CACHE_DIR": compile_cache}
            halves.append(Half(name, steps, env))
            threads.append(threading.Thread(target=halves[-1].run, args=(lock,), daemon=True))
            threads[-1].start()
        for thread in threads:
            thread.join()
        print("=== both halves, as each ended ===", flush=True)
        for half in halves:
            for line in verdict(half.kept):
                print(f"[{half.name}] {line}")
            print(f"[{half.name}] exited {half.code}", flush=True)
        print(timings(halves, time.monotonic() - started), flush=True)
        print(counts([verdict(half.kept)[-1] for half in halves]), flush=True)
        return next((half.code for half in halves if half.code), 0)
    finally:
        for half in halves:
            if half.current is not None and half.current.poll() is None:
                half.current.terminate()
                half.current.wait()
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)


COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)\b")


def counts(final_lines: list[str]) -> str:
    """Both halves' counts as one line in the plain form CI's reader takes ("tests: N passed, N
    failed, N skipped"); an error counts as a failure."""
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for line in final_lines:
        for number, word in COUNT.findall(line):
            total["failed" if word.startswith("error") else word] += int(number)
    return f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"


def timings(halves: list[Half], total: float) -> str:
    """Where the run's time went, phase by phase: printed last, so growth is seen the day it lands."""
    rows = [
        f"{half.name} {phase}: {seconds:.0f} s" for half in halves for phase, seconds in half.seconds.items()
    ]
    return f"=== time: {'; '.join(rows)}; both halves {total:.0f} s ==="


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
