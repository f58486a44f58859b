"""Fixtures of the chart tests: the helm binary (or a skip that says how to get one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import NO_HELM, find_helm, template


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    found = find_helm()
    if found is None:
        pytest.skip(NO_HELM)
    return found


@pytest.fixture(scope="session")
def default_objects(helm_bin: Path) -> list[dict[str, Any]]:
    """The chart rendered with its default values."""
    return template(helm_bin)
