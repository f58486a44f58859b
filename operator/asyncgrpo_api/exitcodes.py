"""The driver's exit codes: the contract between the trainer and the operator.

The operator decides an attempt's outcome from the driver container's exit code alone, so the
meaning of each code lives here, beside the API, where both sides import it.
"""

from __future__ import annotations

from typing import Final

SUCCEEDED: Final = 0
"""Training finished: the job succeeds."""

TRAINING_ERROR: Final = 1
"""The job itself is wrong (bad data, a bug, a diverged loss): never retried."""

INVALID_MODEL: Final = 3
"""The model files are unusable (spec.trainer.model.path missing, an unsupported family in
config.json, a tokenizer without an end-of-sequence token): never retried."""

INVALID_DATA: Final = 4
"""The data files or the reward function the spec names are unusable (a missing or unreadable file,
no usable row, an env.function that cannot be imported), found by the driver before any worker
starts: never retried (the same files would fail again)."""

OBJECT_STORE_REFUSED: Final = 5
"""spec.storage.objectStore's credentials or bucket were refused by the store (or the key pair is
missing from the Secret): never retried (the same Secret would be refused again)."""

RAY_HEAD_UNAVAILABLE: Final = 200
"""The Ray head next to the driver never came up: an infrastructure failure, retried."""

RAY_WORKER_LOST: Final = 201
"""A Ray worker, actor or node died under the run (pod evicted, node gone, OOM-killed worker):
an infrastructure failure, retried from the last checkpoint."""

SIGNAL_BASE: Final = 128
"""Codes above this mean the driver was killed by signal (code - 128): retried."""
