"""What can be checked of the Dockerfiles by reading them: sources, entrypoints, dependencies.

These tests catch the usual ways a Dockerfile rots: a COPY of a path that moved, an entrypoint
module that was renamed, an operator image that quietly grows torch. Their GPU image's base (CUDA)
cannot be pulled here; the images built here (operator, CPU trainer) are run by
test_image_builds.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
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


# --- users: a base image's own accounts --------------------------------------------------------

BASE_IMAGE_ACCOUNTS: list[tuple[str, dict[int, str], dict[int, str]]] = [
    # (a substring of the FROM image, its users by uid, its groups by gid), beyond the system ones
    ("ubuntu24.04", {1000: "ubuntu"}, {1000: "ubuntu"}),
    ("ubuntu:24.04", {1000: "ubuntu"}, {1000: "ubuntu"}),
    ("noble", {1000: "ubuntu"}, {1000: "ubuntu"}),
    ("ubuntu25", {1000: "ubuntu"}, {1000: "ubuntu"}),
    ("ubuntu:25", {1000: "ubuntu"}, {1000: "ubuntu"}),
]
"""Ubuntu's images gained a default `ubuntu` user (uid/gid 1000) in 23.04; Debian's and the python
images have none. A Dockerfile creating uid 1000 on such a base fails at build time."""


def base_image(dockerfile: Path) -> str:
    """The final stage's base image, with ARG defaults substituted."""
    args: dict[str, str] = {}
    image = ""
    for word, rest in instructions(dockerfile):
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
        elif word == "FROM":
            image = rest.split()[0]
            for name, value in args.items():
                image = image.replace("${" + name + "}", value).replace("$" + name, value)
    return image


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def shell_commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line (split at &&, ||, ; and |, quotes respected)."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


@dataclass
class Accounts:
    """/etc/passwd and /etc/group as uid/gid -> name, changed by the commands a RUN line runs."""

    image: str
    users: dict[int, str] = field(default_factory=dict)
    groups: dict[int, str] = field(default_factory=dict)

    def run(self, argv: list[str]) -> list[str]:
        """Apply one command; the reasons it would fail at build time."""
        tool, name, shown = argv[0], argv[-1], " ".join(argv)
        if tool == "userdel":  # with USERGROUPS_ENAB (Debian, Ubuntu) the user's own group goes too
            self.users = {u: n for u, n in self.users.items() if n != name}
            self.groups = {g: n for g, n in self.groups.items() if n != name}
        elif tool == "groupdel":
            self.groups = {g: n for g, n in self.groups.items() if n != name}
        elif tool == "useradd":
            return self._useradd(argv, name, shown)
        elif tool == "groupadd":
            gid = _option(argv, "-g", "--gid")
            if gid is not None:
                return self._take(self.groups, int(gid), name, f"`{shown}`: gid")
        return []

    def _useradd(self, argv: list[str], name: str, shown: str) -> list[str]:
        problems = (
            [f"`{shown}`: user {name!r} already exists in {self.image}"]
            if name in self.users.values()
            else []
        )
        uid = _option(argv, "-u", "--uid")
        if uid is None:
            return problems
        if "-o" not in argv and "--non-unique" not in argv:
            problems += self._take(self.users, int(uid), name, f"`{shown}`: uid")
        if _option(argv, "-g", "--gid") is None:  # a user group of the same number is created
            problems += self._take(self.groups, int(uid), name, f"`{shown}`: its user group's gid")
        return problems

    def _take(self, table: dict[int, str], number: int, name: str, what: str) -> list[str]:
        taken = table.get(number)
        table[number] = name
        return [f"{what} {number} already belongs to {taken!r} in {self.image}"] if taken else []


def account_conflicts(dockerfile: Path) -> list[str]:
    """Replay the useradd/userdel/groupadd/groupdel commands of the RUN lines on the base image's
    accounts; every create of a uid, gid or name that exists at that point is a build failure."""
    accounts = Accounts(base_image(dockerfile))
    for marker, users, groups in BASE_IMAGE_ACCOUNTS:
        if marker in accounts.image:
            accounts.users, accounts.groups = dict(users), dict(groups)
    problems: list[str] = []
    for word, rest in instructions(dockerfile):
        if word == "RUN":
            for argv in shell_commands(rest):
                problems += accounts.run(argv)
    return problems


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_images_create_no_user_or_group_their_base_image_already_has(dockerfile: Path) -> None:
    assert account_conflicts(dockerfile) == []


