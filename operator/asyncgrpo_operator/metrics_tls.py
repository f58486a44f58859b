"""HTTPS for /metrics: the webhook's serving certificate, re-read when its files change.

Why the webhook's: the chart mounts it into every replica already (generated at install, your
own, or cert-manager's), and its CA is in the same Secret (`ca.crt`), so a ServiceMonitor can
verify the endpoint against it (serverName: the webhook Service's name). Bearer tokens travel in
the scrape, so they must not cross the network in the clear. A run without the files (local
development) serves a throwaway self-signed certificate, as controller-runtime's metrics server
does; a scraper then skips verification or trusts the CA written next to it.

The files are checked every minute (or as often as told) and loaded into the live SSL context when they change
(cert-manager renewals, a re-generated Secret): new connections get the new certificate, without
restarting the listener or the pod.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from asyncgrpo_operator import certs

log = logging.getLogger(__name__)

CHECK_SECONDS = 60.0
"""How often the files are compared with what is served, by default (the kubelet updates a
mounted Secret within about a minute of its change)."""


@dataclass
class ServingTls:
    """A server SSL context and the certificate files it serves."""

    files: certs.TlsFiles
    context: ssl.SSLContext = field(init=False)
    _stamp: tuple[float, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reload_if_changed()

    def reload_if_changed(self) -> bool:
        """Load the files again when their modification times changed; whether they did."""
        stamp = tuple(path.stat().st_mtime for path in (self.files.cert, self.files.key))
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(self.files.cert), str(self.files.key))
        self._stamp = stamp
        return True

    async def follow(self, every: float = CHECK_SECONDS) -> None:
        """Reload forever, every `every` seconds; a file caught half-written is tried again."""
        while True:
            await asyncio.sleep(every)
            try:
                if self.reload_if_changed():
                    log.info("metrics certificate reloaded", extra={"cert": str(self.files.cert)})
            except (OSError, ssl.SSLError) as exc:
                log.warning("metrics certificate not reloaded: %s", exc)


def serving_tls(cert_dir: Path | None) -> ServingTls:
    """The certificate in `cert_dir` (tls.crt, tls.key), or a self-signed one without it."""
    files = certs.TlsFiles(cert_dir) if cert_dir is not None else None
    if files is None or not (files.cert.is_file() and files.key.is_file()):
        files = certs.write_self_signed(hosts=["localhost", "127.0.0.1"])
        log.warning("serving /metrics with a throwaway self-signed certificate; CA at %s", files.ca)
    return ServingTls(files)
