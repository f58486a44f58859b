"""The kopf module of a replica that reconciles and serves no admission (`python -m
asyncgrpo_operator --role reconciler`, the chart's operator Deployment; admission_only.py is the
other half)."""

from asyncgrpo_operator import handlers, settings

__all__ = ["handlers", "settings"]
