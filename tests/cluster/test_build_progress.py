"""`make prepare` (the first step of `make demo`) shows the control-plane build's progress while it
runs, on a terminal, from its first seconds: the claim a newcomer checks by watching the console
for 12 minutes. (On a fresh machine the venv's bootstrap comes before it: venv, uv and two
packages took 9 s on a quiet moment of 2026-12-04 and 75 s beside a cold CI run's Go builds; make
echoes each of its commands as it starts.)

The real Makefile target, the real builder and its reporter run under a pseudo-terminal; only `go`
is a stand-in (a script on PATH) whose first build takes SLOW_STEP seconds and prints what the real
one prints (`go: downloading ...`). The report interval is shortened from 30 s to EVERY seconds.
"""

from __future__ import annotations

import itertools
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.build import PROGRESS_EVERY_SECONDS

REPO = Path(__file__).resolve().parents[2]
EVERY = 2.0
SLOW_STEP = 10.0
SLACK = 4.0  # a loaded 2-core machine delays a line this much at most

FAKE_GO = f"""#!{sys.executable}
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
if args[0] == "version":
    print("go version go1.26.0 linux/amd64")
elif args[0] == "mod":
    crds = Path(os.environ["FAKE_GO_MODULES"]) / "config" / "crd" / "bases"
    crds.mkdir(parents=True, exist_ok=True)
    (crds / "ray.io_rayclusters.yaml").write_text("kind: CustomResourceDefinition\\n")
    print(json.dumps({{"Dir": os.environ["FAKE_GO_MODULES"]}}))
elif args[0] == "build":
    print("go: downloading example.com/dependency v1.0.0", file=sys.stderr, flush=True)
    out, packages = args[args.index("-o") + 1], args[args.index("-o") + 2 :]
    if Path.cwd().name == "k8s":
        time.sleep({SLOW_STEP})
    targets = [Path(out) / p.rsplit("/", 1)[-1] for p in packages] if out.endswith("/") else [Path(out)]
    for t in targets:
        t.write_text("")
"""


def _read_lines(fd: int, deadline: float) -> list[tuple[float, str]]:
    """(seconds since start, line) of everything the terminal shows until the process exits."""
    start, buf, lines = time.monotonic(), b"", []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [(time.monotonic() - start, d.decode().rstrip("\r")) for d in done]
    return lines


def test_make_prepare_shows_build_progress_live_and_keeps_go_output_in_a_log(tmp_path: Path) -> None:
    assert PROGRESS_EVERY_SECONDS <= 30  # the README's promise; the test shortens it below
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "go").write_text(FAKE_GO)
    (fake_bin / "go").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env |= {
        "PATH": f"{fake_bin}:{env['PATH']}",
        "ASYNCGRPO_CACHE": str(tmp_path / "cache"),
        "ASYNCGRPO_BUILD_PROGRESS_SECONDS": str(EVERY),
        "FAKE_GO_MODULES": str(tmp_path / "modules"),
    }
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        ["make", "prepare"], cwd=REPO, env=env, stdin=terminal, stdout=terminal, stderr=terminal
    )
    os.close(terminal)
    try:
        lines = _read_lines(controller, time.monotonic() + 120)
    finally:
        os.close(controller)
        proc.kill()
    assert proc.wait() == 0, "\n".join(text for _, text in lines)
    console = "\n".join(text for _, text in lines)

    shown = [(at, text) for at, text in lines if text.startswith("[ctrlplane build]")]
    first = next(at for at, text in shown if "building kube-apiserver" in text)
    assert shown[0][0] <= PROGRESS_EVERY_SECONDS, console  # the first progress within 30 s of `make`
    last = next(at for at, text in shown if "built kube-apiserver" in text)
    assert last - first >= SLOW_STEP - SLACK, console  # printed as it ran, not held until the end
    during = [at for at, _ in shown if first <= at <= last]
    assert len(during) >= 3, console
    assert max(b - a for a, b in itertools.pairwise(during)) <= EVERY + SLACK, console

    assert "go: downloading" not in console
    assert "Entering directory" not in console and "Leaving directory" not in console
    log = re.search(r"go's own output \(module downloads, errors\): (\S+)", console)
    assert log is not None, console
    assert "go: downloading example.com/dependency" in Path(log.group(1)).read_text()
    assert "left" not in console  # a first build on this machine has no measured time to quote


def test_make_demo_starts_with_the_build_whose_progress_is_shown() -> None:
    """`make demo` is `make prepare` (the test above) and then the demo: nothing runs before the
    build that would keep its progress off the console."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    planned = subprocess.run(
        ["make", "-n", "demo"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "-j2 venv ctrlplane" in planned[0], planned
    assert "tests.e2e.demo" in planned[-1], planned
