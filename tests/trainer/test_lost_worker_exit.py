"""A Ray worker that dies under the run is an infrastructure failure, not a training error.

The operator retries exit code RAY_WORKER_LOST from the last checkpoint and never retries a
training error, so the driver must tell the two apart even when Ray wraps the death in task
errors raised by the controller actor.
"""

from __future__ import annotations

import pytest
import ray

from asyncgrpo_trainer.driver import error_text, lost_ray_worker


@ray.remote(num_cpus=0)
class Worker:
    def ping(self) -> int:
        return 1


@ray.remote(num_cpus=0)
class Controller:
    """Calls a worker the way the controller actor calls policy and generation workers."""

    def __init__(self, worker: ray.actor.ActorHandle) -> None:
        self.worker = worker

    def step(self) -> int:
        return int(ray.get(self.worker.ping.remote()))

    def fail(self) -> None:
        raise ValueError("reward must be finite")


@pytest.mark.trainer
def test_a_killed_worker_under_the_controller_is_classified_as_lost(ray_address: str) -> None:
    worker = Worker.remote()  # type: ignore[attr-defined]
    controller = Controller.remote(worker)  # type: ignore[attr-defined]
    assert ray.get(controller.step.remote()) == 1
    ray.kill(worker)
    with pytest.raises(ray.exceptions.RayError) as caught:
        ray.get(controller.step.remote(), timeout=60)
    assert lost_ray_worker(caught.value)


@pytest.mark.trainer
def test_an_error_raised_by_the_job_is_a_training_error(ray_address: str) -> None:
    controller = Controller.remote(Worker.remote())  # type: ignore[attr-defined]
    with pytest.raises(ray.exceptions.RayError) as caught:
        ray.get(controller.fail.remote(), timeout=60)
    assert not lost_ray_worker(caught.value)
    assert error_text(caught.value) == "ValueError: reward must be finite"


def test_plain_exceptions_are_training_errors() -> None:
    assert not lost_ray_worker(RuntimeError("boom"))
    assert not lost_ray_worker(ValueError("x"))