def test_the_account_check_catches_uid_1000_on_ubuntu_24_04(tmp_path: Path) -> None:
    broken = tmp_path / "broken.Dockerfile"
    broken.write_text(
        "ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04\nFROM ${CUDA_IMAGE}\n"
        "RUN useradd --uid 1000 --create-home --shell /bin/bash ray\n"
    )
    problems = account_conflicts(broken)
    assert problems and "uid 1000 already belongs to 'ubuntu'" in problems[0]


# --- CUDA: the base image and the pinned torch agree -------------------------------------------


def pinned(requirement_prefix: str, extra: str) -> str:
    """The version a pyproject extra pins with ==, e.g. pinned("torch", "trainer") -> "2.11.0"."""
    import tomllib  # noqa: PLC0415

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for requirement in extras[extra]:
        name, _, version = requirement.partition("==")
        if name.strip() == requirement_prefix:
            return version.strip()
    raise AssertionError(f"{requirement_prefix} is not pinned with == in the {extra} extra")


def test_the_trainer_image_cuda_is_the_cuda_of_the_pinned_torch_wheel() -> None:
    """torch's PyPI wheel is built for one CUDA (2.11.0: 13.0, as its cuda-toolkit requirement
    says); the image's CUDA runtime and compiler (vLLM and Megatron build extensions) must match."""
    from importlib import metadata  # noqa: PLC0415

    torch_pin = pinned("torch", "trainer")
    assert pinned("vllm", "gpu") == "0.26.0"
    if metadata.version("torch").split("+")[0] != torch_pin:
        pytest.skip(f"the installed torch is not the pinned {torch_pin}")
    toolkit = next(r for r in metadata.requires("torch") or [] if r.startswith("cuda-toolkit"))
    torch_cuda = ".".join(toolkit.split("==")[1].split(";")[0].strip().split(".")[:2])
    image = base_image(TRAINER)
    image_cuda = ".".join(image.split(":")[1].split("-")[0].split(".")[:2])
    assert image_cuda == torch_cuda, (
        f"{image} has CUDA {image_cuda}; torch {torch_pin} is built for {torch_cuda}"
    )


CPU_TORCH_OMITS = {"triton", "cuda-bindings"}
CPU_TORCH_OMITS_CUDA_TOOLKIT_EXTRAS = {"nvrtc", "nvtx"}
"""What the CPU trainer image leaves out of torch's requirements: only GPU code loads them."""


def test_the_cpu_trainer_installs_torchs_requirements_but_what_only_gpu_code_loads() -> None:
    """torch goes in with --no-deps and its requirements are listed in the Dockerfile: the list
    must follow torch's metadata, or a torch bump leaves the CPU image without a library it links."""
    from importlib import metadata  # noqa: PLC0415

    assert metadata.version("torch") == pinned("torch", "trainer"), "the .venv has another torch"
    expected: list[str] = []
    for requirement in metadata.requires("torch") or []:
        spec, _, marker = requirement.partition(";")
        name = spec.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
        if "extra ==" in marker or name in CPU_TORCH_OMITS:
            continue
        if name == "cuda-toolkit":
            extras = spec[spec.index("[") + 1 : spec.index("]")].split(",")
            kept = [e for e in extras if e not in CPU_TORCH_OMITS_CUDA_TOOLKIT_EXTRAS]
            spec = f"cuda-toolkit[{','.join(kept)}]{spec[spec.index(']') + 1 :]}"
        expected.append(spec.strip())
    runs = " ".join(a for w, a in instructions(TRAINER) if w == "RUN")
    assert [r for r in expected if r not in runs] == []
    assert not [o for o in CPU_TORCH_OMITS if o in runs]


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_the_image_builder_hashes_every_path_the_dockerfile_copies(dockerfile: Path) -> None:
    """tests/cluster/images.py keys an image's archive by the files its Dockerfile copies; a path
    it missed would leave a stale archive in use after that path changed."""
    from tests.cluster.images import copied_paths  # noqa: PLC0415

    assert copied_paths(dockerfile) == copy_sources(dockerfile)
