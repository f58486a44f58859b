"""One Ray cluster for the whole trainer suite (starting Ray costs seconds on 2 cores)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from tests.trainer.warm_start import warm_started


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """Address of a local Ray cluster; drivers started as subprocesses join it via RAY_ADDRESS."""
    ray.init(num_cpus=8, include_dashboard=False, logging_level=logging.WARNING)
    address = ray.get_runtime_context().gcs_address
    os.environ.setdefault("ASYNCGRPO_EXIT_GRACE_SECONDS", "0")
    yield address
    ray.shutdown()


@pytest.fixture(scope="session")
def warm_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint warm-started on 3- and 5-digit reversal (tests/trainer/warm_start.py):
    the pretrained-path tests' stand-in for a pretrained model, made once per session."""
    return warm_started(tmp_path_factory.mktemp("warm"), steps=1500, lengths=(3, 5), hidden_size=128)
