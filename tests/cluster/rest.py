"""A minimal, typed HTTPS client for the local API server (standard library only).

Why not the `kubernetes` package: the launcher must work before any test dependency is imported,
server-side apply is a single PATCH with a content type, and returning plain dicts keeps mypy
--strict meaningful (the generated client is untyped). Tests may use any client they like with the
kubeconfig; this one is what the launcher, the fault helpers and the control-plane tests use.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tests.cluster.pki import Pki

JSON = dict[str, Any]
APPLY_MANAGER = "asyncgrpo-localcluster"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
"""The Accept type kubectl asks with: the server renders the resource's printer columns."""


class ApiError(RuntimeError):
    """A non-2xx answer; `status` is the HTTP code and `body` the decoded Status object if any."""

    def __init__(self, method: str, path: str, status: int, body: JSON) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", ""))
        super().__init__(f"{method} {path} -> {status} {body.get('message', body)}")


def condition(obj: JSON, ctype: str) -> JSON | None:
    """The condition of type `ctype` in obj.status.conditions, if any."""
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def client_context(pki: Pki) -> ssl.SSLContext:
    """TLS context that trusts the local CA and presents the admin client certificate."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    ctx.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))
    return ctx


@dataclass
class Api:
    """Talks to https://<host>:<port> as cluster admin."""

    base_url: str
    pki: Pki
    timeout: float = 30.0
    _ctx: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    @property
    def ctx(self) -> ssl.SSLContext:
        if self._ctx is None:
            self._ctx = client_context(self.pki)
        return self._ctx

    def request(
        self,
        method: str,
        path: str,
        body: JSON | str | None = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> JSON:
        """Send one request and decode the JSON answer; raise ApiError on a non-2xx status."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data: bytes | None = None
        if body is not None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                decoded: JSON = json.loads(raw)
            except ValueError:
                decoded = {"message": raw.decode(errors="replace")}
            raise ApiError(method, path, err.code, decoded) from None
        if not raw:
            return {}
        out = json.loads(raw)
        return out if isinstance(out, dict) else {"items": out}

    def get(self, path: str, **query: str) -> JSON:
        return self.request("GET", path, query=query or None)

    def table(self, path: str, **query: str) -> list[JSON]:
        """What `kubectl get` prints for `path`: the API server's Table (the resource's printer
        columns, `-o wide`'s included), one dict per row from column name to cell."""
        table = self.request("GET", path, query=query or None, accept=TABLE)
        names = [str(c["name"]) for c in table.get("columnDefinitions") or []]
        return [dict(zip(names, row["cells"], strict=True)) for row in table.get("rows") or []]

    def create(self, path: str, obj: JSON) -> JSON:
        return self.request("POST", path, obj)

    def delete(self, path: str, *, propagation: str = "Background") -> JSON:
        return self.request("DELETE", path, {"propagationPolicy": propagation})

    def merge_patch(self, path: str, patch: JSON) -> JSON:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def apply(self, path: str, obj: JSON | str, *, manager: str = APPLY_MANAGER) -> JSON:
        """Server-side apply (needed for the ~1 MB KubeRay CRDs: no last-applied annotation)."""
        content_type = "application/apply-patch+yaml"
        query = {"fieldManager": manager, "force": "true"}
        return self.request("PATCH", path, obj, content_type=content_type, query=query)

    def text(self, path: str) -> str:
        """GET a non-JSON endpoint such as /readyz."""
        req = urllib.request.Request(self.base_url + path)
        with urllib.request.urlopen(req, context=self.ctx, timeout=self.timeout) as resp:
            return str(resp.read().decode())
