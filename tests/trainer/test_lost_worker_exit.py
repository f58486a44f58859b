"""A Ray worker that dies under the run is an infrastructure failure, not a training error.

The operator retries exit code RAY_WORKER_LOST from the last checkpoint and never retries a
training error, so the driver must tell the two apart even when Ray wraps the death in task
errors raised by the controller actor.
"""

from __future__ import annotations

import time

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


def _wait_until_dead(worker: ray.actor.ActorHandle) -> None:
    """ray.kill only asks for the kill: a call made just after it can still be answered (a CI run
    at load 10 saw the controller's next step succeed), so wait until a call fails."""
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(worker.ping.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, "the killed worker still answers after 60 s"
        time.sleep(0.1)


@pytest.mark.trainer
def test_a_killed_worker_under_the_controller_is_classified_as_lost(ray_address: str) -> None:
    worker = Worker.remote()  # type: ignore[attr-defined]
    controller = Controller.remote(worker)  # type: ignore[attr-defined]
    assert ray.get(controller.step.remote()) == 1
    ray.kill(worker)
    _wait_until_dead(worker)
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
