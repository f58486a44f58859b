"""A test run leaves nothing behind in /tmp: Ray's session folders and the webhook tests' folders.

Ray writes a session folder (logs, sockets, spilled objects) for every cluster it starts and never
removes it: the trainer tests' Ray, each driver subprocess's embedded Ray, `asyncgrpo run`. For
the whole run RAY_TMPDIR points every Ray started by the tests (in this process or a child) into
one folder, removed when pytest exits; a RAY_TMPDIR the user set is left alone. A Ray process
that outlives its run (the embedded Ray of a driver whose start failed, still exiting) can write
into that folder once more after it is gone; a later run removes such folders when no live
process names them (`sweep_unused_ray_folders`). The webhook fixtures remove their own folders
(cluster_harness.Installation, e2e.test_operator.OperatorProcess).

At the end, what appeared in /tmp during the run is listed: /tmp/asyncgrpo-webhook-* folders
(only the tests make them; `--fail-on-leftovers`, which CI sets, fails the run on one) and
/tmp/ray/session_* folders (listed only: on a machine shared with other people's `asyncgrpo run`
and demos a new one is usually theirs, since this run's Ray sessions never go there).
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
FAILING = ("asyncgrpo-webhook-*",)
"""Under the system temp directory (/tmp): folders only the tests create."""
NOTED = ("ray/session_*",)
"""Folders any Ray on the machine creates: listed, never failing the run."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="fail the run when it left a webhook test folder in /tmp (CI sets it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Leftovers(Path(tempfile.gettempdir())), "asyncgrpo-leftovers")


def sweep_unused_ray_folders(tmp: Path) -> list[Path]:
    """Remove the asyncgrpo-ray-* folders that no live process has in its command line or
    environment (a run's own pytest has it in RAY_TMPDIR, its Ray processes in their arguments)."""
    named: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        for part in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                named.update(re.findall(rb"asyncgrpo-ray-[A-Za-z0-9_]+", (proc / part).read_bytes()))
    unused = [p for p in tmp.glob("asyncgrpo-ray-*") if p.name.encode() not in named]
    for path in unused:
        shutil.rmtree(path, ignore_errors=True)
    return unused


class Leftovers:
    """Ray's folder for this run, and the /tmp entries that were there before it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        sweep_unused_ray_folders(tmp)
        self.before = self._present(FAILING + NOTED)
        self.ray_dir: Path | None = None
        if "RAY_TMPDIR" not in os.environ:
            # Short: Ray's unix sockets live under it (the path limit is 107 bytes).
            self.ray_dir = Path(tempfile.mkdtemp(prefix="asyncgrpo-ray-", dir=tmp))
            os.environ["RAY_TMPDIR"] = str(self.ray_dir)
        self.left: list[Path] = []
        self.noted: list[Path] = []

    def _present(self, patterns: tuple[str, ...]) -> set[Path]:
        return {path for pattern in patterns for path in self.tmp.glob(pattern)}

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Session fixtures (the trainer tests' Ray) are torn down by now.
        self._remove_ray_dir()
        self.left = sorted(self._present(FAILING) - self.before)
        self.noted = sorted(self._present(NOTED) - self.before)
        if self.left and session.config.getoption(OPTION) and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _remove_ray_dir(self) -> None:
        if self.ray_dir is not None:
            shutil.rmtree(self.ray_dir, ignore_errors=True)
            os.environ.pop("RAY_TMPDIR", None)
            self.ray_dir = None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._remove_ray_dir()  # also when the session did not finish normally

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.left:
            fails = terminalreporter.config.getoption(OPTION)
            title = f"left in {self.tmp} by this run" + (f": the run fails ({OPTION})" if fails else "")
            terminalreporter.section(title, red=bool(fails), yellow=not fails)
            for path in self.left:
                terminalreporter.line(str(path))
        if self.noted:
            terminalreporter.section(f"new Ray session folders in {self.tmp} (this run's or another's)")
            for path in self.noted:
                terminalreporter.line(str(path))
