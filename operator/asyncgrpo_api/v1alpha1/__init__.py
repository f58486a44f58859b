"""asyncgrpo.dev/v1alpha1: the AsyncGRPOJob resource (AsyncGRPORuntime: admin_runtime.py)."""

from asyncgrpo_api.v1alpha1.job import (
    API_VERSION,
    DRIVER_PROGRESS_PORT,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    TERMINAL_PHASES,
    VERSION,
    AsyncGRPOJob,
    AsyncGRPOJobSpec,
    AsyncGRPOJobStatus,
    Condition,
    Phase,
    Progress,
)

__all__ = [
    "API_VERSION",
    "DRIVER_PROGRESS_PORT",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "TERMINAL_PHASES",
    "VERSION",
    "AsyncGRPOJob",
    "AsyncGRPOJobSpec",
    "AsyncGRPOJobStatus",
    "Condition",
    "Phase",
    "Progress",
]
