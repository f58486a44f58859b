"""Checkpoint atomicity: a driver SIGKILLed while writing never leaves a checkpoint resume would load
and cannot read.

A subprocess (the real trainer/asyncgrpo_trainer/checkpoint.py, real torch.save, a real file
system) saves ~4 MB checkpoints in a loop, every other one over an existing step (the case that
removes the old directory first), and is SIGKILLed at a random moment. After each kill, every step
`list_steps` reports (what resume picks from) must load completely, with the payload that step
wrote. Count: ASYNCGRPO_RELIABILITY_CHECKPOINT_KILLS (default 2; ~25 s per kill on the loaded
2-core CI machine, mostly importing torch).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import count

torch = pytest.importorskip("torch")
checkpoint = pytest.importorskip("asyncgrpo_trainer.checkpoint")

pytestmark = pytest.mark.slow

WRITER = """
import sys, torch
from asyncgrpo_trainer import checkpoint
root = sys.argv[1]
step = int(sys.argv[2])
print("ready", flush=True)
while True:
    for again in (False, True):   # write step, then overwrite the same step
        payload = {"step": step, "weights": torch.full((1_000_000,), float(step)), "again": again}
        checkpoint.save(root, step, payload, keep_last=3)
    step += 1
"""


def test_a_sigkill_during_save_never_leaves_a_loadable_torn_checkpoint(tmp_path: Path) -> None:
    rng = random.Random()
    root = tmp_path / "checkpoints"
    kills = checked = 0
    for _ in range(count("checkpoint_kills", 2)):
        start = (checkpoint.latest(root) or 0) + 1
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(start)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
        for step in checkpoint.list_steps(root):
            payload = checkpoint.load(root, step)
            assert payload["step"] == step
            assert payload["weights"].shape == (1_000_000,)
            assert bool((payload["weights"] == float(step)).all())
            checked += 1
    print(f"checkpoint kills {kills}, checkpoints verified after kills {checked}")
    assert checked > 0


KILLED_WHILE_REPLACING = """
import os, shutil, sys, torch
from pathlib import Path
from asyncgrpo_trainer import checkpoint
root = sys.argv[1]
checkpoint.save(root, 1, {"step": 1, "weights": torch.zeros(8)}, keep_last=3)
checkpoint.save(root, 2, {"step": 2, "weights": torch.zeros(8)}, keep_last=3)

def rmtree(path, *args, **kwargs):
    # rmtree's order is the directory's order, which the file system decides: take the worst
    # legal one (the state file first), and crash right after it.
    state = Path(path) / checkpoint.STATE_FILE
    if state.exists():
        os.unlink(state)
        os.kill(os.getpid(), 9)

shutil.rmtree = rmtree
checkpoint.save(root, 2, {"step": 2, "weights": torch.ones(8)}, keep_last=3)
"""


def test_a_crash_while_a_step_is_saved_again_leaves_no_torn_checkpoint(tmp_path: Path) -> None:
    """Saving a step that exists removes the old directory first; a SIGKILL inside that removal
    (here: right after `state.pt` is unlinked, before `meta.json`, a legal order of rmtree) must
    not leave a directory `list_steps` offers to resume but `load` cannot read."""
    root = tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_REPLACING, str(root)], check=False)
    assert proc.returncode == -signal.SIGKILL
    for step in checkpoint.list_steps(root):
        assert checkpoint.load(root, step)["step"] == step
    assert checkpoint.latest(root) in (1, 2)
