"""`--test-budget SECONDS`: a run fails when a test takes longer than SECONDS (its setup, call and
teardown together) unless a `budget` marker says what it costs and why.

Why: CI has 90 minutes on a 2-core machine, cold caches included, and the suite once grew from 43
to 70 warm minutes in three days, one slow test at a time, until a cold run could not fit. A slow
test is sometimes the only way to prove a claim (a model that learns, a pod that survives a
fault); then it says so where it is written, and the cost is seen in review:

    @pytest.mark.budget(400, "the only run of all four modes to the learning bar")

A module-scoped fixture's setup is charged to the first test that uses it, so that test carries
the marker. A marked test is never failed for its time (its verdict must not depend on the
machine's load); the summary lists every marked test with its time beside its budget, so a
growing one is seen the day it grows. `.ci/run` sets the option (tests/test_ci_rules.py).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

OPTION = "--test-budget"
MARKER = "budget"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail the run when a test without a budget marker takes longer than SECONDS (CI sets it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(seconds, why): this test may take up to `seconds` (setup and teardown included) "
        f"beyond {OPTION}, for the reason given",
    )
    limit = config.getoption(OPTION)
    if limit is not None:
        config.pluginmanager.register(Budget(limit), "asyncgrpo-budget")


def declared(item: pytest.Item) -> tuple[float, str] | None:
    """The test's own budget and reason, or None; a marker without both is an error at collection."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    seconds, why = (*marker.args, *marker.kwargs.values(), None, None)[:2]
    if not isinstance(seconds, int | float) or not isinstance(why, str) or not why.strip():
        raise pytest.UsageError(f"{item.nodeid}: write @pytest.mark.{MARKER}(SECONDS, 'why it costs that')")
    return float(seconds), why


class Budget:
    """Each test's seconds, summed over its phases, against the run's limit or its own budget."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.seconds: dict[str, float] = defaultdict(float)
        self.budgets: dict[str, tuple[float, str]] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            own = declared(item)
            if own is not None:
                self.budgets[item.nodeid] = own

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def over(self) -> list[tuple[str, float]]:
        """Unmarked tests slower than the limit, slowest first."""
        slow = [
            (nodeid, s) for nodeid, s in self.seconds.items() if s > self.limit and nodeid not in self.budgets
        ]
        return sorted(slow, key=lambda pair: -pair[1])

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.over() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        over = self.over()
        if over:
            terminalreporter.section(
                f"tests over the {self.limit:.0f} s budget ({OPTION}) without a {MARKER} marker: "
                "the run fails",
                red=True,
            )
            for nodeid, seconds in over:
                terminalreporter.line(
                    f"{seconds:7.1f} s  {nodeid}: make it cheaper, or mark it "
                    f"@pytest.mark.{MARKER}(SECONDS, 'what it proves that no cheaper test does')"
                )
        ran = [
            (nodeid, self.seconds[nodeid], *own)
            for nodeid, own in self.budgets.items()
            if nodeid in self.seconds
        ]
        if ran:
            terminalreporter.section(f"tests with a {MARKER} of their own: time / budget")
            for nodeid, seconds, budget, why in sorted(ran, key=lambda row: -row[1]):
                flag = "  OVER" if seconds > budget else ""
                terminalreporter.line(f"{seconds:7.1f} / {budget:5.0f} s{flag}  {nodeid}: {why}")
