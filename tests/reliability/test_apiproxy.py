"""The recording proxy (apiproxy.py) stops cleanly: a request it cuts mid-stream, as the outage
tests do to open watches, leaves no pending task to print `Task was destroyed but it is pending!`
at the end of the CI log."""

from __future__ import annotations

import asyncio
import ssl
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.cluster import pki
from tests.reliability.apiproxy import RecordingProxy


def test_a_proxy_stopped_mid_stream_leaves_no_pending_task(tmp_path: Path) -> None:
    keys = pki.create(tmp_path / "pki")
    streaming, upstream_port, finished = threading.Event(), [0], asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"{}\n")
        streaming.set()
        await finished.wait()
        return response

    async def upstream(stop: threading.Event) -> None:
        app = web.Application()
        app.router.add_get("/watch", watch)
        runner = web.AppRunner(app)
        await runner.setup()
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(keys.server_crt, keys.server_key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        upstream_port[0] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        while not stop.is_set():
            await asyncio.sleep(0.05)
        finished.set()
        await runner.cleanup()

    async def client(url: str) -> None:
        tls = ssl.create_default_context(cafile=keys.ca_crt)
        try:
            async with aiohttp.ClientSession() as session, session.get(url, ssl=tls) as r:
                await r.content.read()
        except aiohttp.ClientError:
            pass  # the proxy cutting the stream is the point

    stop_upstream = threading.Event()
    server = threading.Thread(target=asyncio.run, args=(upstream(stop_upstream),))
    server.start()
    proxy: RecordingProxy | None = None
    try:
        while not upstream_port[0]:
            server.join(0.05)
        proxy = RecordingProxy(
            f"https://127.0.0.1:{upstream_port[0]}", keys.ca_crt, keys.server_crt, keys.server_key
        )
        proxy.start()
        caller = threading.Thread(target=asyncio.run, args=(client(f"{proxy.url}/watch"),))
        caller.start()
        assert streaming.wait(30)
        proxy.stop()
        caller.join(30)
        assert proxy._loop.is_closed()
        assert not asyncio.all_tasks(proxy._loop)
    finally:
        stop_upstream.set()
        server.join(30)
