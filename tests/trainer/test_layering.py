"""The pure layers stay pure: GRPO math, environments, sampler and buffer import no Ray, so they
can be reused (and tested) without a cluster, and the Megatron/vLLM backends can share them."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "asyncgrpo_trainer.algorithms.advantages",
    "asyncgrpo_trainer.algorithms.losses",
    "asyncgrpo_trainer.envs",
    "asyncgrpo_trainer.sampler",
    "asyncgrpo_trainer.buffer",
    "asyncgrpo_trainer.checkpoint",
    "asyncgrpo_trainer.progress",
]


def test_pure_modules_do_not_import_ray() -> None:
    code = f"import sys, {', '.join(PURE)}; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_reward_workers_do_not_import_torch() -> None:
    """Reward actor processes import only the environments: no torch start-up cost per job."""
    code = "import sys, asyncgrpo_trainer.rewards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
