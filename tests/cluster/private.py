"""A control plane of one test's own, for what must not happen to the shared one.

The shared control plane serves every test session and benchmark on the machine: restarting its
API server, compacting its etcd or removing KubeRay's CRDs would fail their requests. A test that
needs to do such things starts its own with `private_control_plane()`: the same binaries, its own
state folder and ports (ASYNCGRPO_CLUSTER_STATE and ASYNCGRPO_CLUSTER_PORT_OFFSET, through
`python -m tests.cluster`), about 10 s to start and 1.4 GB of memory, purged afterwards.

The port offset is ASYNCGRPO_PRIVATE_CLUSTER_PORT_OFFSET (default 300): two sessions on one
machine that both run such tests set different ones, and never the offset of a shared cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.config import _BASE_PORTS
from tests.cluster.pki import Pki
from tests.cluster.rest import Api

REPO = Path(__file__).resolve().parents[2]
OFFSET_ENV = "ASYNCGRPO_PRIVATE_CLUSTER_PORT_OFFSET"


@dataclass(frozen=True)
class PrivateCluster:
    """A running private control plane: its environment (for `python -m tests.cluster`), an
    admin client, its kubeconfig and state folder, and its port offset."""

    env: dict[str, str]
    api: Api
    kubeconfig: Path
    state: Path
    offset: int

    def cli(self, *args: str, timeout: float = 240) -> str:
        """`python -m tests.cluster <args>` against this cluster; fails the test on an error."""
        return _cli(self.env, *args, timeout=timeout)

    def port(self, component: str) -> int:
        return int(_BASE_PORTS[component]) + self.offset

    @property
    def pki(self) -> Pki:
        return Pki(self.state / "pki")


@contextmanager
def private_control_plane(state: Path, **env: str) -> Iterator[PrivateCluster]:
    """Start a control plane in `state` (extra environment for its components in `env`), yield
    it, and take it down and purge it afterwards."""
    offset = int(os.environ.get(OFFSET_ENV, "300"))
    full_env = {
        **os.environ,
        "ASYNCGRPO_CLUSTER_STATE": str(state),
        "ASYNCGRPO_CLUSTER_PORT_OFFSET": str(offset),
        **env,
    }
    _cli(full_env, "up", "--no-real-node")  # one real node per machine: the session cluster's
    try:
        api = Api(f"https://127.0.0.1:{int(_BASE_PORTS['kube-apiserver']) + offset}", Pki(state / "pki"))
        yield PrivateCluster(full_env, api, state / "kubeconfig", state, offset)
    finally:
        _cli(full_env, "down", "--purge", timeout=120)


def _cli(env: dict[str, str], *args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tests.cluster", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"tests.cluster {args}: {done.stdout}\n{done.stderr}"
    return done.stdout
