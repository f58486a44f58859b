"""The virtual cluster: Ray placement groups for the policy and generation worker groups.

Non-colocated (the default) gives each group its own placement group, one bundle per rank:
{CPU: 1, GPU: g} with g = gpusPerReplica (policy ranks are one per GPU, or one per pod on CPU).
Colocated puts both groups' actors into the same bundles, each taking half of the bundle's GPU.
Bundles are PACKed so that a group's ranks share nodes where possible (NCCL/gloo locality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

READY_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True)
class Pool:
    """Where a worker group's ranks go: a placement group and each rank's bundle and resources."""

    group: PlacementGroup
    ranks: int
    gpus_per_rank: float
    cpus_per_rank: float

    def options(self, rank: int) -> dict[str, Any]:
        """`.options(...)` for the actor of `rank`."""
        return {
            "num_cpus": self.cpus_per_rank,
            "num_gpus": self.gpus_per_rank,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=rank
            ),
        }


def _make(name: str, ranks: int, gpus: float, cpus: float) -> PlacementGroup:
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    pg = placement_group([dict(bundle) for _ in range(ranks)], strategy="PACK", name=name)
    try:
        ray.get(pg.ready(), timeout=READY_TIMEOUT_SECONDS)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        have = ray.cluster_resources()  # type: ignore[no-untyped-call]
        raise RuntimeError(
            f"placement group {name!r} ({ranks} x {bundle}) not ready after {READY_TIMEOUT_SECONDS:.0f}s: "
            f"the cluster lacks the resources (cluster: {have})"
        ) from None
    group: PlacementGroup = pg
    return group


def build_pools(
    *,
    policy_ranks: int,
    policy_gpus: int,
    generation_ranks: int,
    generation_gpus: int,
    colocated: bool,
    name: str = "asyncgrpo",
) -> tuple[Pool, Pool]:
    """(policy pool, generation pool); see the module docstring."""
    if colocated:
        ranks = max(policy_ranks, generation_ranks)
        pg = _make(f"{name}-colocated", ranks, float(policy_gpus), 2.0)
        half = policy_gpus / 2 if policy_gpus else 0.0
        return Pool(pg, policy_ranks, half, 1.0), Pool(pg, generation_ranks, half, 1.0)
    policy = Pool(
        _make(f"{name}-policy", policy_ranks, float(policy_gpus), 1.0), policy_ranks, policy_gpus, 1.0
    )
    generation = Pool(
        _make(f"{name}-generation", generation_ranks, float(generation_gpus), 1.0),
        generation_ranks,
        generation_gpus,
        1.0,
    )
    return policy, generation


def release(*pools: Pool) -> None:
    seen: set[str] = set()
    for pool in pools:
        key = pool.group.id.hex()
        if key not in seen:
            seen.add(key)
            remove_placement_group(pool.group)
