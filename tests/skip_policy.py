"""Which skips a green run may contain: CI (`.ci/run`) fails on any skip but the CUDA one.

A skipped test is a claim nobody checked. On the CPU machines that run CI the only test that may
skip is one that needs a CUDA GPU, and it says so in one form, `requires_cuda()`, so that a skip
for want of a tool (helm, uv, a module) cannot hide behind it. With `--only-cuda-skips` every other
skip (of a test or of a whole module at collection) is listed at the end and the run fails.
"""

from __future__ import annotations

import pytest

CUDA_REASON = "needs a CUDA GPU"
"""The one skip reason `--only-cuda-skips` accepts."""

OPTION = "--only-cuda-skips"


def requires_cuda() -> pytest.MarkDecorator:
    """Skip unless torch sees a CUDA GPU (torch is imported only by the tests that use this)."""
    import torch  # noqa: PLC0415 - the operator's tests run without torch

    return pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_REASON)


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skip report carries ("Skipped: " removed)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help=f"fail the run when a test skips for any reason but {CUDA_REASON!r} (CI sets it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(OPTION):
        config.pluginmanager.register(OnlyCudaSkips(), "asyncgrpo-only-cuda-skips")


class OnlyCudaSkips:
    """Collects the skips of tests and of modules at collection; fails the run if there are any."""

    def __init__(self) -> None:
        self.unexpected: list[str] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            if reason != CUDA_REASON:
                self.unexpected.append(f"{report.nodeid}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.unexpected:
            terminalreporter.section(f"skips other than {CUDA_REASON!r}: the run fails ({OPTION})", red=True)
            for line in self.unexpected:
                terminalreporter.line(line)
