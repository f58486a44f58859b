"""A real S3-compatible server for the object-store tests: SeaweedFS's single `weed` binary, built
from the Go module proxy like the local cluster's other components (`python -m tests.cluster build
--s3`, cached under ASYNCGRPO_CACHE) and started here on free ports, with its data in a folder of
the test session's, so the tests talk S3 to a server, never to a mock.

`kill` and `start` again keep the data folder: a fault test kills the server mid-upload and brings
the same buckets back. Access is signed with a fixed key pair (`ACCESS_KEY`, `SECRET_KEY`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import processes
from tests.cluster.build import build_optional

ACCESS_KEY = "asyncgrpo-test"
SECRET_KEY = "asyncgrpo-test-secret-key"
START_SECONDS = 90.0


def _free_base_port() -> int:
    """A port free together with port+10000 (weed's gRPC port for each service)."""
    for _ in range(200):
        port = random.randint(20000, 29000)
        if not any(processes.port_in_use("127.0.0.1", p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port pair for the S3 server")


@dataclass
class S3Server:
    """One `weed server -s3` process: master, volume, filer and the S3 gateway."""

    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    record: processes.ProcRecord | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log(self) -> Path:
        return self.root / "weed.log"

    def start(self) -> S3Server:
        weed = build_optional("seaweedfs").binary("weed")
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        identity = {"name": "tests", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        config.write_text(json.dumps({"identities": [identity]}))
        if not self.ports:
            self.ports = {name: _free_base_port() for name in ("master", "volume", "filer", "s3")}
        argv = [
            str(weed), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={self.ports['master']}", f"-volume.port={self.ports['volume']}",
            f"-filer.port={self.ports['filer']}", "-filer", "-s3", f"-s3.port={self.ports['s3']}",
            f"-s3.config={config}", "-volume.max=0", "-master.volumeSizeLimitMB=64",
        ]  # fmt: skip
        self.record = processes.spawn(
            f"weed-{len(self.ports)}",
            argv,
            logs=self.root,
            env=dict(os.environ),
            cwd=self.root,
            pids=processes.PidFile(self.root / "pids.json"),
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.record is not None and not processes.is_alive(self.record):
                raise RuntimeError(f"weed exited; its log:\n{processes.log_tail(self.record.log, 40)}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/healthz", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # the gateway answers: ready
            except (TimeoutError, urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"the S3 server did not answer within {START_SECONDS:g} s; see {self.record}")

    def create_bucket(self, name: str) -> None:
        import boto3  # noqa: PLC0415 (only the sessions that start the server import it)

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        client.create_bucket(Bucket=name)

    def set_quota(self, bucket: str, size_mb: int) -> None:
        """Set the bucket's quota (`weed shell`'s s3.bucket.quota). SeaweedFS enforces it by turning
        the whole bucket read-only once its stored size is over the quota (writes are then refused
        with AccessDenied), and writable again once it is under: the gateway checks every minute,
        `enforce_quotas` at once."""
        self._shell(f"s3.bucket.quota -name={bucket} -op=set -sizeMB={size_mb}")

    def enforce_quotas(self) -> str:
        """Apply every bucket's quota now; the shell's report names each bucket whose state changed
        ("changing bucket B to read only!" / "... to writable."). A bucket's size reaches the master
        with the volume server's heartbeat, seconds after a write."""
        return self._shell("s3.bucket.quota.enforce -apply")

    def _shell(self, command: str) -> str:
        weed = build_optional("seaweedfs").binary("weed")
        done = subprocess.run(
            [str(weed), "shell", f"-master=127.0.0.1:{self.ports['master']}",
             f"-filer=127.0.0.1:{self.ports['filer']}"],
            input=command + "\n", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"weed shell {command!r} failed: {done.stderr[-2000:]}")
        return done.stdout

    def kill(self) -> None:
        """SIGKILL the server (its data folder stays, as after a crash)."""
        if self.record is not None:
            processes.stop(self.record, grace=0.0)
            self.record = None

    def stop(self) -> None:
        if self.record is not None:
            processes.stop(self.record)
            self.record = None
