"""What can be checked of the images without a Docker engine: sources, entrypoints, dependencies.

The images cannot be built here. These tests catch the usual ways a Dockerfile rots: a COPY of a
path that moved, an entrypoint module that was renamed, an operator image that quietly grows torch.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.chart.helm import CHART, REPO

IMAGES = REPO / "images"
OPERATOR = IMAGES / "operator.Dockerfile"
TRAINER = IMAGES / "trainer.Dockerfile"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copy_sources(dockerfile: Path) -> list[str]:
    """Build-context paths of every COPY/ADD (not those copied from another stage)."""
    sources: list[str] = []
    for word, args in instructions(dockerfile):
        if word not in {"COPY", "ADD"}:
            continue
        parts = shlex.split(args)
        if any(p.startswith("--from=") for p in parts):
            continue
        paths = [p for p in parts if not p.startswith("--")]
        sources += paths[:-1]
    return sources


def exec_form(dockerfile: Path, word: str) -> list[str]:
    (args,) = [a for w, a in instructions(dockerfile) if w == word]
    value = json.loads(args)
    assert isinstance(value, list)
    return [str(v) for v in value]


def module_exists(module: str) -> bool:
    """Whether `module` is a file in the source roots (without importing it)."""
    parts = module.split(".")
    for root in (REPO / "operator", REPO / "trainer"):
        base = root.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_every_copied_path_exists_in_the_build_context(dockerfile: Path) -> None:
    sources = copy_sources(dockerfile)
    assert sources
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"{dockerfile.name} copies paths that do not exist: {missing}"


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_images_run_as_a_non_root_user(dockerfile: Path) -> None:
    users = [a for w, a in instructions(dockerfile) if w == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}


def test_operator_image_runs_the_operator_module_the_chart_runs() -> None:
    assert exec_form(OPERATOR, "ENTRYPOINT") == ["python", "-m", "asyncgrpo_operator"]
    assert (REPO / "operator" / "asyncgrpo_operator" / "__main__.py").is_file()
    assert module_exists("asyncgrpo_operator.main"), "the kopf module __main__ runs"
    chart = (CHART / "templates" / "deployment.yaml").read_text()
    assert 'command: ["python", "-m", "asyncgrpo_operator"]' in chart
    assert "--liveness=http://0.0.0.0:8080/healthz" in exec_form(OPERATOR, "CMD")


def test_operator_image_installs_only_the_operator_extra() -> None:
    runs = " ".join(a for w, a in instructions(OPERATOR) if w == "RUN")
    assert '".[operator]"' in runs and '"asyncgrpo[operator]"' in runs
    installs = runs.replace("'torch' not in", "").replace("'ray' not in", "")
    for heavy in ("torch", "ray", "vllm", "megatron", "[gpu]", "[trainer]"):
        assert heavy not in installs, heavy


def test_trainer_image_cmd_is_the_driver_module() -> None:
    assert exec_form(TRAINER, "CMD") == ["python", "-m", "asyncgrpo_trainer"]
    assert (REPO / "trainer" / "asyncgrpo_trainer" / "__main__.py").is_file()
    assert not [w for w, _ in instructions(TRAINER) if w == "ENTRYPOINT"], (
        "KubeRay replaces the command with `ray start`; an ENTRYPOINT would wrap it"
    )
    assert '".[gpu]"' in TRAINER.read_text()


def venv_uv() -> Path:
    """uv where `make venv` installs it: inside the virtualenv that runs the tests (.venv/bin/uv)."""
    uv = Path(sysconfig.get_path("scripts")) / "uv"
    assert uv.is_file(), f"{uv} is missing: `make venv` installs uv into the virtualenv"
    return uv


def test_operator_extra_installs_in_a_clean_venv_without_torch_or_ray(tmp_path: Path) -> None:
    uv = str(venv_uv())
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    start = time.monotonic()
    # The tests' own interpreter: uv never has to find (or download) another Python.
    subprocess.run([uv, "venv", "--python", sys.executable, str(venv)], check=True, capture_output=True)
    subprocess.run(
        [uv, "pip", "install", "--python", str(python), f"{REPO}[operator]"],
        check=True,
        capture_output=True,
        env={**os.environ, "UV_LINK_MODE": "copy"},
    )
    installed = subprocess.run(
        [uv, "pip", "list", "--python", str(python), "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert {"kopf", "asyncgrpo", "cryptography"} <= names
    assert not names & {"torch", "ray", "vllm", "megatron-core", "numpy"}, names
    probe = (
        "import sys, asyncgrpo_operator.main, asyncgrpo_operator.__main__; "
        "assert not {'torch', 'ray'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([str(python), "-c", probe], check=True, cwd=tmp_path)
    print(f"clean operator venv in {time.monotonic() - start:.1f} s")


def test_trainer_image_has_what_the_operators_driver_container_runs() -> None:
    from asyncgrpo_operator import naming  # noqa: PLC0415 - the operator's contract with the image

    assert exec_form(TRAINER, "CMD")[-1] == naming.DRIVER_MODULE
    text = TRAINER.read_text()
    assert "PATH=/opt/venv/bin:$PATH" in text, (
        "the driver runs `python -m ...` from bash: python must be on PATH"
    )
    assert "wget" in text, "KubeRay's probes exec wget in the Ray containers"
