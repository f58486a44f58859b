"""The elastic generation fleet, the trainer's side: engines join on the generation nodes the cluster
gains, and leave from the pods the operator asks to drain (docs/guides/job-lifecycle.md#elastic-generation).

The operator grows the fleet by adding a generation worker pod; its Ray node carries the labels
`GENERATION_POOL_LABEL` and `WORKER_POD_LABEL` (the pod's name). `watch` polls Ray's node table
every `poll_seconds`, starts `engines_per_node` engines on each labelled node that hosts none (up
to `max_engines`, what maxReplicas allows) and stages them once they are up. A staged engine joins
at the controller's next refit (`regroup`, called with the dispatch gate closed): the refit that
follows is its first, so it holds the current weights before routing opens it (`opened`), by the
same transport as every engine; the staleness bounds see one more engine and nothing else.

The operator shrinks the fleet by naming a pod (`drain`, which the driver relays from its /progress
server's POST /drain): its engines are closed to new groups at once, the groups they hold finish
there (a retry goes to another engine), and at the first refit after the last of them is done
`regroup` removes and kills them and lists the pod in `drained`, which /progress reports as
drainedWorkers; only then does the operator delete the pod. No group is cancelled by a drain, so
none is lost or generated twice. The last engine open to groups is never closed: such a drain
waits until another engine has joined.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from asyncgrpo_api.v1alpha1.placement import GENERATION_POOL, GENERATION_POOL_LABEL, WORKER_POD_LABEL
from asyncgrpo_trainer.workers import EngineSpec, GenerationGroup

log = logging.getLogger(__name__)
POLL_SECONDS = 2.0


@dataclass
class Fleet:
    """See the module docstring. Built in the driver, run in the controller actor."""

    group: GenerationGroup
    spec: EngineSpec
    engines_per_node: int
    max_engines: int
    poll_seconds: float = POLL_SECONDS
    drained: list[str] = field(default_factory=list)
    """Pods whose engines are gone (or that hosted none): the operator may delete them."""
    node_of: dict[int, str] = field(default_factory=dict)
    """The Ray node of each engine, by its id in the group."""
    pod_of: dict[str, str] = field(default_factory=dict)
    """The pod of each labelled Ray node seen so far."""
    draining: list[str] = field(default_factory=list)
    """Pods asked to drain whose engines have not left yet."""
    _staged: list[tuple[str, list[Any]]] = field(default_factory=list)
    _starting: set[str] = field(default_factory=set)
    _failed: set[str] = field(default_factory=set)
    _joined: list[int] = field(default_factory=list)

    async def locate(self) -> None:
        """Where the engines started with the run are (once, before its first refit)."""
        ids = list(self.group.engines)
        nodes = await asyncio.gather(*(self.group.engines[e].node_id.remote() for e in ids))
        self.node_of.update(zip(ids, nodes, strict=True))

    async def watch(self) -> None:
        """Start engines on each generation node that hosts none, every `poll_seconds`."""
        while True:
            try:
                nodes = await asyncio.to_thread(ray.nodes)
            except Exception:  # the GCS busy or restarting: the next poll sees the nodes
                log.warning("could not read Ray's nodes for the elastic fleet", exc_info=True)
                nodes = []
            for node in nodes:
                labels = node.get("Labels") or {}
                if node.get("Alive") and labels.get(GENERATION_POOL_LABEL) == GENERATION_POOL:
                    self.pod_of[node["NodeID"]] = labels.get(WORKER_POD_LABEL, "")
                    self._consider(node["NodeID"])
            await asyncio.sleep(self.poll_seconds)

    def _engines(self) -> int:
        staged = sum(len(actors) for _, actors in self._staged)
        return len(self.group.engines) + staged + len(self._starting) * self.engines_per_node

    def _consider(self, node: str) -> None:
        pod = self.pod_of[node]
        hosting = {*self.node_of.values(), *(n for n, _ in self._staged), *self._starting, *self._failed}
        if node in hosting or pod in self.draining or pod in self.drained:
            return
        if self._engines() + self.engines_per_node > self.max_engines:
            return
        self._starting.add(node)
        asyncio.get_running_loop().create_task(self._start(node, pod), name=f"engines-on-{pod or node}")

    async def _start(self, node: str, pod: str) -> None:
        placement = {
            "num_cpus": 1.0,
            "num_gpus": self.spec.gpus,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
        }
        actors = [self.spec.start(placement) for _ in range(self.engines_per_node)]
        try:
            await asyncio.gather(*(a.stats.remote() for a in actors))
        except Exception:
            log.warning("generation engines on the new node of pod %s did not start", pod, exc_info=True)
            self._failed.add(node)
            actors_to_kill, actors = actors, []
            _kill(actors_to_kill)
        finally:
            self._starting.discard(node)
        if not actors:
            return
        if pod in self.draining:  # asked to drain while its engines started: they never join
            _kill(actors)
            self.draining.remove(pod)
            self.drained.append(pod)
            return
        log.info("%d generation engine(s) on pod %s join at the next refit", len(actors), pod)
        self._staged.append((node, actors))

    def joining(self) -> list[str]:
        """Pods whose engines are up and join at the next refit."""
        return [self.pod_of.get(node, "") for node, _ in self._staged]

    def drain(self, pods: list[str]) -> None:
        """The operator asks to remove these pods (see the module docstring)."""
        for pod in pods:
            if pod in self.draining or pod in self.drained:
                continue
            starting = any(self.pod_of.get(n) == pod for n in self._starting)
            if not starting and not self._engines_on(pod) and not self._staged_on(pod):
                self.drained.append(pod)  # it hosts no engine of this run
                continue
            log.info("draining generation pod %s: its engines take no new groups", pod)
            self.draining.append(pod)
        self._close_draining()

    def _engines_on(self, pod: str) -> list[int]:
        return [e for e, n in self.node_of.items() if self.pod_of.get(n) == pod]

    def _staged_on(self, pod: str) -> bool:
        return any(self.pod_of.get(n) == pod for n, _ in self._staged)

    def _close_draining(self) -> None:
        """Close the draining pods' engines to new groups, keeping at least one engine open."""
        for pod in self.draining:
            for engine in self._engines_on(pod):
                others = [e for e in self.group.engines if e not in self.group.closed and e != engine]
                if engine not in self.group.closed and others:
                    self.group.closed.add(engine)

    def regroup(self) -> bool:
        """At a refit, with the dispatch gate closed: staged engines join (closed until `opened`),
        drained pods' engines leave; whether the engines changed (a broadcast refit group forms
        again)."""
        changed = False
        for pod in list(self.draining):
            staged = [(n, a) for n, a in self._staged if self.pod_of.get(n) == pod]
            for item in staged:
                self._staged.remove(item)
                _kill(item[1])
            engines = self._engines_on(pod)
            idle = all(e in self.group.closed and not self.group.occupancy.outstanding[e] for e in engines)
            if not idle:
                continue
            for engine in engines:
                _kill([self.group.remove(engine)])
                del self.node_of[engine]
                changed = True
            self.draining.remove(pod)
            self.drained.append(pod)
            log.info("generation pod %s drained: %d engine(s) left the fleet", pod, len(engines))
        for node, actors in self._staged:
            for actor in actors:
                engine = self.group.add(actor)
                self.node_of[engine] = node
                self._joined.append(engine)
                changed = True
        self._staged.clear()
        self._close_draining()
        return changed

    def opened(self) -> None:
        """After the refit: the engines that joined at it hold the current weights; route to them."""
        for engine in self._joined:
            self.group.closed.discard(engine)
        self._joined.clear()
        self._close_draining()


def _kill(actors: list[Any]) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)
