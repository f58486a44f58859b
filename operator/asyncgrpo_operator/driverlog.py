"""`asyncgrpo logs JOB [-f] [--attempt N]`: the driver's log, from the head pod while it runs, and
where its files are once the pod is gone.

The head pod's `driver` container is the training driver; `kubectl logs` can read it only while
the pod exists, and cleanupPolicy deletes the pods with the RayCluster. The driver also writes its
log, step records and TensorBoard files under checkpoint.path (status.outputs), so this command
streams the container log when there is one, otherwise prints the newest attempt's log from
spec.storage.objectStore when the job names one (`stored_logs`), and otherwise says where those
files are and on which volume. `--attempt N` asks for an earlier attempt's log, which no pod runs
any more: from the object store, or its file on the volume. `decide` is the pure part (tested
without a cluster); `main` does the API calls.

Everything it prints passes through `TerminalFilter`: the log is the job's code's output (and the
status fields it names come from the job), so it could hold escape sequences that a terminal acts
on, such as rewriting what was printed before, setting the window title or writing the clipboard
(OSC 52). The reader's terminal gets the text with every control character but newline and tab
removed, and whole escape sequences where they are complete.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncgrpo_api import outputs
from asyncgrpo_api.v1alpha1.runtime import CheckpointSpec, ObjectStoreSpec
from asyncgrpo_operator import k8s, naming, stored_logs

_SEQUENCE = re.compile(
    r"\x1b(?:"
    r"\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor movement, erasing, device queries
    r"|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC, DCS, SOS, PM, APC: up to BEL or ST
    r"|[ -/]+[0-~]|[0-OQ-WYZ\\`-~]"  # the others (charset selection, RIS, ...), not an introducer
    r")"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F; U+009B is a CSI)."""
_HELD_BACK = 64
"""At most this much of a chunk's end is kept for the next chunk when it may begin an escape
sequence split between the two; a longer one loses its ESC and shows as text."""


class TerminalFilter:
    """The bytes of a log, as UTF-8 text safe to write to a terminal (module docstring). Chunks
    may split a character or an escape sequence: both are completed from the next chunk."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def feed(self, chunk: bytes, *, final: bool = False) -> bytes:
        text = self._held + self._decoder.decode(chunk, final)
        self._held = ""
        start = text.rfind("\x1b")
        if not final and start >= 0 and len(text) - start <= _HELD_BACK and not _SEQUENCE.match(text, start):
            text, self._held = text[:start], text[start:]
        return safe_text(text).encode()


def safe_text(text: str) -> str:
    """`text` without escape sequences and control characters (but newline and tab)."""
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


@dataclass(frozen=True)
class Stream:
    """Read the driver container's log from this pod."""

    pod: str
    follow: bool


@dataclass(frozen=True)
class Files:
    """No container log to read: say why and where the files are."""

    text: str


@dataclass(frozen=True)
class Stored:
    """No container log to read, but the driver uploaded its log to spec.storage.objectStore."""

    why: str
    store: ObjectStoreSpec
    namespace: str
    attempt: int | None = None
    """The attempt asked for (`--attempt N`); None for the newest stored."""


@dataclass(frozen=True)
class NoSuchAttempt:
    """`--attempt N` names an attempt the job has not started."""

    text: str


def decide(
    job: Mapping[str, Any],
    heads: Sequence[Mapping[str, Any]],
    *,
    follow: bool,
    attempt: int | None = None,
) -> Stream | Files | Stored | NoSuchAttempt:
    """What `asyncgrpo logs` shows for a job, given its head pods (those of status.rayClusterName).
    `attempt` names an earlier attempt: no pod runs it any more, so its log is read from the object
    store, or its file on the checkpoint volume is named."""
    status = job.get("status") or {}
    name = job["metadata"]["name"]
    current = int(status.get("attempt") or 0)
    if attempt is not None and attempt != current:
        return _earlier_attempt(job, attempt, current)
    for pod in heads:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        driver = _driver_state(pod)
        if "running" in driver:
            return Stream(pod["metadata"]["name"], follow)
        if "terminated" in driver:
            return Stream(pod["metadata"]["name"], False)  # nothing more will come
    phase = status.get("phase") or "Pending"
    why = f": {status.get('reason')}" if status.get("reason") else ""
    if phase in ("Queued", "Pending", "Provisioning", "Suspended"):
        head = f"job {name} is {phase}{why}; its driver has not started yet"
    elif status.get("rayClusterName"):
        head = f"job {name} is {phase}{why}; its head pod is gone"
    else:
        head = f"job {name} is {phase}{why}; its RayCluster is gone (cleanupPolicy)"
    store = _object_store(job)
    if store is not None and phase not in ("Queued", "Pending", "Provisioning", "Suspended"):
        return Stored(head, store, _namespace(job), attempt)
    files = status.get("outputs")
    if not files:
        return Files(f"{head}, and the operator has not recorded where its files are")
    lines = [
        f"{head}. The driver's files are on the {files.get('volume')}:",
        f"  driver log    {files.get('driverLog')}",
        f"  step records  {files.get('steps')}",
        f"  TensorBoard   {files.get('tensorboard')}",
    ]
    return Files("\n".join(lines))


