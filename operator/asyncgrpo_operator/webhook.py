"""The validating admission webhook for AsyncGRPOJob, served by the operator process (kopf).

Why a webhook at all: the CRD's schema and CEL rules catch a lot, but not every invariant of
`asyncgrpo_api.rules` (GPU layouts, the batch arithmetic, name lengths with retries, update locks
that depend on the job's state). Running the very same `validate_manifest` here means a bad job is
refused by `kubectl apply` on the spot, with the field path and the fix, instead of failing minutes
later on a GPU node.

Design choices, each to keep the webhook from ever wedging the cluster:

* ONE handler (`HANDLER_ID`) for CREATE and UPDATE. kopf runs handlers of one request in parallel
  and the API server shows only the first error, so all checks are ordered inside one handler and
  every finding goes into one message.
* DELETE is never hooked, and an UPDATE of an object being deleted (deletionTimestamp set) or an
  UPDATE that leaves `spec` and the Kueue labels untouched (finalizers, annotations, other labels,
  kopf's own bookkeeping) is allowed without looking at it. The chart's
  ValidatingWebhookConfiguration expresses the same with `matchConditions`, so the API server does
  not even call us then; the checks here are the backstop for configurations without them.
* The configuration is owned by the Helm chart, not by kopf (`settings.admission.managed = None`):
  it is a service reference with a CA bundle, which kopf's managed mode cannot produce, and
  `helm uninstall` removes it together with the operator, so no orphaned webhook blocks the API.

After the rules, a job that names an AsyncGRPORuntime is checked against it, read from the API
server (asyncgrpo_api.runtime_rules): a runtime that does not exist, or cannot be read, refuses the
job, as does every field the runtime does not allow. Then a job that passes is checked once more by
the API server itself: the RayCluster it would get, with what its runtime fixes, is dry-run
(dryrun.py), and a refusal of the object refuses the job.

Importing this module registers the handler with kopf's default registry, and a startup handler
that configures kopf's admission server (`serve_admission`): only a replica that serves admission
imports it (`--role webhook` or `all`, __main__.py), so the chart's reconciling replicas, which
watch what tenants write, never take admission down with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from asyncgrpo_api import runtime_rules
from asyncgrpo_api.rules import Finding, locked_changes, validate_manifest
from asyncgrpo_api.v1alpha1 import GROUP, KIND, PLURAL, VERSION, AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_api.v1alpha1.job import KUEUE_QUEUE_LABEL
from asyncgrpo_operator import dryrun, k8s, naming, runtime
from asyncgrpo_operator.workload import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL

logger = logging.getLogger(__name__)

HANDLER_ID = "validate-asyncgrpojob"
"""The kopf handler id, which is also the URL path the API server posts to (`/<HANDLER_ID>`)."""

WEBHOOK_PATH = f"/{HANDLER_ID}"
"""The path the chart's ValidatingWebhookConfiguration must use. kopf routes `/<id>` to the handler
with that id; a request to `/` would run no handler at all and be allowed, so the path matters."""

WEBHOOK_NAME = "validate.asyncgrpojobs.asyncgrpo.dev"
"""The webhook's name in the ValidatingWebhookConfiguration; kubectl prints it on every denial."""

DEFAULT_PORT = 9443
DEFAULT_CERT_DIR = Path("/etc/asyncgrpo/webhook-tls")
DENIAL_CODE = 422
"""HTTP code of a denial: 422 Unprocessable Entity, like the API server's own schema errors.
(kopf's AdmissionError defaults to 500, which kubectl would print as an internal error.)"""

MAX_FINDINGS_SHOWN = 50
RUNTIME_READ_TIMEOUT_SECONDS = 2.0
"""Budget of the AsyncGRPORuntime read inside the API server's admission timeout (chart default
5 s), beside the dry-run's (dryrun.DRY_RUN_TIMEOUT_SECONDS)."""


