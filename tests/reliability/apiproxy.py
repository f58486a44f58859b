"""A recording TLS proxy in front of the API server: every call the operator makes, as RBAC sees it.

Why a proxy and not the API server's audit log: the local control plane is shared by every test
session (and by other engineers' benchmarks), and turning on auditing means restarting
kube-apiserver with new flags. The proxy sits only in front of the one operator under test: its
kubeconfig points here, the proxy forwards each request unchanged (the ServiceAccount token
included, so the API server still authorizes every call against the chart's RBAC) and streams the
answer back (watches included). What it records is what an audit log at level Request would show:
method, path, query, the answer's status, and the request body (for ownerReferences).
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
_OWNER_RESOURCES = {("asyncgrpo.dev", "AsyncGRPOJob"): "asyncgrpojobs"}


@dataclass(frozen=True)
class Call:
    """One request the operator sent."""

    method: str
    path: str
    query: str
    status: int
    body: bytes


@dataclass(frozen=True)
class Permission:
    """What RBAC checks for a request: API group, resource (with subresource) and verb."""

    group: str
    resource: str
    verb: str
    namespace: str | None = None
    name: str | None = None


_CORE = re.compile(r"^/api/v1/(?P<rest>.*)$")
_GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<rest>.*)$")


def permission(call: Call) -> Permission | None:
    """The RBAC attributes of a resource request (None for discovery and other non-resource URLs)."""
    match = _CORE.match(call.path)
    group = ""
    if match is None:
        match = _GROUP.match(call.path)
        if match is None:
            return None
        group = match["group"]
    parts = [p for p in match["rest"].split("/") if p]
    namespace = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts:
        return None
    resource, name = parts[0], parts[1] if len(parts) > 1 else None
    if len(parts) > 2:
        resource = f"{resource}/{parts[2]}"
    query = parse_qs(call.query)
    verb = {
        "GET": "get" if name else ("watch" if query.get("watch", ["false"])[0] in ("true", "1") else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[call.method]
    return Permission(group, resource, verb, namespace, name)


def implied_permissions(call: Call) -> list[Permission]:
    """Permissions a call needs beyond its own: `update` on the owner's finalizers for every
    ownerReference with blockOwnerDeletion (the OwnerReferencesPermissionEnforcement plugin), and
    `list` for a streamed list (a watch with sendInitialEvents, which the API server authorizes as
    `watch`): where a server refuses streaming, the operator lists the same collection in pages
    (`k8s.Api`'s fallback), so the chart must grant it."""
    own = permission(call)
    if own is not None and own.verb == "watch" and parse_qs(call.query).get("sendInitialEvents") == ["true"]:
        return [Permission(own.group, own.resource, "list")]
    if call.method not in ("POST", "PUT", "PATCH") or not call.body:
        return []
    try:
        body: Any = json.loads(call.body)
    except ValueError:
        return []
    out = []
    for ref in _owner_references(body):
        if ref.get("blockOwnerDeletion"):
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            resource = _OWNER_RESOURCES.get((group, str(ref.get("kind"))), f"{str(ref.get('kind')).lower()}s")
            out.append(Permission(group, f"{resource}/finalizers", "update"))
    return out


def _owner_references(body: Any) -> list[dict[str, Any]]:
    """The ownerReferences a write sets: an object's or merge patch's metadata, or the values of a
    JSON patch's operations on /metadata/ownerReferences (the list, or one entry of it)."""
    if isinstance(body, dict):
        return list((body.get("metadata") or {}).get("ownerReferences") or [])
    refs: list[dict[str, Any]] = []
    for op in body if isinstance(body, list) else []:
        if isinstance(op, dict) and str(op.get("path", "")).startswith("/metadata/ownerReferences"):
            value = op.get("value")
            refs.extend(value if isinstance(value, list) else [value] if isinstance(value, dict) else [])
    return refs


class RecordingProxy:
    """Serve TLS on 127.0.0.1:<port> and forward everything to `upstream`."""

    def __init__(
        self,
        upstream: str,
        ca_file: Path,
        cert: Path,
        key: Path,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.client_cert = client_cert
        self.ca_file = ca_file
        self.cert = cert
        self.key = key
        self.calls: list[Call] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._active: set[asyncio.Transport] = set()
        self._site: web.TCPSite | None = None
        self._runner: web.AppRunner | None = None
        self._server_ssl: ssl.SSLContext | None = None
        self._thread = threading.Thread(target=self._run, name="recording-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("recording proxy did not start")

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def outage_begin(self) -> None:
        """The API server vanishes for the client: open streams are cut, new connections refused."""
        asyncio.run_coroutine_threadsafe(self._down(), self._loop).result(timeout=30)

    def outage_end(self) -> None:
        """Listen again on the same port."""
        asyncio.run_coroutine_threadsafe(self._up(), self._loop).result(timeout=30)

    async def _down(self) -> None:
        assert self._site is not None
        await self._site.stop()
        # Every connection, busy or idle keep-alive: a TCP reset, as when the API server dies.
        assert self._runner is not None and self._runner.server is not None
        for handler in list(self._runner.server.connections):
            if handler.transport is not None:
                handler.transport.abort()
        for transport in list(self._active):
            transport.abort()

    async def _up(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._server_ssl)
        await self._site.start()

    def _run(self) -> None:
        """Serve until `stop`, then cancel what is left (the handlers of connections cut mid-request)
        and close the loop: left pending, each prints `Task was destroyed but it is pending!` at exit."""
        with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        upstream_ssl = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert is not None:
            upstream_ssl.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(self.cert), str(self.key))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:

            async def handle(request: web.Request) -> web.StreamResponse:
                transport = request.transport
                if transport is not None:
                    self._active.add(transport)
                try:
                    return await forward(request)
                finally:
                    if transport is not None:
                        self._active.discard(transport)

            async def forward(request: web.Request) -> web.StreamResponse:
                body = await request.read()
                headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
                url = self.upstream + request.path_qs
                async with session.request(
                    request.method, url, headers=headers, data=body or None, ssl=upstream_ssl
                ) as answer:
                    split = urlsplit(request.path_qs)
                    self.calls.append(Call(request.method, split.path, split.query, answer.status, body))
                    out = web.StreamResponse(status=answer.status)
                    for k, v in answer.headers.items():
                        if k.lower() not in _HOP_BY_HOP:
                            out.headers[k] = v
                    await out.prepare(request)
                    try:
                        async for chunk in answer.content.iter_any():
                            await out.write(chunk)
                        await out.write_eof()
                    except (ConnectionResetError, aiohttp.ClientError):
                        pass
                    return out

            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
            await site.start()
            self._site, self._runner, self._server_ssl = site, runner, server_ssl
            server = site._server
            assert isinstance(server, asyncio.Server)
            self.port = int(server.sockets[0].getsockname()[1])
            self._ready.set()
            await self._stop.wait()
            assert runner.server is not None
            for handler in list(runner.server.connections):  # open watches: end them, then clean up
                if handler.transport is not None:
                    handler.transport.abort()
            await asyncio.sleep(0.1)
            await runner.cleanup()
