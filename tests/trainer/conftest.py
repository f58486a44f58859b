"""One Ray cluster for the whole trainer suite (starting Ray costs seconds on 2 cores)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """Address of a local Ray cluster; drivers started as subprocesses join it via RAY_ADDRESS."""
    ray.init(num_cpus=8, include_dashboard=False, logging_level=logging.WARNING)
    address = ray.get_runtime_context().gcs_address
    os.environ.setdefault("ASYNCGRPO_EXIT_GRACE_SECONDS", "0")
    yield address
    ray.shutdown()