def _earlier_attempt(job: Mapping[str, Any], attempt: int, current: int) -> Files | Stored | NoSuchAttempt:
    name = job["metadata"]["name"]
    if attempt > current:
        return NoSuchAttempt(f"job {name} has no attempt {attempt}: its attempts so far are 0 to {current}")
    why = f"attempt {attempt} of job {name} ended (the job is at attempt {current})"
    store = _object_store(job)
    if store is not None:
        return Stored(why, store, _namespace(job), attempt)
    checkpoint = ((job.get("spec") or {}).get("checkpoint") or {}).get("path") or CheckpointSpec().path
    volume = ((job.get("status") or {}).get("outputs") or {}).get("volume") or "checkpoint volume"
    return Files(f"{why}; its driver log is {outputs.driver_log(checkpoint, attempt)} on the {volume}")


def _object_store(job: Mapping[str, Any]) -> ObjectStoreSpec | None:
    store = ((job.get("spec") or {}).get("storage") or {}).get("objectStore")
    return ObjectStoreSpec.model_validate(store) if store else None


def _namespace(job: Mapping[str, Any]) -> str:
    return str(job["metadata"].get("namespace") or "default")


def _driver_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == naming.DRIVER_CONTAINER:
            state: Mapping[str, Any] = status.get("state") or {}
            return state
    return {}


async def _run(name: str, namespace: str | None, follow: bool, attempt: int | None) -> int:
    api = await k8s.Api.connect()
    try:
        ns = namespace or api.current_namespace()
        job = await api.get_job(ns, name)
        if job is None:
            print(f"asyncgrpo logs: no AsyncGRPOJob {name} in namespace {ns}", file=sys.stderr)
            return 1
        cluster = (job.get("status") or {}).get("rayClusterName")
        heads = []
        if cluster:
            selector = f"{naming.RAY_CLUSTER_LABEL}={cluster},{naming.RAY_NODE_TYPE_LABEL}=head"
            heads = await api.list_items(f"/api/v1/namespaces/{ns}/pods", selector)
        outcome = decide(job, heads, follow=follow, attempt=attempt)
        if isinstance(outcome, NoSuchAttempt):
            print(f"asyncgrpo logs: {safe_text(outcome.text)}", file=sys.stderr)
            return 1
        if isinstance(outcome, Files):
            print(safe_text(outcome.text))
            return 0
        if isinstance(outcome, Stored):
            return _print_stored(name, outcome)
        out, terminal = sys.stdout.buffer, TerminalFilter()
        async for chunk in api.stream_pod_log(
            ns, outcome.pod, naming.DRIVER_CONTAINER, follow=outcome.follow
        ):
            out.write(terminal.feed(chunk))
            out.flush()
        out.write(terminal.feed(b"", final=True))
        out.flush()
        return 0
    except k8s.ApiError as err:
        print(f"asyncgrpo logs: {safe_text(str(err))}", file=sys.stderr)
        return 1
    finally:
        await api.close()


def _print_stored(name: str, outcome: Stored) -> int:
    print(f"{safe_text(outcome.why)}; its driver log from the object store:", file=sys.stderr)
    try:
        attempt, text = stored_logs.stored_driver_log(outcome.store, outcome.namespace, name, outcome.attempt)
    except stored_logs.StoredLogError as exc:
        print(f"asyncgrpo logs: {safe_text(str(exc))}", file=sys.stderr)
        return 1
    print(f"(attempt {attempt})", file=sys.stderr)
    sys.stdout.buffer.write(TerminalFilter().feed(text, final=True))
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgrpo logs", description=__doc__.split("\n")[0])
    parser.add_argument("job", help="the AsyncGRPOJob's name")
    parser.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming while the driver runs")
    parser.add_argument(
        "--attempt",
        type=int,
        metavar="N",
        help="an earlier attempt's log (0 is the first): from the object store, or where it is on the volume",
    )
    args = parser.parse_args(argv)
    if args.attempt is not None and args.attempt < 0:
        parser.error("--attempt: an attempt number is 0 or more")
    try:
        return asyncio.run(_run(args.job, args.namespace, args.follow, args.attempt))
    except KeyboardInterrupt:
        return 130
