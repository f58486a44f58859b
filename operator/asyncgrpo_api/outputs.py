"""Where a job's driver leaves what should outlive its pods: its log, its step records, its curves.

All three live under spec.checkpoint.path, on the checkpoint volume, so they are still there after
cleanupPolicy deleted the RayCluster (with a PVC or hostPath; an emptyDir goes with the pod, which
admission warns about). The trainer writes them, the operator records them in status.outputs, and
`asyncgrpo logs` points at them once the head pod is gone: one definition for the three.
"""

from __future__ import annotations

from posixpath import join

LOGS_DIR = "logs"
TENSORBOARD_DIR = "tensorboard"
STEPS_FILE = "steps.jsonl"


def driver_log(checkpoint_path: str, attempt: int | None) -> str:
    """The driver's whole output (stdout and stderr) of one attempt: driver-attempt-<N>.log."""
    name = "driver.log" if attempt is None else f"driver-attempt-{attempt}.log"
    return join(checkpoint_path, LOGS_DIR, name)


def steps_file(checkpoint_path: str) -> str:
    """One JSON line per step and validation record, across attempts (a resumed attempt first
    drops the lines of the steps it trains again)."""
    return join(checkpoint_path, LOGS_DIR, STEPS_FILE)


def tensorboard_dir(checkpoint_path: str) -> str:
    """TensorBoard event files (`tensorboard --logdir`, `asyncgrpo plot`)."""
    return join(checkpoint_path, TENSORBOARD_DIR)
