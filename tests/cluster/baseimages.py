"""The base image the Dockerfiles build on here, made from Debian's mirror instead of a registry.

No container registry is reachable from this machine, so python:3.11-slim-bookworm (the operator's
base) and the CUDA image (the trainer's) cannot be pulled. In their place: Debian bookworm by
`debootstrap --variant=minbase` plus what the Dockerfiles use of python:slim: `python` and `pip`
on PATH, venv, useradd/groupadd (minbase has them), CA certificates, and wget (KubeRay's probes
exec it in the Ray containers). Bookworm's python3 is 3.11, the slim image's minor version.

Why a venv at /opt/python: Debian marks its python3 externally managed (PEP 668), so `pip install`
into it is refused; python:slim's `pip install` works. A venv first on PATH gives the Dockerfiles
a `python` and `pip` that behave as the slim image's do. Its pip is Debian's build, which trusts
/etc/ssl/certs, so a build that mounts the host's certificates there reaches PyPI.

The image is cached in buildah's storage under a tag keyed by a hash of this recipe, and the
debootstrap tree (the slow part, about 80 s) as a tarball beside it, so a wiped storage folder
costs only the import.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from tests.cluster.buildah import ImageError, buildah, has_image, images_root, log
from tests.cluster.filelock import locked

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates", "netbase", "wget")
SOURCES = (
    f"deb {MIRROR} {SUITE} main\n"
    f"deb {MIRROR} {SUITE}-updates main\n"
    f"deb http://deb.debian.org/debian-security {SUITE}-security main\n"
)
"""The image's apt sources: with updates and security, so a Dockerfile's apt-get gets fixes."""
SETUP = (
    "python3 -m venv /opt/python",
    "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /usr/share/doc/* /usr/share/man/*",
    ": > /etc/resolv.conf",
    ": > /etc/hostname",
)
"""Run in the tree after debootstrap. The host's resolv.conf and hostname, which debootstrap
copies in, are emptied: the runtime provides both."""
CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8 \\
    PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
"""


def recipe_hash() -> str:
    """Hash of everything that goes into the base image; names its tag and cache folder."""
    h = hashlib.sha256()
    for part in (SUITE, MIRROR, *PACKAGES, SOURCES, *SETUP, CONTAINERFILE):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def python_base() -> str:
    """The base image's reference in our buildah storage, building it when it is not there."""
    ref = f"localhost/asyncgrpo/python-base:{recipe_hash()}"
    if has_image(ref):
        return ref
    folder = images_root() / "bases" / f"python-{recipe_hash()}"
    with locked(folder / ".lock"):
        if has_image(ref):
            return ref
        start = time.monotonic()
        if not (folder / "rootfs.tar").is_file():
            _debootstrap(folder)
        (folder / "Containerfile").write_text(CONTAINERFILE)
        buildah("bud", "--layers=false", "-t", ref, "-f", str(folder / "Containerfile"), str(folder))
        log(f"base image {ref} in {time.monotonic() - start:.0f} s")
    return ref


def _debootstrap(folder: Path) -> None:
    """Make the root file system and pack it as folder/rootfs.tar (a partial tree is removed)."""
    tree = folder / "rootfs"
    _remove_tree(tree)
    log(f"debootstrap {SUITE} from {MIRROR} (about 80 s) ...")
    try:
        include = ",".join(PACKAGES)
        _run(["debootstrap", "--variant=minbase", f"--include={include}", SUITE, str(tree), MIRROR])
        (tree / "etc" / "apt" / "sources.list").write_text(SOURCES)
        for command in SETUP:
            _run(["chroot", str(tree), "/bin/sh", "-c", command])
        tmp = folder / "rootfs.tar.tmp"
        _run(["tar", "--numeric-owner", "-C", str(tree), "-cf", str(tmp), "."])
        tmp.rename(folder / "rootfs.tar")
    finally:
        _remove_tree(tree)


def _remove_tree(tree: Path) -> None:
    """Remove a debootstrap tree; an interrupted debootstrap leaves /proc and /sys mounted in it."""
    if not tree.exists():
        return
    for mount in ("proc", "sys", "dev/pts", "dev"):
        subprocess.run(
            ["umount", "--recursive", "--lazy", str(tree / mount)], check=False, capture_output=True
        )
    mounted = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    if any(m == str(tree) or m.startswith(f"{tree}/") for m in mounted):
        raise ImageError(f"{tree} still has mounts in it; unmount them and remove it by hand")
    shutil.rmtree(tree)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
