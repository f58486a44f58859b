"""The pretrained CPU examples' commands as the guides document them, for CI to run.

They are read from a guide (the fenced block after a marker: models.md's pretrained-cpu example by
default, environments.md's calculator), so what CI runs is what a reader
copies, and run as written by the shell in an empty folder outside the clone, with ASYNCGRPO naming
a folder laid out like the clone (its .venv, this interpreter's, and docs linked in): so they work
from any folder, and their outputs stay out of the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "models.md"
MARKER = "<!-- pretrained-cpu commands -->"
CALCULATOR = (REPO / "docs" / "guides" / "environments.md", "<!-- calculator-cpu commands -->")
"""The calculator example's guide and marker."""


def documented_commands(guide: Path = GUIDE, marker: str = MARKER) -> list[str]:
    """The block's commands, continuation lines joined (as the shell joins them)."""
    block = guide.read_text().split(marker, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@dataclass(frozen=True)
class Place:
    """Where the commands run: `work`, an empty folder, with ASYNCGRPO set to `clone`."""

    clone: Path
    work: Path


def place(folder: Path) -> Place:
    """`folder/clone` with the clone's .venv (this interpreter's) and docs linked in, and an empty
    `folder/work` beside it to run in."""
    clone, work = folder / "clone", folder / "work"
    clone.mkdir(parents=True)
    work.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)
    (clone / "docs").symlink_to(REPO / "docs")
    return Place(clone, work)


def run(where: Place, command: str) -> subprocess.CompletedProcess[str]:
    """One documented command, by the shell; fails the test with its output's tail."""
    out = subprocess.run(
        ["bash", "-c", command],
        cwd=where.work,
        env={**os.environ, "ASYNCGRPO": str(where.clone)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert out.returncode == 0, f"$ {command}\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    return out