# --- the decision (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the webhook answers: allowed or not, the denial message and the warnings."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    errors: tuple[Finding, ...] = field(default=(), repr=False)


ALLOW = Decision(allowed=True)


def review(operation: str, new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> Decision:
    """Judge one admission request for an AsyncGRPOJob.

    Kept free of kopf so the exact rules (what is skipped, what is locked, how the message reads)
    are unit-tested directly; `validate_job` only adapts it to kopf.
    """
    if new is None or _not_judged(operation, new, old):
        return ALLOW
    report = validate_manifest(_user_input(new))
    errors = list(report.errors)
    if operation == "UPDATE" and old is not None:
        errors = _locked(old, new, report.job) + _locked_labels(old, new) + _new_problems(errors, old)
    warnings = tuple(str(w) for w in report.warnings)
    if not errors:
        return Decision(allowed=True, warnings=warnings)
    message = denial_message(new, errors)
    return Decision(allowed=False, message=message, warnings=warnings, errors=tuple(errors))


def _not_judged(operation: str, new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Updates that always pass: of an object being deleted (finalizer removal and the like), and
    metadata-only ones (validated when the spec was written; the rules may have moved on), except
    those that change the Kueue labels: the queue (and priority class) is part of what the job asks
    for, and is judged like any field."""
    if operation != "UPDATE" or old is None:
        return False
    if _being_deleted(new) or _being_deleted(old):
        return True
    return old.get("spec") == new.get("spec") and _kueue_labels(old) == _kueue_labels(new)


KUEUE_LABELS = (KUEUE_QUEUE_LABEL, KUEUE_PRIORITY_LABEL)


def _kueue_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = as_mapping(as_mapping(obj.get("metadata")).get("labels"))
    return {key: str(labels[key]) for key in KUEUE_LABELS if key in labels}


def _locked_labels(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Finding]:
    """The Kueue labels may change only while the job waits, suspended and not admitted: Kueue
    admitted the Workload for its queue (and priority), and adding the queue label to a running
    job would hand it to Kueue mid-run. While it is queued the Workload follows the change."""
    before, after = _kueue_labels(old), _kueue_labels(new)
    if before == after or (is_suspended(old) and not _admitted(old)):
        return []
    why = "Kueue has admitted the job" if _admitted(old) else "the job runs"
    return [
        Finding(
            f"metadata.labels.{key}",
            f"cannot change while {why} (from {before.get(key)!r} to {after.get(key)!r}); it may "
            "change while the job waits in its queue or is suspended, or create a new job",
        )
        for key in KUEUE_LABELS
        if before.get(key) != after.get(key)
    ]


def _admitted(obj: Mapping[str, Any]) -> bool:
    """Whether Kueue holds quota for the job: its Queued condition is False (Admitted)."""
    conditions = as_mapping(obj.get("status")).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Queued" and c.get("status") == "False"
        for c in conditions
    )


def denial_message(obj: Mapping[str, Any], errors: Sequence[Finding]) -> str:
    """One line per finding, `path: what is wrong and how to fix it`, like kubectl's field errors.

    kubectl prints it after `admission webhook "<name>" denied the request: `.
    """
    metadata = as_mapping(obj.get("metadata"))
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    count = f"{len(errors)} error" + ("s" if len(errors) != 1 else "")
    lines = [f'{KIND} "{name}" is invalid ({count}):']
    lines += [f"- {finding}" for finding in errors[:MAX_FINDINGS_SHOWN]]
    if len(errors) > MAX_FINDINGS_SHOWN:
        hidden = len(errors) - MAX_FINDINGS_SHOWN
        lines.append(f"- ... and {hidden} more (run `asyncgrpo validate` on the file)")
    return "\n".join(lines)


def runtime_review(
    operation: str, new: Mapping[str, Any], old: Mapping[str, Any] | None, found: Mapping[str, Any] | None
) -> tuple[Decision | None, AsyncGRPORuntime | None]:
    """Judge a job the rules allow against the AsyncGRPORuntime it names (`found`, as read from
    the API server; None when it does not exist): (the denial, or None; the runtime to render with).

    An update is refused only for what it adds: a job admitted before its runtime was tightened
    must still be suspendable (Kueue preempts by setting spec.suspend), like `_new_problems`.
    """
    job = _parse(new)
    if job is None or job.spec.runtime_ref is None:
        return None, None
    admin, refusals = runtime_rules.check(job, found)
    before = _parse(old) if operation == "UPDATE" and old is not None else None
    if before is not None and refusals:
        already = set(runtime_rules.check(before, found)[1])
        refusals = [finding for finding in refusals if finding not in already]
    if not refusals:
        return None, admin
    return Decision(allowed=False, message=denial_message(new, refusals), errors=tuple(refusals)), admin


def unreadable_runtime(new: Mapping[str, Any], name: str, error: str) -> Decision:
    """The denial when the runtime cannot be read: a runtime is the administrator's limit, so a
    job is not admitted unchecked against it (the webhook refuses, as its failurePolicy would)."""
    finding = Finding(
        runtime_rules.RUNTIME_FIELD,
        f"AsyncGRPORuntime {name} could not be read ({error}); try again, or ask the cluster "
        "administrator (the operator needs get on asyncgrporuntimes)",
    )
    return Decision(allowed=False, message=denial_message(new, [finding]), errors=(finding,))


def _new_problems(errors: list[Finding], old: Mapping[str, Any]) -> list[Finding]:
    """Errors the update introduces: those the stored object already had are not held against it.

    A job stored under older, looser rules must still be suspendable (Kueue preempts by setting
    spec.suspend) and its deadlines adjustable; the update only may not make it worse. The old
    object is parsed only when the new one has errors, so valid updates pay nothing for this.
    """
    if not errors:
        return errors
    before = set(validate_manifest(_user_input(old)).errors)
    return [finding for finding in errors if finding not in before]


def is_suspended(obj: Mapping[str, Any]) -> bool:
    """Whether a job has no RayCluster of a running attempt, so its placement may still change.

    True when the old object asks to be suspended (Kueue admits a job by un-suspending it and
    rewriting node selectors in the same update), when the operator reports it Suspended, or when
    the operator has not started it yet (no status, or Pending without a RayCluster). A job that
    is Pending because its pods cannot be scheduled has a RayCluster: suspend it to re-place it.
    """
    spec = as_mapping(obj.get("spec"))
    if spec.get("suspend") is True:
        return True
    status = as_mapping(obj.get("status"))
    phase = status.get("phase")
    if not phase or phase == "Suspended":
        return True
    return phase == "Pending" and not status.get("rayClusterName")


def _locked(old: Mapping[str, Any], new: Mapping[str, Any], parsed_new: AsyncGRPOJob | None) -> list[Finding]:
    old_spec, new_spec = as_mapping(old.get("spec")), as_mapping(new.get("spec"))
    if parsed_new is not None:
        parsed_old = _parse(old)
        if parsed_old is not None:  # compare with defaults filled in, so writing out a default is no change
            old_spec, new_spec = _spec_of(parsed_old), _spec_of(parsed_new)
    return locked_changes(old_spec, new_spec, suspended=is_suspended(old))


def _parse(obj: Mapping[str, Any]) -> AsyncGRPOJob | None:
    """The object as the models read it, or None when it does not parse (any more)."""
    try:
        return AsyncGRPOJob.model_validate(_user_input(obj))
    except ValueError:
        return None


def _spec_of(job: AsyncGRPOJob) -> Mapping[str, Any]:
    return as_mapping(job.to_manifest().get("spec"))


def _user_input(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object a user writes: status belongs to the operator and is not judged."""
    return {key: value for key, value in obj.items() if key != "status"}


def as_mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one: how a request's optional objects are read."""
    return value if isinstance(value, Mapping) else {}


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("deletionTimestamp"))


# --- kopf adapter --------------------------------------------------------------------------------


@kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"])
async def validate_job(*, body: kopf.Body, warnings: list[str], memo: Any = None, **kwargs: Any) -> None:
    """Deny an invalid or locked-field change with every finding; pass warnings on to kubectl.

    async on purpose: validation is a few milliseconds of pure CPU, cheaper on the event loop than
    a hop through kopf's thread pool, and the dry-run is one awaited API call.
    """
    started = time.monotonic()
    operation = str(kwargs.get("operation") or "")
    old, new = kwargs.get("old"), kwargs.get("new")
    new_obj = dict(new) if new is not None else dict(body)
    old_obj = dict(old) if old is not None else None
    decision = review(operation, new=new_obj, old=old_obj)
    rt = runtime.find(memo)
    admin: AsyncGRPORuntime | None = None
    if decision.allowed and not _not_judged(operation, new_obj, old_obj):
        decision, admin = await _within_runtime(rt, operation, new_obj, old_obj, decision)
    if decision.allowed and rt is not None and rt.admission_dry_run:
        decision = await _with_dry_run(rt, operation, new_obj, old_obj, decision, admin=admin)
    if rt is not None:
        verdict = "allowed" if decision.allowed else "denied"
        rt.metrics.admissions.labels(operation, verdict).inc()
        rt.metrics.admission_seconds.labels(operation).observe(time.monotonic() - started)
    warnings.extend(decision.warnings)
    if not decision.allowed:
        raise kopf.AdmissionError(decision.message, code=DENIAL_CODE)


async def _within_runtime(
    rt: runtime.Admission | None,
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    decision: Decision,
) -> tuple[Decision, AsyncGRPORuntime | None]:
    """The decision after the job's AsyncGRPORuntime, and the runtime (None: the job names none)."""
    ref = as_mapping(as_mapping(new.get("spec")).get("runtimeRef")).get("name")
    if not isinstance(ref, str):
        return decision, None
    if rt is None:
        return unreadable_runtime(new, ref, "the operator is still starting"), None
    try:
        found = await asyncio.wait_for(rt.api.get_runtime(ref), timeout=RUNTIME_READ_TIMEOUT_SECONDS)
    except k8s.ApiError as err:
        return unreadable_runtime(new, ref, f"HTTP {err.status}: {err.message}"), None
    except TimeoutError:
        return unreadable_runtime(new, ref, f"no answer within {RUNTIME_READ_TIMEOUT_SECONDS:g} s"), None
    denial, admin = runtime_review(operation, new, old, found)
    if denial is not None:
        return Decision(False, denial.message, decision.warnings, denial.errors), None
    return decision, admin


async def _with_dry_run(
    rt: runtime.Admission,
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    decision: Decision,
    *,
    admin: AsyncGRPORuntime | None = None,
) -> Decision:
    if _not_judged(operation, new, old):
        return decision
    job = _parse(new)
    before = _parse(old) if operation == "UPDATE" and old is not None else None
    uid = str(as_mapping(new.get("metadata")).get("uid") or "")
    cluster = dryrun.target(job, before, uid, admin) if job is not None else None
    if cluster is None:
        rt.metrics.dry_runs.labels("unchanged").inc()
        return decision
    if rt.dry_runs_in_flight >= dryrun.MAX_IN_FLIGHT:
        rt.metrics.dry_runs.labels("shed").inc()
        return Decision(allowed=True, warnings=(*decision.warnings, dryrun.SHED_WARNING))
    rt.dry_runs_in_flight += 1
    try:
        answer = await dryrun.ask(rt.api, cluster)
    finally:
        rt.dry_runs_in_flight -= 1
    result, finding, warning = dryrun.judge(answer, cluster["metadata"]["name"])
    rt.metrics.dry_runs.labels(result).inc()
    warnings = decision.warnings + ((warning,) if warning else ())
    if finding is None:
        return Decision(allowed=True, warnings=warnings)
    return Decision(
        allowed=False, message=denial_message(new, [finding]), warnings=warnings, errors=(finding,)
    )


# --- server configuration ------------------------------------------------------------------------


CLIENT_CA_ENV = "ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE"


@dataclass(frozen=True)
class WebhookConfig:
    """Where the webhook listens and which TLS files it serves; read from the environment.

    Environment (the chart sets these):
      ASYNCGRPO_WEBHOOK_ADDR        listen address (default 0.0.0.0)
      ASYNCGRPO_WEBHOOK_PORT        listen port (default 9443; the Service's targetPort)
      ASYNCGRPO_WEBHOOK_CERT_DIR    folder with tls.crt and tls.key (a mounted kubernetes.io/tls
                                    Secret: the chart's generated one or cert-manager's)
      ASYNCGRPO_WEBHOOK_CERT_CHECK_SECONDS  how often the files are re-read (default 60)
      ASYNCGRPO_WEBHOOK_SELF_SIGNED set to 1 for local development without cert files: a throwaway
                                    CA and certificate are written to a temporary folder
      ASYNCGRPO_WEBHOOK_CLIENT_CA_FILE  a CA (PEM): only a caller presenting a client certificate
                                    it signed completes the TLS handshake (the API server does,
                                    given one in its admission configuration; docs/security.md)
    """

    addr: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    cert_dir: Path = DEFAULT_CERT_DIR
    cert_check_seconds: float = 60.0
    self_signed: bool = False
    client_ca: Path | None = None
    """Where set, the webhook answers only callers with a client certificate this CA signed:
    anyone else who reaches the port could have it dry-run RayClusters under the operator's
    account in any namespace it judges."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebhookConfig:
        """Read ASYNCGRPO_WEBHOOK_*; unset variables keep the defaults above."""
        env = os.environ if env is None else env
        return cls(
            addr=env.get("ASYNCGRPO_WEBHOOK_ADDR", cls.addr),
            port=int(env.get("ASYNCGRPO_WEBHOOK_PORT", cls.port)),
            cert_dir=Path(env.get("ASYNCGRPO_WEBHOOK_CERT_DIR", str(cls.cert_dir))),
            cert_check_seconds=float(env.get("ASYNCGRPO_WEBHOOK_CERT_CHECK_SECONDS", cls.cert_check_seconds)),
            self_signed=env.get("ASYNCGRPO_WEBHOOK_SELF_SIGNED", "").lower() in {"1", "true", "yes"},
            client_ca=Path(env[CLIENT_CA_ENV]) if env.get(CLIENT_CA_ENV) else None,
        )

    @property
    def certfile(self) -> Path:
        return self.cert_dir / "tls.crt"

    @property
    def keyfile(self) -> Path:
        return self.cert_dir / "tls.key"


API_SERVER_MAX_REQUEST_BYTES = 3 * 1024 * 1024
"""The largest request body the API server accepts (apiserver's MaxRequestBodyBytes, 3 MiB; etcd
then refuses an object over its own 1.5 MiB --max-request-bytes)."""
MAX_REVIEW_BYTES = 2 * API_SERVER_MAX_REQUEST_BYTES + 64 * 1024
"""The largest AdmissionReview the webhook reads: an UPDATE's carries the object twice (object and
oldObject), each up to the API server's limit, and an envelope (the user's name, groups, extra).
aiohttp's default, 1 MiB, answered 413 for an update of a job over about 512 KiB, and so refused
the operator's own suspend patch: a preempted job's cluster never stopped. Anything larger
cannot come from the API server and is refused unread."""


class _WebhookServer(kopf.WebhookServer):
    """kopf's server, reading request bodies up to MAX_REVIEW_BYTES (kopf builds its aiohttp
    application with the 1 MiB default and has no setting for it)."""

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


class WebhookConfigError(RuntimeError):
    """The webhook cannot be served as configured (e.g. no certificate files)."""


def build_server(config: WebhookConfig) -> kopf.WebhookServer:
    """A kopf WebhookServer on a fixed port with TLS from files.

    kopf re-reads the files every `cert_check_seconds` and restarts the listener when they change,
    which is how rotated certificates (cert-manager renewals, a re-generated chart Secret) are
    picked up without restarting the pod. The port is always explicit: kopf would otherwise pick a
    random free port, which the Service could not target.
    """
    if config.self_signed and not config.certfile.exists():
        from asyncgrpo_operator import certs  # noqa: PLC0415 - only needed for local development

        files = certs.write_self_signed(hosts=[config.addr, "localhost", "127.0.0.1"])
        logger.warning("Serving the webhook with a throwaway self-signed certificate; CA at %s", files.ca)
        config = dataclasses.replace(config, cert_dir=files.directory)
    missing = [str(p) for p in (config.certfile, config.keyfile) if not p.is_file()]
    if missing:
        raise WebhookConfigError(
            f"the admission webhook needs TLS files, missing: {', '.join(missing)}. Mount a "
            f"kubernetes.io/tls Secret at {config.cert_dir} (the chart does), point "
            f"ASYNCGRPO_WEBHOOK_CERT_DIR elsewhere, or set ASYNCGRPO_WEBHOOK_SELF_SIGNED=1 for local runs"
        )
    if config.client_ca is not None and not config.client_ca.is_file():
        raise WebhookConfigError(
            f"{CLIENT_CA_ENV}={config.client_ca}: no such file. Mount the CA that signs the API "
            f"server's client certificate there (the chart's webhook.clientAuth.caBundle does), or "
            f"unset it to answer callers without a certificate"
        )
    return _WebhookServer(
        addr=config.addr,
        port=config.port,
        certfile=str(config.certfile),
        pkeyfile=str(config.keyfile),
        file_check_interval=config.cert_check_seconds,
        verify_mode=ssl.CERT_REQUIRED if config.client_ca is not None else None,
        verify_cafile=str(config.client_ca) if config.client_ca is not None else None,
    )


class _DenialsAreNotErrors(logging.Filter):
    """Log a denial at INFO, not as kopf's ERROR "failed permanently".

    kopf reports every AdmissionError like a crashed handler. A refused `kubectl apply` is the
    webhook working, and ERROR lines for it would drown real failures (and page whoever alerts on
    ERROR). Only our admission handlers' permanent failures, i.e. denials, are rewritten.
    """

    HANDLERS = (HANDLER_ID, naming.HANDLER_DEFAULT_QUEUE)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno != logging.ERROR:
            return True
        for handler in self.HANDLERS:
            prefix = f"Webhook {handler!r} failed permanently: "
            if message.startswith(prefix):
                record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
                record.msg, record.args = f"Webhook {handler!r} denied: {message[len(prefix) :]}", ()
        return True


_DENIAL_FILTER = _DenialsAreNotErrors()


@kopf.on.startup(id=naming.HANDLER_ADMISSION_SERVER)
def serve_admission(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    configure_admission(settings)


def configure_admission(
    settings: kopf.OperatorSettings, config: WebhookConfig | None = None
) -> WebhookConfig:
    """Point kopf's admission settings at our server.

    `settings.admission.managed` stays None: the chart owns the ValidatingWebhookConfiguration
    (service reference, CA bundle, matchConditions, failurePolicy), and the operator therefore
    needs no RBAC on admissionregistration.k8s.io.
    """
    config = config or WebhookConfig.from_env()
    settings.admission.server = build_server(config)
    settings.admission.managed = None
    objects_logger = logging.getLogger("kopf.objects")
    if _DENIAL_FILTER not in objects_logger.filters:
        objects_logger.addFilter(_DENIAL_FILTER)
    logger.info(
        "Admission webhook on https://%s:%d%s%s",
        config.addr,
        config.port,
        WEBHOOK_PATH,
        f", for callers with a client certificate signed by {config.client_ca}" if config.client_ca else "",
    )
    return config
