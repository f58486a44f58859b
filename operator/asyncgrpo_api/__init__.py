"""The AsyncGRPOJob API: one schema for the CRD, the admission webhook, the CLI and the trainer.

This package is the leaf of the dependency graph: it imports only the standard library, pydantic
and pyyaml, so the operator, the webhook and the trainer can all share it without pulling in each
other's dependencies.
"""

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobSpec, AsyncGRPOJobStatus

__all__ = ["AsyncGRPOJob", "AsyncGRPOJobSpec", "AsyncGRPOJobStatus"]
