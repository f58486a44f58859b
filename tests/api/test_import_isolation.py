"""The contract and the operator never pull in the trainer's heavy dependencies."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "vllm", "megatron")


@pytest.mark.parametrize(
    "statement",
    [
        "import asyncgrpo_api, asyncgrpo_api.rules, asyncgrpo_api.crdgen",
        "import asyncgrpo_operator",
        "from asyncgrpo_cli.main import main; main(['validate', '--help'])",
    ],
)
def test_importing_leaves_torch_and_ray_unloaded(statement: str) -> None:
    code = (
        "import sys\n"
        f"try:\n    {statement}\nexcept SystemExit:\n    pass\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print('LOADED=' + ','.join(loaded))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "LOADED=", result.stdout
