"""buildah as the image builders run it: storage of our own under ~/.cache/asyncgrpo/images.

Why a storage folder of our own: the images are a cache of this project (keyed by hashes, pruned
with it) and other users of buildah on the machine must not see or delete them. Why overlay first:
with vfs every layer is a full copy of the tree below it, so a RUN on top of a 4 GB torch layer
copies 4 GB; overlay stores only the difference. Where the kernel or filesystem refuses overlay,
vfs always works; the driver that worked is recorded in `storage-driver` and used from then on
(one storage folder per driver: buildah cannot switch drivers on a folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.cluster.config import cache_root

DRIVERS = ("overlay", "vfs")
APT_PACKAGES = ("buildah", "debootstrap", "runc")
"""Debian's packages the image builds need; installed on first use (a fresh machine has none)."""


class ImageError(RuntimeError):
    """A tool is missing, or a build or export failed."""


def images_root() -> Path:
    """~/.cache/asyncgrpo/images (or <ASYNCGRPO_CACHE>/images): bases, storage, archives."""
    return cache_root().parent / "images"


def log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def install_tools() -> None:
    """apt-get install buildah, debootstrap and runc when one is missing (the builds run as root)."""
    if all(shutil.which(t) for t in APT_PACKAGES):
        return
    log(f"installing {' '.join(APT_PACKAGES)} with apt-get ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *APT_PACKAGES]):
        if subprocess.run(cmd, check=False, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            raise ImageError(f"`{' '.join(cmd)}` failed; the image builds need {', '.join(APT_PACKAGES)}")


def _base_args(driver: str) -> list[str]:
    root = images_root()
    return [
        "buildah",
        "--root",
        str(root / f"storage-{driver}"),
        "--runroot",
        str(root / f"run-{driver}"),
        "--storage-driver",
        driver,
    ]


def _works(driver: str) -> bool:
    """Whether a container can be created and mounted with this driver (what a RUN step does)."""
    args = _base_args(driver)
    made = subprocess.run([*args, "from", "scratch"], check=False, capture_output=True, text=True)
    if made.returncode != 0:
        return False
    name = made.stdout.strip()
    try:
        return subprocess.run([*args, "mount", name], check=False, capture_output=True).returncode == 0
    finally:
        subprocess.run([*args, "rm", name], check=False, capture_output=True)


@cache
def driver() -> str:
    """The recorded storage driver, else the first of DRIVERS that works here (then recorded)."""
    record = images_root() / "storage-driver"
    if record.is_file():
        return record.read_text().strip()
    images_root().mkdir(parents=True, exist_ok=True)
    for name in DRIVERS:
        if _works(name):
            record.write_text(name + "\n")
            log(f"buildah storage driver: {name}")
            return name
        log(f"buildah storage driver {name} does not work here")
    raise ImageError(f"no buildah storage driver works here (tried {', '.join(DRIVERS)})")


def buildah(*args: str, capture: bool = False) -> str:
    """Run buildah on our storage; its output when `capture`, else it streams to stderr."""
    cmd = [*_base_args(driver()), *args]
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE if capture else sys.stderr, text=True)
    if proc.returncode != 0:
        raise ImageError(f"buildah failed (exit {proc.returncode}): {' '.join(cmd)}")
    return proc.stdout or ""


def has_image(ref: str) -> bool:
    cmd = [*_base_args(driver()), "inspect", "--type", "image", ref]
    return subprocess.run(cmd, check=False, capture_output=True).returncode == 0


def _diff_ids(image: str) -> list[str]:
    inspected = json.loads(buildah("inspect", "--type", "image", image, capture=True))
    return list(inspected["OCIv1"]["rootfs"]["diff_ids"])


def prune(keep: list[str]) -> None:
    """Remove the untagged images that no build of `keep` can reuse from the layer cache.

    Why: `bud --layers` keeps an untagged image per step, and a changed dependency layer (the CPU
    trainer's is about 5 GB) leaves the old one behind. A cached step of a kept image is one whose
    layers are a prefix of that image's; every other untagged image is from an earlier input.
    `buildah rmi --prune` would remove the cache of the current images too.
    """
    chains = [_diff_ids(ref) for ref in keep]
    for image in json.loads(buildah("images", "--all", "--json", capture=True)):
        if image["names"]:
            continue
        layers = _diff_ids(image["id"])
        if not any(chain[: len(layers)] == layers for chain in chains):
            try:
                buildah("rmi", image["id"], capture=True)
            except ImageError as err:  # e.g. a container of it was left by an interrupted test
                log(f"kept {image['id'][:12]}: {err}")
