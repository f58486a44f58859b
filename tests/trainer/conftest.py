"""One Ray cluster for the whole trainer suite (starting Ray costs seconds on 2 cores)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="session")
def warm_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint warm-started on 3- and 5-digit reversal, made as the CPU example's
    comment makes it (`asyncgrpo make-tiny-checkpoint --warm-start`, asyncgrpo_trainer/warm_start.py): the
    pretrained-path tests' stand-in for a pretrained model, made once per session. It must answer
    the taught lengths and not the RL task's 4 digits, which the RL tests start below 0.1 from.

    It is made in a fresh interpreter with 2 torch threads: in-process, after other tests had run,
    the same seed once carried reversal over to 4 digits (0.38 exact) where a fresh process gets 0.0."""
    directory = tmp_path_factory.mktemp("warm") / "tiny-qwen2"
    size = ["--hidden-size", "128", "--heads", "4", "--intermediate-size", "512"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncgrpo_cli.main",
            "make-tiny-checkpoint",
            str(directory),
            *size,
            "--warm-start",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    accuracy = json.loads(out.stdout.strip().splitlines()[-1])["warm_start"]["accuracy_by_digits"]
    assert accuracy["3"] >= 0.9 and accuracy["5"] >= 0.9 and accuracy["4"] < 0.1, accuracy
    return directory
