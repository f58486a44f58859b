"""Build the operator image and the CPU trainer image from images/*.Dockerfile, and export each as a
docker-archive tarball that `ctr -n k8s.io images import` loads (no registry on this machine).

Each Dockerfile gets only its base image as a build argument (the Debian base of baseimages.py in
place of the registry's), plus VARIANT=cpu for the trainer. An archive is named by a hash of what
the image is built from: the Dockerfile, the files it copies, the base recipe, the build arguments
and the pins below; an unchanged checkout reuses it without running buildah at all, and a changed
one rebuilds with buildah's layer cache (a code change does not reinstall torch).

The pins: pip in the builds is constrained to the versions installed in the project's .venv (the
ones the tests run), so the image's Ray is the tests' Ray and the operator's default rayVersion.
They reach pip through a pip.conf mounted at build time only, which also points pip at the host's
CA bundle, mounted read-only beside it (PyPI is reached through a proxy only the host trusts).
Neither is copied into a layer, and the image's own /etc/ssl/certs stays writable: mounting the
host's folder over it breaks a RUN step that upgrades ca-certificates (its postinst rewrites it).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

from tests.cluster.baseimages import python_base
from tests.cluster.buildah import buildah, images_root, install_tools, log, prune
from tests.cluster.filelock import locked

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncgrpo-operator"
PIP_CONF_IN_BUILD = "/etc/pip.conf"
CONSTRAINTS_IN_BUILD = "/run/asyncgrpo-constraints.txt"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_IN_BUILD = "/run/asyncgrpo-ca.crt"


@dataclass(frozen=True)
class Image:
    """One image: its Dockerfile, the build argument that names the base, the others, its name."""

    name: str
    dockerfile: str
    base_arg: str
    ref: str
    args: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Built:
    """A built image: its reference and the archive that holds it (what the node imports)."""

    name: str
    ref: str
    archive: Path
    size: int


def images() -> list[Image]:
    """The two images the tests run, named as the chart names the operator's image."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    operator = values["image"]["repository"]
    trainer = operator.rsplit("/", 1)[0] + "/trainer"
    return [
        Image("operator", "images/operator.Dockerfile", "PYTHON_IMAGE", f"{operator}:{version}"),
        Image(
            "trainer-cpu",
            "images/trainer.Dockerfile",
            "BASE_IMAGE",
            f"{trainer}:{version}-cpu",
            (("VARIANT", "cpu"),),
        ),
    ]


def constraints() -> str:
    """`name==version` of every distribution in the running interpreter's environment (the .venv),
    but the project itself."""
    pins = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    pins.pop("asyncgrpo", None)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def copied_paths(dockerfile: Path) -> list[str]:
    """The build-context paths a Dockerfile COPYs (not those from another stage)."""
    paths: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            paths += words[1:-1]
    return paths


def image_hash(image: Image, base: str, pins: str) -> str:
    """Hash of everything the image is built from (the base by its recipe-keyed tag)."""
    h = hashlib.sha256()
    dockerfile = REPO / image.dockerfile
    h.update(dockerfile.read_bytes())
    h.update(repr((image, base)).encode())
    h.update(pins.encode())
    h.update((REPO / ".dockerignore").read_bytes())
    for top in copied_paths(dockerfile):
        root = REPO / top
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _build_config(pins: str) -> Path:
    """The constraints and a pip.conf that applies them and trusts the host's CAs, for a build to
    mount read-only."""
    folder = images_root() / "build-config"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "constraints.txt").write_text(pins)
    (folder / "pip.conf").write_text(f"[global]\nconstraint = {CONSTRAINTS_IN_BUILD}\ncert = {CA_IN_BUILD}\n")
    return folder


def archive_path(image: Image, base: str, pins: str) -> Path:
    return images_root() / f"{image.name}-{image_hash(image, base, pins)}.tar"


def build_image(image: Image, base: str, pins: str) -> Path:
    """Build the image and export its archive (the caller holds the build lock)."""
    archive = archive_path(image, base, pins)
    config = _build_config(pins)
    log(f"building {image.ref} from {image.dockerfile}{estimate(image)} ...")
    start = time.monotonic()
    args = [f"--build-arg={image.base_arg}={base}"] + [f"--build-arg={k}={v}" for k, v in image.args]
    buildah(
        "bud",
        "--layers",
        "--force-rm",  # a failed step's container too: else it stays, mounted, in our storage
        "--network=host",
        "--isolation=chroot",
        f"-v={HOST_CA_BUNDLE}:{CA_IN_BUILD}:ro",
        f"-v={config / 'pip.conf'}:{PIP_CONF_IN_BUILD}:ro",
        f"-v={config / 'constraints.txt'}:{CONSTRAINTS_IN_BUILD}:ro",
        *args,
        "-f",
        str(REPO / image.dockerfile),
        "-t",
        image.ref,
        str(REPO),
    )
    built = time.monotonic() - start
    tmp = archive.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    buildah("push", "--quiet", image.ref, f"docker-archive:{tmp}:{image.ref}")
    tmp.rename(archive)
    _remove_older(image, archive)
    total = time.monotonic() - start
    log(f"{image.ref}: built in {built:.0f} s, exported in {total - built:.0f} s, {archive}")
    _record(image, archive, built, total)
    return archive


def _remove_older(image: Image, keep: Path) -> None:
    """Delete the image's archives of earlier inputs: the trainer's is gigabytes."""
    pattern = rf"{re.escape(image.name)}-[0-9a-f]{{16}}\.(tar|tmp)"
    for old in images_root().glob(f"{image.name}-*"):
        if old.stem != keep.stem and re.fullmatch(pattern, old.name):
            old.unlink()


def estimate(image: Image) -> str:
    """`(at most about N min ...)` for the progress line: the slowest build of this image recorded
    on this machine (a cold one; the layer cache makes most builds much shorter), or nothing when
    there is no record here: another machine's time would say what this one does not know
    (issue 34: an estimate of 23 min for a build that took 12)."""
    records = images_root() / "build-times.jsonl"
    seconds = [
        float(record["total_seconds"])
        for record in map(json.loads, records.read_text().splitlines() if records.is_file() else [])
        if record.get("image") == image.ref
    ]
    if not seconds:
        return " (its first build on this machine: minutes)"
    return f" (at most about {max(seconds) / 60:.0f} min: the slowest build here; cached layers cut it)"


def _record(image: Image, archive: Path, built: float, total: float) -> None:
    record = {
        "image": image.ref,
        "archive": archive.name,
        "bytes": archive.stat().st_size,
        "build_seconds": round(built, 1),
        "total_seconds": round(total, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with (images_root() / "build-times.jsonl").open("a") as fh:
        fh.write(json.dumps(record) + "\n")


def build_all() -> list[Built]:
    """Both images' archives, each built only when the one for its inputs is missing; after a
    build, the layer cache of earlier inputs is pruned.

    Why one lock for all builds: they share buildah's storage, and pruning beside another build
    (another checkout's, another test session's) could remove the step that build stands on.
    """
    install_tools()
    base = python_base()
    pins = constraints()
    wanted = {image: archive_path(image, base, pins) for image in images()}
    if not all(archive.is_file() for archive in wanted.values()):
        with locked(images_root() / "build.lock"):
            todo = [image for image, archive in wanted.items() if not archive.is_file()]
            for image in todo:
                build_image(image, base, pins)
            if todo:
                prune([base, *(image.ref for image in wanted)])
    return [Built(i.name, i.ref, a, a.stat().st_size) for i, a in wanted.items()]
