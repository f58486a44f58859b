"""The images as built here (`make images`): what the chart and KubeRay rely on, run in the image.

Each test runs a command in a container of the built image (`buildah run`, chroot isolation, the
image's own user, environment and working directory) rather than reading the Dockerfile. The first
run on a machine builds the images (minutes: see docs/benchmarks.md); later runs reuse the archives
cached under ~/.cache/asyncgrpo/images.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from asyncgrpo_api.v1alpha1.placement import ClusterSpec
from tests.cluster.buildah import buildah
from tests.cluster.images import Built

pytestmark = pytest.mark.images


@pytest.fixture(scope="module")
def run(built_images: dict[str, Built]) -> Iterator[dict[str, list[str]]]:
    """A container per image, for `_run`; removed at the end."""
    containers = {name: buildah("from", b.ref, capture=True).strip() for name, b in built_images.items()}
    yield {name: ["run", "--isolation=chroot", c, "--"] for name, c in containers.items()}
    for c in containers.values():
        buildah("rm", c, capture=True)


def _run(run: dict[str, list[str]], image: str, *command: str) -> str:
    return buildah(*run[image], *command, capture=True)


@pytest.mark.budget(
    900,
    "the session's image build is charged here, its first user: 7-13 min cold, about 4 when the "
    "trainer's dependencies change (230 s on 2026-12-07, which failed a CI run without this marker)",
)
@pytest.mark.parametrize("name", ["operator", "trainer-cpu"])
def test_the_archive_holds_the_image_under_its_reference(built_images: dict[str, Built], name: str) -> None:
    """What `ctr images import` reads: docker-archive's manifest.json with the reference as tag."""
    with tarfile.open(built_images[name].archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        (manifest,) = json.loads(member.read())
        assert manifest["RepoTags"] == [built_images[name].ref]
        assert set(manifest["Layers"]) <= set(tar.getnames())


def test_operator_image_runs_the_operator_as_65532_without_torch_or_ray(run: dict[str, list[str]]) -> None:
    assert _run(run, "operator", "id", "-u").strip() == "65532"
    probe = (
        "import sys, asyncgrpo_operator.main, asyncgrpo_operator.__main__; "
        "assert not {'torch', 'ray'} & set(sys.modules), sorted(sys.modules)"
    )
    _run(run, "operator", "python", "-c", probe)
    _run(run, "operator", "python", "-m", "asyncgrpo_operator", "--help")


def test_trainer_image_runs_as_uid_1000_with_a_writable_home(run: dict[str, list[str]]) -> None:
    out = _run(run, "trainer-cpu", "sh", "-c", 'id -u; echo "$HOME"; touch "$HOME/.probe" && echo ok')
    assert out.split() == ["1000", "/home/ray", "ok"]


def test_trainer_image_has_the_tests_ray_on_path_and_the_driver_module(run: dict[str, list[str]]) -> None:
    """KubeRay runs `ray start` and probes with wget; the operator runs `python -m asyncgrpo_trainer`
    and sets rayVersion to the API's default, which must be the image's Ray (KubeRay picks
    version-specific defaults by it) and the Ray the tests run."""
    image_ray = _run(run, "trainer-cpu", "ray", "--version")
    assert metadata.version("ray") in image_ray
    default = ClusterSpec().ray_version
    assert f"version {default}" in image_ray, f"spec.cluster.rayVersion defaults to {default}: {image_ray}"
    _run(run, "trainer-cpu", "wget", "--version")
    versions = _run(
        run,
        "trainer-cpu",
        "python",
        "-c",
        "import asyncgrpo_trainer.__main__, torch; print(torch.__version__, torch.cuda.is_available())",
    )
    assert versions.split() == [f"{metadata.version('torch')}+cu130", "False"]


@pytest.mark.parametrize("name", ["operator", "trainer-cpu"])
def test_the_hosts_extra_ca_is_not_in_the_image(run: dict[str, list[str]], name: str) -> None:
    """The builds mount the host's CA bundle to reach PyPI through a proxy; it must not be kept."""
    bundle = _run(run, name, "cat", "/etc/ssl/certs/ca-certificates.crt")
    extra = [p.read_text().strip() for p in Path("/usr/local/share/ca-certificates").glob("*.crt")]
    assert bundle and not [pem for pem in extra if pem and pem in bundle]
