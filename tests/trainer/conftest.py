"""One Ray cluster for the whole trainer suite (starting Ray costs seconds on 2 cores)."""

from __future__ import annotations

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
    """A tiny Qwen2 checkpoint warm-started on 3- and 5-digit reversal (tests/trainer/warm_start.py):
    the pretrained-path tests' stand-in for a pretrained model, made once per session.

    It is made in a fresh interpreter with 2 torch threads: in-process, after other tests had run,
    the same seed once carried reversal over to 4 digits (0.38 exact) where a fresh process gets 0.0,
    and the RL tests need a start below 0.1."""
    directory = tmp_path_factory.mktemp("warm")
    code = (
        "import sys, torch; torch.set_num_threads(2); from pathlib import Path; "
        "from tests.trainer.warm_start import warm_started; "
        "print(warm_started(Path(sys.argv[1]), steps=600, lengths=(3, 5), hidden_size=128))"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code, str(directory)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return Path(out.stdout.strip().splitlines()[-1])
