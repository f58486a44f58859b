"""A Ray worker that dies under the run is an infrastructure failure, not a training error.

The operator retries exit code RAY_WORKER_LOST from the last checkpoint and never retries a
training error, so the driver must tell the two apart even when Ray wraps the death in task
errors raised by the controller actor, and when the controller raised an error of its own because
of it (a prompt group that failed every attempt on a dead engine).
"""

from __future__ import annotations

import time

import pytest
import ray

from asyncgrpo_api import exitcodes
from asyncgrpo_trainer.driver import error_text, exit_code
from asyncgrpo_trainer.failures import lost_ray_worker, reports_lost_workers
from asyncgrpo_trainer.rollout import RolloutFailedError


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


@ray.remote(num_cpus=0)
class GivingUpController:
    """Gives up on a worker as the rollout manager does (an error of its own, raised from the
    worker's death), with and without SingleControllerActor.run's decorator."""

    def __init__(self, worker: ray.actor.ActorHandle) -> None:
        self.worker = worker

    async def give_up(self) -> int:
        try:
            return int(await self.worker.ping.remote())
        except ray.exceptions.RayActorError as lost:
            raise RolloutFailedError(f"prompt group 7 failed 3 attempt(s); last error: {lost!r}") from lost

    @reports_lost_workers
    async def give_up_reported(self) -> int:
        return await self.give_up()


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
def test_an_error_the_controller_raised_because_a_worker_died_is_retried_as_a_lost_worker(
    ray_address: str,
) -> None:
    worker = Worker.remote()  # type: ignore[attr-defined]
    controller = GivingUpController.remote(worker)  # type: ignore[attr-defined]
    ray.kill(worker)
    _wait_until_dead(worker)
    with pytest.raises(ray.exceptions.RayError) as unreported:
        ray.get(controller.give_up.remote(), timeout=60)
    # Why the controller actor must report it: Ray pickles the actor's error without __cause__.
    assert not lost_ray_worker(unreported.value)
    with pytest.raises(ray.exceptions.RayError) as caught:
        ray.get(controller.give_up_reported.remote(), timeout=60)
    assert exit_code(caught.value) == exitcodes.RAY_WORKER_LOST
    assert error_text(caught.value).startswith("WorkerLostError: RolloutFailedError: prompt group 7 failed")


@pytest.mark.trainer
def test_an_error_raised_by_the_job_is_a_training_error(ray_address: str) -> None:
    controller = Controller.remote(Worker.remote())  # type: ignore[attr-defined]
    with pytest.raises(ray.exceptions.RayError) as caught:
        ray.get(controller.fail.remote(), timeout=60)
    assert not lost_ray_worker(caught.value)
    assert exit_code(caught.value) == exitcodes.TRAINING_ERROR
    assert error_text(caught.value) == "ValueError: reward must be finite"


def test_plain_exceptions_are_training_errors() -> None:
    assert not lost_ray_worker(RuntimeError("boom"))
    assert not lost_ray_worker(ValueError("x"))
