"""kopf handlers. Each is thin: it turns an event into work for the queue (or a setting), and the
reconciler does the rest. Importing this package registers them with kopf's default registry.

The children (RayClusters, pods, ConfigMaps) are watched by the operator's own informers
(informer.py), not by kopf: a relist must drop what it no longer shows, which kopf's handlers
cannot see."""

from asyncgrpo_operator.handlers import jobs, lifecycle

__all__ = ["jobs", "lifecycle"]
