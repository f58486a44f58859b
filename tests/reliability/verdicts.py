"""One manifest, two judges: `asyncgrpo validate` offline and the real API server plus webhook.

Why a dry-run create (`dryRun=All`): it runs the whole admission chain (decoding, structural schema,
defaults, CEL, the chart's ValidatingAdmissionPolicy, the validating webhook) exactly as `kubectl
apply` would, but stores nothing, so thousands of cases leave no objects for the operator or the
garbage collector. `fieldValidation=Strict` is what kubectl sends, so unknown fields are refused
instead of silently pruned.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncgrpo_api import validate_cli
from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_operator.webhook import WEBHOOK_NAME
from tests.cluster.rest import Api

JOBS = "/apis/asyncgrpo.dev/v1alpha1/namespaces/{ns}/asyncgrpojobs"
WEBHOOK_DENIAL = f'admission webhook "{WEBHOOK_NAME}" denied the request'
POLICY_DENIAL = "ValidatingAdmissionPolicy '"
_POLICY_FINDING = re.compile(r"(?:\): | \| )((?:spec|metadata)[^\s:]*): ")
REQUEST_TIMEOUT = 20.0
_PATH = re.compile(r"(?<![\w.])((?:spec|metadata)(?:\.[A-Za-z0-9_-]+|\[\d+\])+|apiVersion|kind)")
_WEBHOOK_LINE = re.compile(r"^- (\S+?): ", re.MULTILINE)
_ENVELOPE_WORDS = (
    ("the API version in the data", "apiVersion"),
    ("Object 'Kind' is missing", "kind"),
    ("Object 'apiVersion' is missing", "apiVersion"),
    ("must be of type AsyncGRPOJob", "kind"),
    ("Go value of type v1.ObjectMeta", "metadata"),
    ("Go struct field ObjectMeta.name ", "metadata.name"),
    ("Go struct field ObjectMeta.", "metadata"),
)
_ACCESSOR = re.compile(r"\.(apiVersion|kind|metadata) accessor error")
_UNKNOWN = re.compile(r'unknown field "([^"]+)"')


@dataclass
class CliVerdict:
    """What `asyncgrpo validate` says about one document."""

    ok: bool
    exit_code: int
    paths: list[str]
    output: str


@dataclass
class ApiVerdict:
    """What the API server answered to a dry-run create."""

    status: int
    message: str
    paths: list[str] = field(default_factory=list)
    by_webhook: bool = False
    """Refused by the webhook or the chart's ValidatingAdmissionPolicy: both name every finding
    in the rules' words, which `asyncgrpo validate` must report as well."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def as_yaml_file_reads(manifest: Any) -> Any:
    """The manifest as `asyncgrpo validate` and kubectl read it back from a YAML file.

    A round trip is not always the identity (e.g. a key that is a lone U+0085, a YAML line break),
    so both paths are given what the file really says.
    """
    return yaml.safe_load(yaml.safe_dump(manifest, allow_unicode=True, sort_keys=False))


