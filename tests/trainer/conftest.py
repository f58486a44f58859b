"""One Ray cluster for the whole trainer suite (starting Ray costs seconds on 2 cores)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from asyncgrpo_trainer import local_run
from tests.trainer import judge_checkpoint, pretrained_doc


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """Address of a local Ray cluster; drivers started as subprocesses join it via RAY_ADDRESS.

    Started as `asyncgrpo run` starts its own (`local_run.start_own_ray`: a new node whatever
    RAY_ADDRESS says, and a start that times out tried again, as the product does). On the 2-core
    CI machine this half starts Ray while the control plane's half starts its cluster and builds
    images, and once Ray's raylet gave up on its metrics agent ("Timed out waiting for file ...
    metrics_agent_port" after its 30 s), which Ray reports as a node that "timed out during
    startup": the session fixture failed, and with it every Ray test of the half (a clean-clone run
    on 2026-12-03)."""
    local_run.start_own_ray(num_cpus=8, num_gpus=torch.cuda.device_count())
    address = ray.get_runtime_context().gcs_address
    os.environ.setdefault("ASYNCGRPO_EXIT_GRACE_SECONDS", "0")
    yield address
    ray.shutdown()


@pytest.fixture(scope="session")
def pretrained_example(tmp_path_factory: pytest.TempPathFactory) -> pretrained_doc.Place:
    """Where the first of the pretrained CPU example's documented commands (docs/guides/models.md,
    `make-tiny-checkpoint --warm-start`) has run as written, in a folder outside the clone: made once
    per session, since the warm start takes minutes. Its checkpoint must answer
    the taught lengths and not the RL task's 4 digits, which the RL tests start below 0.1 from.

    The command runs in a fresh interpreter: in-process, after other tests had run, the same seed
    once carried reversal over to 4 digits (0.38 exact) where a fresh process gets 0.0."""
    where = pretrained_doc.place(tmp_path_factory.mktemp("example"))
    command = pretrained_doc.documented_commands()[0]
    assert "make-tiny-checkpoint" in command and "--warm-start" in command, command
    out = pretrained_doc.run(where, command)
    accuracy = json.loads(out.stdout.strip().splitlines()[-1])["warm_start"]["accuracy_by_digits"]
    assert accuracy["3"] >= 0.9 and accuracy["5"] >= 0.9 and accuracy["4"] < 0.1, accuracy
    assert "warm start: step 600/600" in out.stderr, out.stderr  # it shows progress
    return where


@pytest.fixture(scope="session")
def warm_qwen2(pretrained_example: pretrained_doc.Place) -> Path:
    """The tiny Qwen2 checkpoint warm-started on 3- and 5-digit reversal that the example's first
    command made: the pretrained-path tests' stand-in for a pretrained model (copy it to write)."""
    return pretrained_example.work / "models" / "tiny-qwen2"


@pytest.fixture(scope="session")
def taught_judge() -> Path:
    """A tiny judge checkpoint taught to answer 1 when the response it reads is the reference answer
    and 0 otherwise (`judge_checkpoint`), from the suite's cache (read it, do not write it): taught
    once per recipe, since teaching it takes 1-8 minutes."""
    return judge_checkpoint.cached_judge()
