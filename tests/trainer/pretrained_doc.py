"""The pretrained CPU example's commands as docs/guides/models.md documents them, for CI to run.

They are read from the guide (the fenced block after MARKER), so what CI runs is what a reader
copies, and run as written in a folder laid out like the clone's root (its .venv and docs linked
in), where their relative paths resolve and their outputs (.asyncgrpo/) stay out of the checkout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "models.md"
MARKER = "<!-- pretrained-cpu commands -->"


def documented_commands() -> list[str]:
    """The block's commands, continuation lines joined (as the shell joins them)."""
    block = GUIDE.read_text().split(MARKER, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def clone_root(folder: Path) -> Path:
    """`folder` with the clone's .venv (this interpreter's) and docs linked in."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".venv").symlink_to(sys.prefix)
    (folder / "docs").symlink_to(REPO / "docs")
    return folder


def run(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    """One documented command in `root`, by the shell; fails the test with its output's tail."""
    out = subprocess.run(
        ["bash", "-c", command], cwd=root, capture_output=True, text=True, timeout=1800, check=False
    )
    assert out.returncode == 0, f"$ {command}\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    return out
