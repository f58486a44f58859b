"""Where a job's files live in spec.storage.objectStore: the part of the key layout that both the
trainer (which writes them) and `asyncgrpo logs` (which reads them once the pods are gone) need.
The rest of the layout is the trainer's (asyncgrpo_trainer.durable_layout)."""

from __future__ import annotations

from posixpath import join


def job_root(prefix: str, namespace: str, name: str) -> str:
    """`<prefix>/<namespace>/<job name>`: the job's keys, apart from every other job's."""
    return join(prefix, namespace, name) if prefix else join(namespace, name)


def logs_prefix(attempt: int) -> str:
    """logs/attempt-NNNNN/: the driver.log, steps.jsonl and tensorboard/ files of one attempt."""
    return f"logs/attempt-{attempt:05d}/"


DRIVER_LOG = "driver.log"
