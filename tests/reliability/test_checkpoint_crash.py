"""Checkpoint atomicity: a driver SIGKILLed while writing never leaves a checkpoint resume would load
and cannot read.

A subprocess (the real trainer/asyncgrpo_trainer/checkpoint.py, real torch.save, a real file
system) writes checkpoints in a loop the way a run does: `begin`, the policy's ~4 MB file into the
temporary directory (as a policy worker does), then `commit` with the controller's state; every
other one over an existing step (the case that replaces a directory). It is SIGKILLed at a random
moment. After each kill, every step `list_steps` reports (what resume picks from) must load
completely, both files, with the payload that one save wrote. Count:
ASYNCGRPO_RELIABILITY_CHECKPOINT_KILLS (default 2; ~25 s per kill on the loaded 2-core CI machine,
mostly importing torch).
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

POLICY_FILE = "policy.pt"

WRITER = """
import sys, torch
from asyncgrpo_trainer import checkpoint
root = sys.argv[1]
step = int(sys.argv[2])
print("ready", flush=True)
while True:
    for again in (False, True):   # write step, then overwrite the same step
        tmp = checkpoint.begin(root, step)
        weights = {"weights": torch.full((1_000_000,), float(step)), "again": again}
        checkpoint.write(tmp / "policy.pt", weights)   # what a policy worker does
        checkpoint.commit(tmp, step, {"step": step, "again": again}, keep_last=3)
    step += 1
"""


def _load_both(root: Path, step: int) -> tuple[dict, dict]:
    """What resume reads: the controller's state and the policy worker's file."""
    state = checkpoint.load(root, step)
    policy = checkpoint.read(checkpoint.step_dir(root, step) / POLICY_FILE, fix="-")
    return state, policy


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
            state, policy = _load_both(root, step)
            assert state["step"] == step
            assert state["again"] == policy["again"]  # both files from the same save
            assert policy["weights"].shape == (1_000_000,)
            assert bool((policy["weights"] == float(step)).all())
            checked += 1
    print(f"checkpoint kills {kills}, checkpoints verified after kills {checked}")
    assert checked > 0


KILLED_WHILE_REPLACING = """
import os, shutil, sys, torch
from pathlib import Path
from asyncgrpo_trainer import checkpoint
root = sys.argv[1]

def save(step, value):
    tmp = checkpoint.begin(root, step)
    checkpoint.write(tmp / "policy.pt", {"weights": torch.full((8,), value)})
    checkpoint.commit(tmp, step, {"step": step}, keep_last=3)

save(1, 0.0)
save(2, 0.0)

def rmtree(path, *args, **kwargs):
    # rmtree's order is the directory's order, which the file system decides: take the worst
    # legal one (the policy's file first, state.pt and meta.json still there), and crash after it.
    policy = Path(path) / "policy.pt"
    if policy.exists():
        os.unlink(policy)
        os.kill(os.getpid(), 9)

shutil.rmtree = rmtree
save(2, 1.0)
"""


def test_a_crash_while_a_step_is_saved_again_leaves_no_torn_checkpoint(tmp_path: Path) -> None:
    """Saving a step that exists replaces its directory; a SIGKILL while the old one is deleted
    (here: right after its policy file is unlinked, before `state.pt` and `meta.json`, a legal
    order of rmtree) must not leave a directory `list_steps` offers to resume but a policy worker
    cannot read. The old directory is renamed aside before the new one takes its place, so the
    removal never touches a step directory."""
    root = tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_REPLACING, str(root)], check=False)
    assert proc.returncode == -signal.SIGKILL
    for step in checkpoint.list_steps(root):
        state, _ = _load_both(root, step)
        assert state["step"] == step
    assert checkpoint.latest(root) == 2
    assert bool((_load_both(root, 2)[1]["weights"] == 1.0).all())  # the new save of step 2