def cli_verdict(manifest: Any) -> CliVerdict:
    """Run the CLI's `main` on the manifest as a YAML file, and the rules for the field paths."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8", delete=False) as handle:
        yaml.safe_dump(manifest, handle, allow_unicode=True, sort_keys=False)
        path = Path(handle.name)
    try:
        out = io.StringIO()
        code = validate_cli.main([str(path)], out=out)
    finally:
        path.unlink()
    report = validate_manifest(manifest) if isinstance(manifest, dict) else None
    paths = [e.path for e in report.errors] if report is not None else ["(document)"]
    return CliVerdict(ok=code == 0, exit_code=code, paths=paths, output=out.getvalue())


def api_verdict(api: Api, namespace: str, manifest: Any) -> ApiVerdict:
    """POST the manifest as a dry run; any answer, including a 5xx or a timeout, is returned."""
    url = api.base_url + JOBS.format(ns=namespace) + "?dryRun=All&fieldValidation=Strict"
    request = urllib.request.Request(url, data=json.dumps(manifest).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, context=api.ctx, timeout=REQUEST_TIMEOUT) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except TimeoutError as err:
        return ApiVerdict(status=-1, message=f"timeout: {err}", seconds=time.monotonic() - start)
    seconds = time.monotonic() - start
    try:
        body: dict[str, Any] = json.loads(raw)
    except ValueError:
        body = {"message": raw.decode(errors="replace")}
    if 200 <= status < 300:
        return ApiVerdict(status=status, message="", seconds=seconds)
    message = str(body.get("message", ""))
    return ApiVerdict(
        status=status,
        message=message,
        paths=api_paths(body),
        by_webhook=WEBHOOK_DENIAL in message or POLICY_DENIAL in message,
        seconds=seconds,
    )


def api_paths(body: dict[str, Any]) -> list[str]:
    """Field paths a rejection names: the webhook's lines, the schema's causes, or the message."""
    message = str(body.get("message", ""))
    if WEBHOOK_DENIAL in message:
        return _WEBHOOK_LINE.findall(message)
    if POLICY_DENIAL in message:
        return _POLICY_FINDING.findall(message)
    found: list[str] = []
    for cause in (body.get("details") or {}).get("causes") or []:
        name = str(cause.get("field", "")).lstrip(".")
        if name and name != "<nil>":
            found.append(name)
        found.extend(_UNKNOWN.findall(str(cause.get("message", ""))))
    found.extend(_UNKNOWN.findall(message))
    found.extend(_PATH.findall(message))
    # The API server's decoder names the envelope in words, not as a path.
    for words, path in _ENVELOPE_WORDS:
        if words in message:
            found.append(path)
    found.extend(_ACCESSOR.findall(message))
    return list(dict.fromkeys(found))


def related(a: str, b: str) -> bool:
    """Same field, or one is a parent of the other (a schema error on a list vs an item of it)."""
    a, b = _normal(a), _normal(b)
    return (
        a == b
        or a.startswith(b + ".")
        or b.startswith(a + ".")
        or a.startswith(b + "[")
        or b.startswith(a + "[")
    )


def _normal(path: str) -> str:
    return path.replace("[", ".[").replace(".[", "[").strip(".")


OBJECT_META_FIELDS = {
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
}
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def known_gap(manifest: Any) -> str | None:
    """The disagreements found by this suite and not yet fixed in asyncgrpo_api (docs/reliability.md).

    Each is named so the property test can count it and still fail on any *other* disagreement.
    """
    if not isinstance(manifest, dict):
        return None
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if metadata is None or (
        isinstance(metadata, dict)
        and (
            name is None
            or (isinstance(name, str) and (len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name)))
        )
    ):
        return "metadata.name-not-dns1123"
    if isinstance(metadata, dict) and set(metadata) - OBJECT_META_FIELDS:
        return "metadata-unknown-field"
    if _has_null(manifest):
        return "null-means-unset"
    return None


def _has_null(node: Any) -> bool:
    if node is None:
        return True
    if isinstance(node, dict):
        return any(_has_null(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_null(v) for v in node)
    return False


_TYPE_MISMATCH = re.compile(
    r'must be of type (integer|number|string|boolean): "(boolean|string|integer|number)"'
)


def coerced(cli: CliVerdict, api: ApiVerdict) -> str | None:
    """The API server refused a value of the wrong JSON type that the CLI took (pydantic's lax mode
    turns `false` into 0 and "8" into 8; the structural schema does not): an open finding. The
    CLI may still reject the job for another reason, so it is the field that must be missing."""
    if api.ok or not _TYPE_MISMATCH.search(api.message):
        return None
    if cli.ok or not any(related(a, c) for a in api.paths for c in cli.paths):
        return "lax-type-coercion"
    return None
