"""kopf settings, set once at startup, each with the reason it is not kopf's default.

- Persistence under our own domain (asyncgrpo.dev), never kopf.zalando.org: the finalizer name,
  the progress and diff-base annotations. The handlers are stateless `on.event` watches, so kopf
  writes none of these in practice; the prefixes make sure a future handler cannot fall back.
- Diff-base: kopf builds an "essence" of every object on every watch event (a deep copy of the
  whole body, then another one to strip progress marks) to detect field changes for on.create /
  on.update handlers. This operator has only on.event handlers, which never see that diff, and the
  copies were its largest CPU cost: ~10 ms per pod event, 70% of the operator's CPU with 50 jobs
  (see docs/benchmarks.md, "Operator vs KubeRay RayJob"). `EventOnlyDiffBaseStorage` skips them;
  a test keeps the registry free of change handlers, which would need the real essence.
- Events: the reconciler posts one Event per condition transition itself; kopf only posts its own
  handler failures (WARNING and above), as component asyncgrpo-operator.
- Watching: kopf watches only the jobs (the children are the informers', informer.py), with
  explicit timeouts so a silently dead watch is noticed and re-established (kopf#204, #698).
- Scanning: off when the operator watches given namespaces (ASYNCGRPO_WATCH_NAMESPACES, as
  `--namespace` sets it): kopf then neither lists and watches namespaces (to match its patterns,
  which here are plain names) nor watches CRDs (it takes the resources API discovery shows at
  start; the chart installs the CRD before the operator), so the operator needs no cluster-wide
  read at all and its rights on namespaced objects are Roles in those namespaces only (the chart's
  RBAC, docs/security.md). Watching all namespaces, kopf watches CRDs, so a reinstalled CRD is
  served again without a restart; it never reads namespaces then.
- Peering: standalone. The chart runs two replicas with our own Lease election (leader.py), so
  only one reconciles; the reconcile is safe even with two active replicas (deterministic names,
  UID preconditions, resourceVersion on status writes). kopf's peering would need the KopfPeering
  CRDs for what the Lease already does.
- Admission: the webhook's server is configured by webhook.py's own startup handler, registered
  only in a replica that serves admission (`--role`, __main__.py); the chart owns its configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import kopf

from asyncgrpo_api.v1alpha1 import GROUP
from asyncgrpo_operator import naming, runtime


@kopf.on.startup(id=naming.HANDLER_STARTUP)
def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    apply(settings)


class EventOnlyDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """A diff-base storage for an operator with only on.event handlers: the essence is empty.

    kopf compares the essence only for change handlers (on.create/update/resume/field) and to
    reset daemons' idle timers; with neither registered, building it is a deep copy of every
    object per event for nothing. Nothing is ever written either (`touch` is only called for
    change handlers), so jobs carry no last-handled-configuration annotation.
    """

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[Any] | None = None,
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def apply(settings: kopf.OperatorSettings) -> None:
    """Everything except admission (webhook.serve_admission)."""
    settings.persistence.finalizer = naming.KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = EventOnlyDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = naming.MANAGER
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.peering.standalone = True
    settings.scanning.disabled = bool(runtime.watched_namespaces())
