"""The pure layers stay pure: GRPO math, environments, sampler and buffer import no Ray, so they
can be reused (and tested) without a cluster, and the Megatron/vLLM backends can share them."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = [
    "asyncgrpo_trainer.algorithms.advantages",
    "asyncgrpo_trainer.algorithms.losses",
    "asyncgrpo_trainer.backends.packing",
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


@pytest.mark.parametrize(
    "module",
    ["asyncgrpo_trainer.rewards", "asyncgrpo_trainer.reward_function", "asyncgrpo_trainer.reward_model"],
)
def test_reward_workers_and_the_drivers_function_check_do_not_import_torch(module: str) -> None:
    """Reward actor processes import only the environments (and read a judge's verdicts as text: the
    judge's engine is an actor of its own), and the driver's child process that checks env.function
    only that: no torch start-up cost per job or per check."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
