"""The elastic generation fleet: the rule alone (`elastic.decide`), traces that sit at its thresholds
and must not flap, and the plan that applies it (grow by patching the RayCluster, shrink only after
the driver drained the named worker)."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.placement import GenerationWorkerGroup
from asyncgrpo_operator import elastic, plan
from asyncgrpo_operator.decision import Decision, DeliverDrain, ScaleGenerationWorkers
from asyncgrpo_operator.observed import FleetWindow
from tests.operator.builders import BASE_JOB, OWNER, at, cluster, healthy_pods, observe, pod

RULE = {"policyIdleAbove": 0.3, "generationGatedAbove": 0.5, "windowSteps": 3, "cooldownSeconds": 60}


def pool(replicas: int = 1, fewest: int = 1, most: int = 3, **rule: Any) -> GenerationWorkerGroup:
    return GenerationWorkerGroup.model_validate(
        {"replicas": replicas, "minReplicas": fewest, "maxReplicas": most, "autoscaling": {**RULE, **rule}}
    )


def windows(*shares: tuple[float, float], first: int = 1) -> list[FleetWindow]:
    """Step windows from (policy idle share, generation gated share) pairs, steps from `first`."""
    return [
        FleetWindow(first + i, 2.0, policy, max(gated, 0.0), gated, 1)
        for i, (policy, gated) in enumerate(shares)
    ]


STARVED = (0.6, 0.0)
GATED = (0.05, 0.8)


def test_a_policy_starved_for_every_window_of_the_rule_gets_one_more_worker_and_the_numbers() -> None:
    change = elastic.decide(pool(), windows(STARVED, (0.7, 0.0), (0.65, 0.0)), 1, None, at(0))
    assert change == elastic.Change(
        "up",
        2,
        "the policy waited for rollouts 60%, 70%, 65% of steps 1-3, above autoscaling.policyIdleAbove 30%: "
        "generation workers 1 -> 2 (maxReplicas 3)",
    )


@pytest.mark.parametrize(
    "trace",
    [
        [STARVED, STARVED],  # fewer windows than windowSteps
        [STARVED, (0.3, 0.0), STARVED],  # one window at the threshold, not above it
        [STARVED, STARVED, (0.1, 0.0)],
    ],
)
def test_no_change_unless_every_window_agrees(trace: list[tuple[float, float]]) -> None:
    assert elastic.decide(pool(), windows(*trace), 1, None, at(0)) is None


def test_a_fleet_at_its_bounds_or_a_fixed_one_does_not_change() -> None:
    assert elastic.decide(pool(most=2), windows(STARVED, STARVED, STARVED), 2, None, at(0)) is None
    assert elastic.decide(pool(replicas=1), windows(GATED, GATED, GATED), 1, None, at(0)) is None
    fixed = GenerationWorkerGroup(replicas=2)
    assert elastic.decide(fixed, windows(STARVED, STARVED, STARVED), 2, None, at(0)) is None


def test_engines_idle_behind_the_gate_while_the_policy_is_fed_lose_one_worker() -> None:
    change = elastic.decide(pool(replicas=2), windows(GATED, GATED, GATED), 2, None, at(0))
    assert change is not None and (change.direction, change.replicas) == ("down", 1)
    assert "idle behind the staleness gate 80%, 80%, 80% of steps 1-3" in change.message
    assert "below half of policyIdleAbove (15%): generation workers 2 -> 1 (minReplicas 1)" in change.message


def test_gated_engines_are_kept_while_the_policy_still_waits_in_the_band() -> None:
    """Between half of policyIdleAbove and policyIdleAbove neither rule acts."""
    band = [(0.2, 0.8)] * 3
    assert elastic.decide(pool(replicas=2), windows(*band), 2, None, at(0)) is None


def test_only_windows_after_the_last_change_count_and_none_within_the_cooldown() -> None:
    last = elastic.LastChange(at(0), step=3)
    trace = windows(STARVED, STARVED, STARVED, STARVED, STARVED)  # steps 1-5
    assert elastic.decide(pool(), trace, 2, last, at(600)) is None  # only steps 4 and 5 are new
    trace = windows(STARVED, STARVED, STARVED, first=4)
    assert elastic.decide(pool(), trace, 2, last, at(59)) is None
    change = elastic.decide(pool(), trace, 2, last, at(60))
    assert change is not None and change.replicas == 3


def replay(
    load: Callable[[int, random.Random], tuple[float, float]], *, steps: int, start: int = 1, seed: int = 0
) -> list[int]:
    """Run the rule against a fleet whose windows `load(workers, rng)` draws, one step every 20 s,
    applying each change at once (a shrink as if the driver drained at once); the fleet's size
    after every step."""
    rng = random.Random(seed)
    fleet, sizes, last = pool(replicas=start), [], None
    history: list[FleetWindow] = []
    workers = start
    for step in range(1, steps + 1):
        policy, gated = load(workers, rng)
        history.append(FleetWindow(step, 20.0, policy, gated, gated, workers))
        now = at(20 * step)
        change = elastic.decide(fleet, history[-10:], workers, last, now)
        if change is not None:
            workers, last = change.replicas, elastic.LastChange(now, step)
        sizes.append(workers)
    return sizes


def changes(sizes: list[int]) -> int:
    return sum(a != b for a, b in itertools.pairwise(sizes))


def test_a_policy_idle_share_sitting_at_the_threshold_does_not_flap() -> None:
    """The policy waits 30% +- 3% whatever the fleet (the load sits at policyIdleAbove): over 500
    steps the fleet changes a few times at most, each a step up, never back and forth."""
    sizes = replay(lambda workers, rng: (0.3 + rng.uniform(-0.03, 0.03), 0.1), steps=500)
    assert all(b >= a for a, b in itertools.pairwise(sizes)), "it only ever grows"
    assert sizes[-1] <= 3


def test_a_load_between_the_two_rules_settles_without_flapping() -> None:
    """One worker starves the policy (45%); two feed it to 20% +- 4% with the engines 60% idle behind
    the gate: a naive rule would shrink back and grow again. It grows once and stays."""

    def load(workers: int, rng: random.Random) -> tuple[float, float]:
        if workers == 1:
            return 0.45 + rng.uniform(-0.04, 0.04), 0.0
        return 0.2 + rng.uniform(-0.04, 0.04), 0.6 + rng.uniform(-0.1, 0.1)

    sizes = replay(load, steps=500)
    assert changes(sizes) == 1 and sizes[-1] == 2


def test_a_gated_share_sitting_at_its_threshold_shrinks_at_most_to_the_floor_and_never_grows() -> None:
    sizes = replay(lambda workers, rng: (0.05, 0.5 + rng.uniform(-0.03, 0.03)), steps=500, start=3)
    assert all(b <= a for a, b in itertools.pairwise(sizes)) and sizes[-1] >= 1


# --- the plan applies it ---------------------------------------------------------------------------


def elastic_job(most: int = 2, **rule: Any) -> AsyncGRPOJob:
    manifest = copy.deepcopy(BASE_JOB)
    manifest["spec"]["cluster"]["generationWorkers"].update(
        {"replicas": 1, "minReplicas": 1, "maxReplicas": most, "autoscaling": {**RULE, **rule}}
    )
    return AsyncGRPOJob.model_validate(manifest)


def progress(*shares: tuple[float, float], drained: tuple[str, ...] = ()) -> dict[str, Any]:
    wins = windows(*shares)
    return {
        "step": wins[-1].step,
        "state": "running",
        "windows": [
            {
                "step": w.step,
                "seconds": w.seconds,
                "policyIdleShare": w.policy_idle_share,
                "generationIdleShare": w.generation_idle_share,
                "generationGatedShare": w.generation_gated_share,
                "generationEngines": 1,
            }
            for w in wins
        ],
        "drainedWorkers": list(drained),
    }


def run(the_job: AsyncGRPOJob, seconds: float, doc: dict[str, Any], replicas: int, status: Any) -> Decision:
    rc = replace(cluster(0, provisioned=True), generation_group=1, generation_replicas=replicas)
    pods = (*healthy_pods(rc), *(pod(rc, group="generation", index=i) for i in range(1, replicas)))
    observed = observe(seconds, rc, pods=pods, progress=doc, the_job=the_job)
    return plan.plan(the_job, status, observed, generation=1, owner=OWNER)


def start(the_job: AsyncGRPOJob) -> Any:
    first = plan.plan(the_job, None, observe(0, configmap=False, the_job=the_job), generation=1, owner=OWNER)
    return first.status


def test_a_starved_policy_grows_the_raycluster_generation_group_once_with_an_event() -> None:
    the_job = elastic_job()
    decision = run(the_job, 30, progress(STARVED, STARVED, STARVED), 1, start(the_job))
    (scale,) = [a for a in decision.actions if isinstance(a, ScaleGenerationWorkers)]
    assert (scale.name, scale.group, scale.replicas, scale.remove) == ("demo-0", 1, 2, ())
    (event,) = [e for e in decision.events if e.reason == elastic.SCALED_UP]
    assert "waited for rollouts 60%, 60%, 60% of steps 1-3" in event.message and "1 -> 2" in event.message
    fleet = decision.status.generation_fleet
    assert fleet is not None and (fleet.replicas, fleet.last_change_time, fleet.last_change_step) == (
        2,
        at(30),
        3,
    )
    # The next pass reads the same windows (and KubeRay's group at 2): nothing more happens.
    again = run(the_job, 35, progress(STARVED, STARVED, STARVED), 2, decision.status)
    assert not [a for a in again.actions if isinstance(a, ScaleGenerationWorkers)]
    assert not [e for e in again.events if e.reason == elastic.SCALED_UP]


def test_a_shrink_asks_the_driver_to_drain_a_named_worker_and_removes_it_only_once_drained() -> None:
    the_job = elastic_job()
    status = start(the_job)
    asked = run(the_job, 30, progress(GATED, GATED, GATED), 2, status)
    assert not [a for a in asked.actions if isinstance(a, ScaleGenerationWorkers)]
    fleet = asked.status.generation_fleet
    assert fleet is not None and fleet.drain_request is not None
    worker = fleet.drain_request.pod
    assert worker == "demo-0-generation-worker-1" and fleet.drain_request.replicas == 1
    assert [e.reason for e in asked.events if e.reason.startswith("Generation")] == [elastic.DRAIN_REQUESTED]
    assert delivered(asked) == [("demo-0-head", worker)]
    # Until the driver lists it drained, every pass delivers the request again (the sender keeps
    # its own pace) and the pod stays, however long.
    waiting = run(the_job, 3600, progress(GATED, GATED, GATED), 2, asked.status)
    assert not [a for a in waiting.actions if isinstance(a, ScaleGenerationWorkers)]
    assert delivered(waiting) == [("demo-0-head", worker)]
    assert waiting.status.generation_fleet == fleet
    drained = run(the_job, 3605, progress(GATED, GATED, GATED, drained=(worker,)), 2, waiting.status)
    assert delivered(drained) == []
    (scale,) = [a for a in drained.actions if isinstance(a, ScaleGenerationWorkers)]
    assert (scale.replicas, scale.remove) == (1, (worker,))
    assert [e.reason for e in drained.events if e.reason.startswith("Generation")] == [elastic.SCALED_DOWN]
    after = drained.status.generation_fleet
    assert after is not None and after.drain_request is None and after.last_change_time == at(3605)


def delivered(decision: Decision) -> list[tuple[str, str]]:
    """The drain requests a pass hands to the sender: (the driver's pod, the worker)."""
    return [(a.head.name, a.worker) for a in decision.actions if isinstance(a, DeliverDrain)]


def test_cooldown_counts_from_the_last_change_across_passes() -> None:
    the_job = elastic_job(most=3, cooldownSeconds=600)
    grown = run(the_job, 30, progress(STARVED, STARVED, STARVED), 1, start(the_job))
    doc = progress(*[STARVED] * 7)  # steps 4-7 came after the change at step 3
    cooling = run(the_job, 629, doc, 2, grown.status)
    assert not [a for a in cooling.actions if isinstance(a, ScaleGenerationWorkers)]
    (scale,) = [
        a for a in run(the_job, 630, doc, 2, cooling.status).actions if isinstance(a, ScaleGenerationWorkers)
    ]
    assert scale.replicas == 3
