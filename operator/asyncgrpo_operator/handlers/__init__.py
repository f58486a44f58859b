"""kopf handlers. Each is thin: it turns an event into work for the queue (or a setting), and the
reconciler does the rest. Importing this package registers them with kopf's default registry."""

from asyncgrpo_operator.handlers import children, jobs, lifecycle

__all__ = ["children", "jobs", "lifecycle"]
