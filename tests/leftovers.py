"""A test run leaves nothing behind in /tmp: Ray's session folders, vLLM's sockets and the webhook
tests' folders.

Ray writes a session folder (logs, sockets, spilled objects) for every cluster it starts and never
removes it: the trainer tests' Ray, each driver subprocess's embedded Ray, `asyncgrpo run`. vLLM
makes a ZMQ socket file named by a UUID in VLLM_RPC_BASE_PATH (default /tmp) for each of its
channels, about 7 per engine, and never removes them either. For the whole run RAY_TMPDIR and
VLLM_RPC_BASE_PATH point every Ray and vLLM engine started by the tests (in this process or a
child, a Ray worker included) into a folder each, removed when pytest exits; a value the user set
is left alone. A Ray process
that outlives its run (the embedded Ray of a driver whose start failed, still exiting) can write
into that folder once more after it is gone; a later run removes such folders when no live
process names them (`sweep_unused_run_folders`). The webhook fixtures remove their own folders
(cluster_harness.Installation, e2e.test_operator.OperatorProcess).

At the end, what appeared in /tmp during the run is listed: /tmp/asyncgrpo-webhook-* and
/tmp/asyncgrpo-vllm-* folders (only the tests make them; `--fail-on-leftovers`, which CI sets,
fails the run on one), /tmp/ray/session_* folders and UUID-named files (vLLM's sockets), listed
only: on a machine shared with other people's `asyncgrpo run`, demos and vLLM a new one is usually
theirs, since this run's never go there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

OPTION = "--fail-on-leftovers"
FAILING = ("asyncgrpo-webhook-*", "asyncgrpo-vllm-*")
"""Under the system temp directory (/tmp): folders only the tests create."""
NOTED = ("ray/session_*", "????????-????-????-????-????????????")
"""What any Ray or vLLM on the machine creates: listed, never failing the run."""
RUN_FOLDERS = {"RAY_TMPDIR": "asyncgrpo-ray-", "VLLM_RPC_BASE_PATH": "asyncgrpo-vllm-"}
"""The variables pointed at a folder of this run, and the folder's prefix (short: Ray's and vLLM's
unix sockets live under it, and a socket's path is limited to 107 bytes)."""
SOCKETS_ROOM = len(
    "/asyncgrpo-ray-12345678/ray/session_2026-12-07_05-50-12_123456_4194304/sockets/plasma_store"
)
"""The longest socket path a run folder holds, less the temp folder it is made in: Ray's
(`local_run.ray_temp_dir`); vLLM's (a UUID under its folder) is shorter."""


def run_folder_parent(tmp: Path) -> Path:
    """Where the run folders are made: the temp folder when Ray's sockets fit under it (107 bytes),
    else /tmp. Under a TMPDIR 13 characters longer than the halves' own, every Ray test of a run
    failed on the socket path's length."""
    return tmp if len(str(tmp).encode()) + SOCKETS_ROOM <= 107 else Path("/tmp")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="fail the run when it left a webhook test folder in /tmp (CI sets it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Leftovers(Path(tempfile.gettempdir())), "asyncgrpo-leftovers")


def sweep_unused_run_folders(tmp: Path) -> list[Path]:
    """Remove the run folders (RUN_FOLDERS: asyncgrpo-ray-*, asyncgrpo-vllm-*) that no live process
    has in its command line or environment (a run's own pytest has them in its environment, its Ray
    processes in their arguments): those of runs that were killed before they could remove them."""
    pattern = re.compile(rb"(?:%s)[A-Za-z0-9_]+" % b"|".join(p.encode() for p in RUN_FOLDERS.values()))
    named: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        for part in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                named.update(m.decode() for m in pattern.findall((proc / part).read_bytes()))
    unused = [
        p
        for prefix in RUN_FOLDERS.values()
        for p in tmp.glob(f"{prefix}*")
        if p.name not in named and not _owner_alive(p)
    ]
    for path in unused:
        shutil.rmtree(path, ignore_errors=True)
    return unused


OWNER_FILE = ".owner-pid"
"""In each run folder: the pid of the pytest that made it. /proc/<pid>/environ shows a process's
environment as it started, so the pytest that set the folder's variable after starting is not seen
naming it: while none of its children held the folder (between two vLLM engines), another
session's sweep deleted a live run's vLLM folder, and that run's next engine failed on its socket."""


def _owner_alive(folder: Path) -> bool:
    try:
        pid = int((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


class Leftovers:
    """Ray's folder for this run, and the /tmp entries that were there before it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        for parent in {tmp, run_folder_parent(tmp)}:
            sweep_unused_run_folders(parent)
        self.before = self._present(FAILING + NOTED)
        self.run_dirs: dict[str, Path] = {}
        for env, prefix in RUN_FOLDERS.items():
            if env not in os.environ:
                self.run_dirs[env] = Path(tempfile.mkdtemp(prefix=prefix, dir=run_folder_parent(tmp)))
                (self.run_dirs[env] / OWNER_FILE).write_text(str(os.getpid()))
                os.environ[env] = str(self.run_dirs[env])
        self.left: list[Path] = []
        self.noted: list[Path] = []

    def _present(self, patterns: tuple[str, ...]) -> set[Path]:
        return {path for pattern in patterns for path in self.tmp.glob(pattern)}

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Session fixtures (the trainer tests' Ray) are torn down by now.
        self._remove_run_dirs()
        self.left = sorted(self._present(FAILING) - self.before)
        self.noted = sorted(self._present(NOTED) - self.before)
        if self.left and session.config.getoption(OPTION) and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _remove_run_dirs(self) -> None:
        for env, path in self.run_dirs.items():
            shutil.rmtree(path, ignore_errors=True)
            os.environ.pop(env, None)
        self.run_dirs = {}

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._remove_run_dirs()  # also when the session did not finish normally

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.left:
            fails = terminalreporter.config.getoption(OPTION)
            title = f"left in {self.tmp} by this run" + (f": the run fails ({OPTION})" if fails else "")
            terminalreporter.section(title, red=bool(fails), yellow=not fails)
            for path in self.left:
                terminalreporter.line(str(path))
        if self.noted:
            terminalreporter.section(f"new Ray session folders and vLLM sockets in {self.tmp} (another's)")
            for path in self.noted:
                terminalreporter.line(str(path))
