"""The single controller: a CPU-only Ray actor running the rollout and train pumps on one loop.

The driver builds every heavy object (worker groups, loader, buffer, sampler, rollout manager,
weight synchronizer) and hands them over in `ControllerArgs`; nothing heavy is constructed here.

Rollout pump: takes a dispatch batch of P prompts from the loader when the sampler's gate allows
it (one batch per trainer version when overSampling is false), then dispatches each prompt once
it holds a capacity permit (maxBufferedRollouts: in flight plus waiting to be trained), an
in-flight permit (maxInflightPrompts) and the refit gate is open. Each group is a task that
reserves a buffer slot, runs the rollout manager (deadline + retries) and commits the whole group.
A group whose scoring failed twice is dropped (`_drop`): never trained on, counted in
rewardFailures (against the step it was dispatched for), and replaced by the loader's next prompt
for the same step. Drops beyond the failure budget (`FailureBudget`) fail the run. With DAPO's
dynamic sampling a scored group whose rewards are all equal is dropped and replaced the same way,
up to the step's cap (`algorithms.dynamic_sampling`); this is the one place every mode's groups pass
before they enter the buffer.

Train pump: one loop iteration is one RL step and one optimizer step. It evicts groups that can
no longer be trained on, selects whole groups (at least minGroupsForStreamingTrain per chunk) and
streams each chunk into the step: advantages per group, reference log-probs only with a KL
penalty, forward/backward with gradients accumulated; `finish_step` normalizes once by the
global token count. Then refit: close the dispatch gate, abort in-flight groups the sampler can
never select, optionally drain the rest (asyncRL.drainBeforeRefit), sync weights, reset the
generation cache (always in sync mode; per recomputeKVCacheAfterWeightUpdates otherwise), bump
the generation version and reopen the gate. Validation and checkpoints follow at their periods.

A watchdog fails the run when neither pump progresses for stallTimeoutSeconds. Any exception in
a pump or a rollout task stops the actor: the remaining tasks are cancelled and awaited, and
`run` re-raises, so the driver exits non-zero with the error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

from asyncgrpo_api import outputs
from asyncgrpo_api.v1alpha1.trainer import (
    REWARD_FAILURE_FRACTION,
    REWARD_FAILURE_MIN_GROUPS,
    REWARD_FAILURE_WINDOW_STEPS,
)
from asyncgrpo_trainer import checkpoint, failures, occupancy, runlog
from asyncgrpo_trainer.algorithms import advantages
from asyncgrpo_trainer.algorithms.dynamic_sampling import DynamicSampling, informative
from asyncgrpo_trainer.backends import policy, sampling
from asyncgrpo_trainer.buffer import ReplayBuffer, Slot
from asyncgrpo_trainer.data import PromptLoader
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.fleet import Fleet
from asyncgrpo_trainer.logprob_gate import GateSettings, LogprobGate
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tokenizer import Tokenizer
from asyncgrpo_trainer.progress import FLEET_WINDOW_STEPS, RATE_WINDOW_STEPS, fleet_window, recent_token_rate
from asyncgrpo_trainer.rewards import RewardFailedError, RewardPool
from asyncgrpo_trainer.rollout import Answer, RolloutManager
from asyncgrpo_trainer.sampler import Sampler
from asyncgrpo_trainer.weights import RefitTiming, WeightSynchronizer
from asyncgrpo_trainer.workers import GenerationGroup, PolicyGroup

log = logging.getLogger(__name__)
MAX_RECORDS = 20_000
STEP_GAUGES = (
    "gen_kl_error",
    "behaviour_kl",
    "is_out_of_bounds",
    "mean_oldest_staleness",
    "entropy",
    "clip_fraction",
    "response_length_mean",
    "response_length_max",
    "truncated_fraction",
    "refit_seconds",
    "generation_pause_seconds",
    "policy_idle_share",
    "policy_busy_share",
    "generation_idle_share",
    "generation_gated_share",
    "generation_idle_shares",
    "buffer_fill",
    "samples_untrained",
)
"""Figures of the newest step that /progress carries for /metrics (`progress.Progress`)."""


class StallError(RuntimeError):
    """Neither pump made progress for stallTimeoutSeconds."""


class RewardFailuresError(RuntimeError):
    """More groups were dropped for failed scoring than the failure budget allows."""


class FailureBudget:
    """The dropped groups a run tolerates: at most max(REWARD_FAILURE_MIN_GROUPS,
    REWARD_FAILURE_FRACTION x window) among the last window = REWARD_FAILURE_WINDOW_STEPS x P
    groups scored. A window of groups rather than of one step keeps the rate meaningful at any P
    (and a step's drops are not all known while it is assembled: groups for later steps are scored
    meanwhile); the minimum keeps a small job alive through a flaky call, while a scorer failing
    most calls still exhausts it within a few steps."""

    def __init__(self, prompts_per_step: int) -> None:
        self.window = REWARD_FAILURE_WINDOW_STEPS * prompts_per_step
        self.limit = max(REWARD_FAILURE_MIN_GROUPS, int(REWARD_FAILURE_FRACTION * self.window))
        self.prompts_per_step = prompts_per_step
        self.recent: collections.deque[bool] = collections.deque(maxlen=self.window)

    def scored(self, *, dropped: bool) -> bool:
        """Record one group's outcome; whether the drops in the window are still within budget."""
        self.recent.append(dropped)
        return sum(self.recent) <= self.limit

    def describe(self) -> str:
        return (
            f"{sum(self.recent)} of the last {len(self.recent)} prompt groups scored were dropped for "
            f"failed scoring, more than the failure budget of {self.limit} in any {self.window} "
            f"({REWARD_FAILURE_FRACTION:.0%} of {REWARD_FAILURE_WINDOW_STEPS} x numPromptsPerStep "
            f"{self.prompts_per_step}, at least {REWARD_FAILURE_MIN_GROUPS})"
        )


@dataclass(frozen=True)
class Settings:
    """The knobs the controller reads, with the API's defaults already applied."""

    mode: str
    prompts_per_step: int
    generations_per_prompt: int
    max_steps: int
    min_groups_for_streaming_train: int
    max_buffered_rollouts: int
    max_inflight_prompts: int
    drain_before_refit: bool
    reset_cache_after_refit: bool
    stall_timeout_seconds: float
    leave_one_out: bool
    normalize_rewards: bool
    needs_reference_logprobs: bool
    val_period: int
    val_at_end: bool
    checkpoint_path: str
    checkpoint_every: int
    checkpoint_keep: int
    seed: int
    logprob_gate: GateSettings = field(default_factory=lambda: GateSettings(threshold=None))
    """spec.trainer.logprobGate (`logprob_gate`)."""
    dynamic_sampling_max_extra_groups: int | None = None
    """Replacements per step of DAPO's dynamic sampling; None when grpo.dynamicSampling is off."""
    sleep_generation_while_training: bool = False
    """generation.sleepWhileTraining: the engines sleep while the policy trains (`_sleep_generation`)."""
    log_level: str = "INFO"
    """spec.trainer.logLevel, for this actor's process (the driver sets its own)."""
    attempt: int | None = None
    """The job's attempt (the operator's ASYNCGRPO_ATTEMPT), recorded in the step records' file."""
    watchdog_interval_seconds: float = 1.0


@dataclass
class ResumeState:
    """Controller state restored from a checkpoint."""

    step: int
    batch_index: int
    buffer: dict[str, Any]
    pending: list[tuple[dict[str, Any], int | None]]
    loader: dict[str, Any]
    counters: dict[str, float]
    validation_reward: float | None
    validation_accuracy: float | None


@dataclass
class ControllerArgs:
    settings: Settings
    policy: PolicyGroup
    generation: GenerationGroup
    rewards: RewardPool
    rollout: RolloutManager
    weights: WeightSynchronizer
    loader: PromptLoader
    validation: list[Example]
    buffer: ReplayBuffer
    sampler: Sampler
    tokenizer: Tokenizer
    validation_params: sampling.SamplingParams
    model: ModelBuild
    """The recipe, recorded in every checkpoint's meta.json (`asyncgrpo export` reads it)."""
    resume: ResumeState | None = None
    fleet: Fleet | None = None
    """An elastic generation pool's joins and drains (`fleet`); None for a fixed pool."""


class Pulse:
    """A broadcast 'something changed' signal: waiters wake on the next fire or after a timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns normally when the waiting
        # task is cancelled in the same loop iteration as a fire, so a pump polling in a loop
        # swallowed the controller's shutdown and the run never ended.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()


@dataclass
class Timers:
    """Seconds per phase, summed over the run (and reset per step for the step log)."""

    phases: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] += seconds


class SingleController:
    """The controller logic; `SingleControllerActor` is this class as a CPU-only Ray actor."""

    def __init__(self, args: ControllerArgs) -> None:
        self.a = args
        self.s = args.settings
        self.buffer, self.sampler = args.buffer, args.sampler
        self.version = 0  # trainer version: optimizer steps taken
        self.gen_version = 0  # weight version the generation engines hold
        self.batch_index = 0  # next dispatch batch
        self.pending: collections.deque[tuple[Example, int | None]] = collections.deque()
        self.counters: dict[str, float] = collections.defaultdict(float)
        self.counters["reward_failures"] = 0.0  # on /metrics from the start, as a counter should be
        self.validation_reward: float | None = None
        self.validation_accuracy: float | None = None
        self.gen_logprob_error: float | None = None
        """The engine-vs-policy log-prob gate of the newest step that had fresh rows."""
        self.logprob_gate = LogprobGate(self.s.logprob_gate)
        self.failure_budget = FailureBudget(self.s.prompts_per_step)
        self.step_reward_failures: collections.Counter[int] = collections.Counter()
        """Dropped groups by the trainer version of the step they were dispatched for."""
        self.dynamic_sampling = DynamicSampling(self.s.dynamic_sampling_max_extra_groups)
        self.last_checkpoint_step: int | None = None
        self.exported: str | None = None  # the final Hugging Face directory, once written
        self.first_step_at: float | None = None
        """When this attempt trained its first step (epoch seconds): the operator measures the
        job's time from its attempt's start to it."""
        self.records: list[dict[str, Any]] = []
        self.records_dropped = 0  # older records are trimmed so a long run's memory stays flat
        self.totals = Timers()
        self.state = "starting"
        self.error: str | None = None
        self.stop_requested = False
        """Set by `stop` (the driver got SIGTERM): the step in progress is the last one."""
        self.generation_asleep = False
        self.sleep_lock = asyncio.Lock()
        """Held across a sleep or a wake, so a wake asked for during a sleep waits for it to end."""
        restored_ready = 0
        if args.resume is not None:
            restored_ready = self._restore(args.resume)
        self._restored_ready = restored_ready
        self.steps_file = self._open_steps_file(args.resume.step if args.resume is not None else None)

    # --- resume ---------------------------------------------------------------------------------

    def _restore(self, r: ResumeState) -> int:
        self.version = self.gen_version = r.step
        self.batch_index = r.batch_index
        self.buffer = ReplayBuffer.from_state_dict(r.buffer)
        # Groups that were in flight when the checkpoint was taken are generated again, first and
        # with their original target step, from the restored weights: no prompt is lost.
        redo = self.buffer.remove([s.group_id for s in self.buffer.in_flight()])
        self.pending.extend((s.example, s.target_step) for s in redo)
        self.pending.extend((Example(**e), t) for e, t in r.pending)
        self.a.loader.load_state_dict(r.loader)
        self.counters.update(r.counters)
        self.validation_reward = r.validation_reward
        self.validation_accuracy = r.validation_accuracy
        self.last_checkpoint_step = r.step
        return len(self.buffer)

    # --- entry points ---------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self.capacity = asyncio.Semaphore(self.s.max_buffered_rollouts - self._restored_ready)
        self.inflight_sem = asyncio.Semaphore(self.s.max_inflight_prompts)
        self.permitted = asyncio.Event()
        self.changed = Pulse()
        self.inflight: dict[int, asyncio.Task[None]] = {}
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.validation_task: asyncio.Task[None] | None = None
        self.validation_pin: asyncio.Event | None = None
        """Set once the running validation has generated every answer; until then refits wait."""
        self.t_start = time.perf_counter()
        self.started_at = time.time()
        self.occupancy = self.a.generation.occupancy
        self.occupancy.restart()
        if self.a.fleet is not None:
            await self.a.fleet.locate()
        await self._refit_weights(self.version, reset=True)
        if self.s.val_period and self.version == 0:
            # The curves start at the untrained model (0 samples); before the pumps, so every
            # answer comes from the initial weights.
            await self._validate(0, self._pin_validation())
        self.permitted.set()
        self.state = "running"
        pumps = [
            asyncio.create_task(self._rollout_pump(), name="rollout-pump"),
            asyncio.create_task(self._train_pump(), name="train-pump"),
            asyncio.create_task(self._watchdog(), name="watchdog"),
        ]
        if self.a.fleet is not None:
            pumps.append(asyncio.create_task(self.a.fleet.watch(), name="fleet"))
        waiting: set[asyncio.Future[None]] = {*pumps, self.failure}
        try:
            # The run ends when the train pump does (the rollout pump waits for replacements of
            # dropped groups until then), or at the first failure anywhere.
            while pumps[1] in waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raises the first failure
            if self.validation_task is not None:
                await self.validation_task
        except BaseException as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            await self._shutdown(pumps)
        self.state = "stopped" if self.stop_requested and self.version < self.s.max_steps else "succeeded"
        return await self.summary()

    async def _shutdown(self, pumps: list[asyncio.Task[None]]) -> None:
        tasks = [*pumps, *self.inflight.values()]
        if self.validation_task is not None:
            tasks.append(self.validation_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def poll(self, since: int) -> dict[str, Any]:
        """Progress and the step records after index `since` (the driver prints and serves them)."""
        steps = (r for r in reversed(self.records) if "reward_mean" in r)
        recent = list(itertools.islice(steps, max(RATE_WINDOW_STEPS, FLEET_WINDOW_STEPS)))  # newest first
        last: dict[str, Any] = recent[0] if recent else {}
        return {
            "progress": {
                "step": self.version,
                "max_steps": self.s.max_steps,
                "policy_version": self.gen_version,
                "reward_mean": last.get("reward_mean"),
                "accuracy": last.get("accuracy"),
                "mean_staleness": last.get("mean_staleness"),
                "tokens_per_second": recent_token_rate(recent[::-1]),
                "last_checkpoint_step": self.last_checkpoint_step,
                "validation_reward": self.validation_reward,
                "validation_accuracy": self.validation_accuracy,
                "reward_failures": int(self.counters["reward_failures"]),
                "gen_logprob_error": self.gen_logprob_error,
                "logprob_mismatch": self.logprob_gate.mismatch,
                "first_step_at": self.first_step_at,
                "windows": [fleet_window(r) for r in reversed(recent[:FLEET_WINDOW_STEPS])],
                "drained_workers": list(self.a.fleet.drained) if self.a.fleet is not None else [],
                "joining_workers": self.a.fleet.joining() if self.a.fleet is not None else [],
                # The newest step's training and sampling figures, for /metrics.
                **{key: last.get(key) for key in STEP_GAUGES},
                "state": self.state,
                "error": self.error,
                "mode": self.s.mode,
                "counters": dict(self.counters),
            },
            "records": self.records[max(since - self.records_dropped, 0) :],
        }

    async def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t_start
        gen_stats = await self.a.generation.stats()
        gen_busy = sum(g["busy_seconds"] for g in gen_stats) / max(len(gen_stats), 1)
        pol_busy = await self.a.policy.busy_seconds()
        return {
            "steps": self.version,
            "started_at": self.started_at,
            "wall_seconds": wall,
            "samples": self.counters["samples_trained"],
            "samples_per_second": self.counters["samples_trained"] / wall if wall else 0.0,
            "phases": dict(self.totals.phases),
            "policy_busy_seconds": pol_busy,
            "generation_busy_seconds": gen_busy,
            "generation_batches": sum(g.get("batches", 0.0) for g in gen_stats),
            "policy_idle_fraction": max(0.0, 1 - pol_busy / wall) if wall else 0.0,
            "generation_idle_fraction": max(0.0, 1 - gen_busy / wall) if wall else 0.0,
            "counters": dict(self.counters),
            "validation_reward": self.validation_reward,
            "validation_accuracy": self.validation_accuracy,
            "hf_checkpoint": self.exported,
            "records": self.records,
            "stopped": self.state == "stopped",
        }

    def _open_steps_file(self, resumed_step: int | None) -> runlog.StepsFile | None:
        """<checkpoint.path>/logs/steps.jsonl (asyncgrpo_api.outputs); a path that cannot be
        written costs the file (a warning), not the run."""
        path = Path(outputs.steps_file(self.s.checkpoint_path))
        try:
            return runlog.StepsFile(path, resumed_step=resumed_step, attempt=self.s.attempt)
        except OSError as exc:
            log.warning("no step records file: cannot write %s: %s", path, exc)
            return None

    def _record(self, record: dict[str, Any]) -> None:
        if self.steps_file is not None:
            try:
                self.steps_file.write(record)
            except OSError as exc:
                log.warning("the step records file stopped: %s", exc)
                self.steps_file = None
        self.records.append(record)
        if record.get("gen_logprob_error") is not None:
            self.gen_logprob_error = record["gen_logprob_error"]
        if len(self.records) > MAX_RECORDS:
            drop = len(self.records) - MAX_RECORDS // 2
            del self.records[:drop]
            self.records_dropped += drop

    # --- rollout side ---------------------------------------------------------------------------

    def _dispatch_done(self) -> bool:
        """Gated modes stop after the batch of the last step; over-sampling runs until the end."""
        return self.sampler.gated and self.batch_index >= self.s.max_steps and not self.pending

    async def _dispatched_for_current_weights(self) -> None:
        """Until the rollout pump has dispatched every group that the current version lets it
        (the gated modes' batches up to v + S, and any replacement waiting): the drain that follows
        in `_refit` then waits for all of them, so no group of those batches starts under newer
        weights because the pump had not run yet. With in-order dispatch this makes the schedule
        exact: batch k comes from weights k - S, whatever the timing."""
        while self.pending or not (
            self._dispatch_done() or not self.sampler.may_dispatch(self.batch_index, self.version)
        ):
            await self.changed.wait(0.01)

    async def _rollout_pump(self) -> None:
        while True:
            if not self.pending:
                # Wait for the replacement of a dropped group to join `pending` (even after the
                # last batch is out), or for the trainer to open the staleness gate: the engines'
                # idle time behind it is measured (`occupancy`).
                if self._dispatch_done():
                    await self.changed.wait(0.5)
                    continue
                if not self.sampler.may_dispatch(self.batch_index, self.version):
                    with self.occupancy.gated():
                        await self.changed.wait(0.5)
                    continue
                target = self.sampler.target_step(self.batch_index)
                self.pending.extend((ex, target) for ex in self.a.loader.next_batch())
                self.batch_index += 1
                continue
            with self.occupancy.gated():  # maxBufferedRollouts: groups wait to be trained
                await self.capacity.acquire()
            await self.inflight_sem.acquire()
            await self._wake_generation()  # a replacement group dispatched while the policy trains
            t0 = time.perf_counter()
            with self.occupancy.gated():  # a refit
                await self.permitted.wait()
            self.totals.add("rollout_gate_wait", time.perf_counter() - t0)
            # From here to create_task there is no await: the pending queue, the loader and the
            # buffer stay consistent for a checkpoint taken by the train pump.
            example, target = self.pending.popleft()
            gid = self.buffer.reserve(example, start_version=self.gen_version, target_step=target)
            self.inflight[gid] = asyncio.create_task(self._rollout_group(gid), name=f"group-{gid}")
            self.counters["groups_dispatched"] += 1

    async def _rollout_group(self, gid: int) -> None:
        slot = self.buffer.slots[gid]
        committed = False
        try:

            def restamp(attempt: int) -> None:
                if attempt:
                    self.buffer.restart(gid, start_version=self.gen_version)

            record = await self.a.rollout.run_group(slot.example, gid, restamp)
            self.counters["samples_generated"] += len(record.response_ids)
            self.failure_budget.scored(dropped=False)
            self.counters["tokens_generated"] += record.num_tokens
            for outcome in record.tool_outcomes:
                self.counters[f"tool_calls_{outcome}"] += 1
            if not self.dynamic_sampling.keep(self._step_of(slot), record.rewards):
                self.counters["groups_dropped_uninformative"] += 1
                self._replace(slot)
                return
            self.buffer.commit(gid, record, end_version=self.gen_version)
            committed = True
            self.counters["groups_committed"] += 1
            if record.last_version != record.first_version:
                self.counters["groups_straddling_refit"] += 1
            self.changed.fire()
        except asyncio.CancelledError:
            self.counters["groups_aborted"] += 1
            raise
        except RewardFailedError as exc:
            self.counters["samples_generated"] += self.s.generations_per_prompt  # generated, not scored
            self._drop(slot, exc)
        except Exception as exc:
            if not self.failure.done():
                self.failure.set_exception(exc)
        finally:
            if not committed:
                self.buffer.remove([gid])
                self.capacity.release()
            self.inflight.pop(gid, None)
            self.inflight_sem.release()

    def _drop(self, slot: Slot, exc: RewardFailedError) -> None:
        """A group whose scoring failed twice: never trained on, counted against the step it was
        dispatched for (the step being assembled when the sampler stamps none), and replaced by the
        next prompt (with the same target step), so that every step still trains on P groups.
        Drops beyond the failure budget fail the run: a scorer that fails that often is broken, and
        training around it would quietly skew the data towards the prompts it can score."""
        step = self._step_of(slot)
        self.counters["reward_failures"] += 1
        self.step_reward_failures[step] += 1
        log.warning("group %d (step %d) dropped: %s", slot.group_id, step + 1, exc)
        self._replace(slot)
        if not self.failure_budget.scored(dropped=True) and not self.failure.done():
            self.failure.set_exception(
                RewardFailuresError(f"{self.failure_budget.describe()}; the last, for step {step + 1}: {exc}")
            )

    def _step_of(self, slot: Slot) -> int:
        """The trainer version of the step a group is for: the one it was dispatched for, or the
        step being assembled when the sampler stamps none."""
        return self.version if slot.target_step is None else slot.target_step

    def _replace(self, slot: Slot) -> None:
        """Queue the loader's next prompt, first and for the same step, in place of a dropped group."""
        self.pending.appendleft((self.a.loader.next_example(), slot.target_step))
        self.changed.fire()

    # --- train side -----------------------------------------------------------------------------

    async def _train_pump(self) -> None:
        while self.version < self.s.max_steps and not self.stop_requested:
            record = await self._train_step()
            self._record(record)
            self.logprob_gate.observe(record["step"], record.get("gen_logprob_error"))
            await self._after_step()
        if self.stop_requested and self.last_checkpoint_step != self.version:
            # Stopped (SIGTERM: a preemption, a suspend, a drain): the step just trained is saved,
            # so the resumed run starts right after it and no step is trained twice or lost.
            await self._checkpoint(self.version)

    def stop(self) -> None:
        """End the run after the step in progress, with a checkpoint of it (see `_train_pump`)."""
        self.stop_requested = True

    def drain(self, pods: list[str]) -> None:
        """The operator asks to remove these generation pods (`fleet.Fleet.drain`)."""
        if self.a.fleet is None:
            log.warning("drain of %s ignored: the generation pool is not elastic", pods)
            return
        self.a.fleet.drain(pods)

    async def _select_chunk(self, remaining: int, step: dict[str, float]) -> list[Slot]:
        while True:
            evicted = self.sampler.evict(self.buffer, self.version)
            for slot in evicted:
                self.capacity.release()
                if self.sampler.replaces_evicted:
                    self._replace(slot)
            step["evicted"] += len(evicted)
            chosen = self.sampler.select(
                self.buffer,
                self.version,
                min_groups=min(self.s.min_groups_for_streaming_train, remaining),
                max_groups=remaining,
            )
            if chosen is not None:
                for _ in chosen:
                    self.capacity.release()
                return chosen
            t0 = time.perf_counter()
            await self.changed.wait(0.05)
            step["exposed_generation"] += time.perf_counter() - t0

    async def _train_step(self) -> dict[str, Any]:
        t_step = time.perf_counter()
        fleet_before = self.occupancy.reading()
        generated_before = self.counters["tokens_generated"]
        step: dict[str, float] = collections.defaultdict(float)
        rewards: list[float] = []
        correct: list[bool] = []
        lengths: list[int] = []
        truncated: list[bool] = []
        spreads: list[float] = []
        staleness: list[int] = []
        oldest_staleness: list[int] = []
        taken = tokens = chunks = uninformative = 0
        while taken < self.s.prompts_per_step:
            groups = await self._select_chunk(self.s.prompts_per_step - taken, step)
            await self._sleep_generation(step)
            rows = self._rows(groups)
            if self.s.needs_reference_logprobs:
                t0 = time.perf_counter()
                refs = await self.a.policy.reference_logprobs([(r.prompt_ids, r.response_ids) for r in rows])
                rows = [
                    dataclasses.replace(r, reference_logprobs=lp) for r, lp in zip(rows, refs, strict=True)
                ]
                step["logprobs"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            await self.a.policy.train_chunk(rows)
            step["training"] += time.perf_counter() - t0
            taken += len(groups)
            chunks += 1
            # Trained tokens: a conversation's environment tokens are not (`policy.TrainRow.loss_mask`).
            tokens += sum(len(r.response_ids) if r.loss_mask is None else sum(r.loss_mask) for r in rows)
            for g in groups:
                if g.record is not None:
                    rewards.extend(g.record.rewards)
                    correct.extend(g.record.correct)
                    spreads.append(max(g.record.rewards) - min(g.record.rewards))
                    uninformative += not informative(g.record.rewards)
                    lengths.extend(len(r) for r in g.record.response_ids)
                    truncated.extend(not f for f in g.record.finished)
                    oldest_staleness.append(self.version - g.record.oldest_version)
            staleness.extend(self.version - g.start_version for g in groups)
        t0 = time.perf_counter()
        metrics = await self.a.policy.finish_step()
        step["training"] += time.perf_counter() - t0
        if self.s.drain_before_refit and self.sampler.gated:
            t0 = time.perf_counter()
            await self._dispatched_for_current_weights()
            self.totals.add("drain_wait", time.perf_counter() - t0)
        trained_at = self.version
        self.version += 1  # no await between the bump and closing the gate in _refit
        reward_failures = self.step_reward_failures.pop(trained_at, 0)
        sampled = self.dynamic_sampling.report(trained_at)
        self.counters["dynamic_sampling_cap_hits"] += sampled.cap_hit
        t0 = time.perf_counter()
        await self._refit(step)
        step["refit"] += time.perf_counter() - t0
        wall = time.perf_counter() - t_step
        fleet = occupancy.shares(fleet_before, self.occupancy.reading())
        policy_compute = step["training"] + step["logprobs"] + step["refit_seconds"]
        evicted = step.pop("evicted", 0.0)
        for name, value in step.items():
            self.totals.add(name, value)
        self.counters["samples_trained"] += len(rewards)
        self.counters["groups_evicted"] += evicted
        if self.first_step_at is None:
            self.first_step_at = time.time()
        return {
            "step": self.version,
            "samples_trained": self.counters["samples_trained"],
            "trained_at_version": trained_at,
            "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(correct) / len(correct),
            # Why a step trains or not: a group whose samples all scored the same has zero
            # advantage and adds no gradient; a step where every group does trains nothing.
            "reward_spread": sum(spreads) / len(spreads),
            "zero_advantage_groups": uninformative / len(spreads),
            "response_length_mean": sum(lengths) / len(lengths),
            "response_length_max": max(lengths),
            # Cut at maxNewTokens without a stop: the environments score these 0.
            "truncated_fraction": sum(truncated) / len(truncated),
            # Versions between the weights trained and those a group was dispatched with, and those
            # of the oldest weights that shaped any of its tokens (its stamp, which the streaming
            # gates bound by S): a cached prompt's KV makes the second larger.
            "mean_staleness": sum(staleness) / len(staleness),
            "max_staleness": max(staleness),
            "mean_oldest_staleness": sum(oldest_staleness) / len(oldest_staleness),
            "max_oldest_staleness": max(oldest_staleness),
            "chunks": chunks,
            "tokens": tokens,
            # Generated (not only trained) tokens: over-sampled modes generate more than they train.
            "tokens_per_second": (self.counters["tokens_generated"] - generated_before) / wall,
            "trained_tokens_per_second": tokens / wall,
            "step_seconds": wall,
            "evicted_groups": evicted,
            "reward_failures": reward_failures,
            # Dynamic sampling: groups dropped for equal rewards (each replaced), every group
            # generated for the step (P trained plus the dropped ones), and whether the step ran
            # out of replacements and kept uninformative groups (zero_advantage_groups: what share).
            "groups_dropped_uninformative": sampled.dropped,
            "groups_generated": self.s.prompts_per_step + sampled.dropped + reward_failures,
            "dynamic_sampling_cap_hit": sampled.cap_hit,
            "refit_transport": self.a.weights.transport,
            # Who waited for whom in this step's window (its step_seconds), measured: the policy
            # waiting for rollouts (idle) or computing (training, reference log-probs, the weight
            # transfer; the rest is the refit's gates and bookkeeping); each engine holding no
            # request (idle), and the part of that behind the staleness gate (`occupancy`).
            "policy_idle_share": min(step["exposed_generation"] / wall, 1.0),
            "policy_busy_share": min(policy_compute / wall, 1.0),
            "generation_idle_shares": [round(x, 4) for x in fleet.idle],
            "generation_idle_share": sum(fleet.idle) / len(fleet.idle),
            "generation_gated_share": sum(fleet.gated_idle) / len(fleet.gated_idle),
            "generation_engines": len(fleet.idle),
            # Groups sent to each engine over the run, by engine id (an elastic fleet's engines
            # join and leave; a drained one's count stays as it was).
            "generation_requests": {str(e): n for e, n in self.occupancy.requests.items()},
            "buffer_fill": len(self.buffer.ready()) / self.s.max_buffered_rollouts,
            "weight_version": self.gen_version,
            # Samples generated and never trained on (dropped, evicted, or still in the buffer).
            "samples_generated": self.counters["samples_generated"],
            "samples_untrained": self.counters["samples_generated"] - self.counters["samples_trained"],
            **{k: round(v, 6) for k, v in step.items()},
            **metrics,
        }

    def _rows(self, groups: list[Slot]) -> list[policy.TrainRow]:
        """Training rows of whole groups; advantages are exact per group. A conversation's row
        trains only its policy tokens within the staleness bound (`GroupRecord.trainable_mask`);
        each token's recorded log-prob is that of the version that sampled it. A row is fresh only
        when its group's stamp is the version trained: all of its KV and logits came from these
        weights, so the engine's log-probs and the policy's should agree, and the log-prob gate
        measures it. With loss.importanceSamplingOnStaleData false only fresh rows carry an
        importance weight (`algorithms.losses`)."""
        scored = [(g.record, g.record.oldest_version == self.version) for g in groups if g.record is not None]
        rewards = torch.tensor([rec.rewards for rec, _ in scored], dtype=torch.float32)
        adv = advantages.group_relative(
            rewards, leave_one_out=self.s.leave_one_out, normalize=self.s.normalize_rewards
        )
        oldest = self.sampler.oldest_version(self.version)
        return [
            policy.TrainRow(
                rec.prompt_ids,
                rec.response_ids[i],
                rec.generation_logprobs[i],
                float(adv[g, i]),
                fresh=fresh,
                loss_mask=None if rec.loss_masks is None else rec.trainable_mask(i, oldest_version=oldest),
            )
            for g, (rec, fresh) in enumerate(scored)
            for i in range(len(rec.response_ids))
        ]

    async def _refit(self, step: dict[str, float]) -> None:
        self.permitted.clear()
        aborted = 0
        for gid, task in list(self.inflight.items()):
            slot = self.buffer.slots.get(gid)
            if slot is not None and self.sampler.should_abort_inflight(slot, self.version):
                task.cancel()
                aborted += 1
        self.counters["groups_aborted_stale"] += aborted
        if self.s.drain_before_refit and self.inflight:
            t0 = time.perf_counter()
            await asyncio.wait(list(self.inflight.values()))
            self.totals.add("drain_wait", time.perf_counter() - t0)
        if self.validation_pin is not None:
            t0 = time.perf_counter()
            await self.validation_pin.wait()
            self.totals.add("validation_pin_wait", time.perf_counter() - t0)
        t0 = time.perf_counter()
        if await self._wake_generation():
            step["generation_wake"] += time.perf_counter() - t0
        timing = await self._refit_weights(self.version, reset=self.s.reset_cache_after_refit)
        # The weight transfer alone (`refit` also holds the aborts, a drain, a validation's pin
        # and the cache reset), and how long generation stopped for it.
        step["refit_seconds"] += timing.seconds
        step["generation_pause_seconds"] += timing.generation_pause_seconds
        self.permitted.set()
        self.changed.fire()

    async def _sleep_generation(self, step: dict[str, float]) -> None:
        """With sleepWhileTraining, put the engines to sleep before the policy trains, if nothing
        generates: no group in flight or waiting to be dispatched, and no validation running (it
        generates too). Sync mode (which admission requires) has generated the whole step by its
        last chunk, so the engines sleep for at least that chunk and the step's update."""
        if not self.s.sleep_generation_while_training or self.generation_asleep:
            return
        validating = self.validation_task is not None and not self.validation_task.done()
        if self.inflight or self.pending or validating:
            return
        async with self.sleep_lock:
            t0 = time.perf_counter()
            self.generation_asleep = True  # before the await: a dispatch meanwhile waits to wake them
            await self.a.generation.sleep()
            step["generation_sleep"] += time.perf_counter() - t0
            self.counters["generation_sleeps"] += 1

    async def _wake_generation(self) -> bool:
        """Wake sleeping engines (before a refit, or a dispatch while the policy trains); whether
        they were asleep."""
        if not self.generation_asleep:
            return False
        async with self.sleep_lock:
            if not self.generation_asleep:
                return False
            await self.a.generation.wake()
            self.generation_asleep = False
            return True

    async def _refit_weights(self, version: int, *, reset: bool) -> RefitTiming:
        """Every engine loads `version`. An elastic fleet's engines join and leave here, with the
        dispatch gate closed (`fleet.Fleet.regroup`): one that joins gets these weights before its
        first group."""
        fleet = self.a.fleet
        if fleet is not None and fleet.regroup():
            self.a.weights.regroup()
        timing = await self.a.weights.sync(version)
        if reset:
            await self.a.generation.reset_cache()
        if fleet is not None:
            fleet.opened()
        self.gen_version = version
        return timing

    async def _after_step(self) -> None:
        step = self.version
        last = step >= self.s.max_steps
        if (self.s.val_period and step % self.s.val_period == 0) or (last and self.s.val_at_end):
            if self.validation_task is not None:
                await self.validation_task
            # Pinned before the task starts: no refit can slip in between.
            pin = self._pin_validation()
            self.validation_task = asyncio.create_task(self._validate(step, pin), name=f"validate-{step}")
        if step % self.s.checkpoint_every == 0 or last:
            t0 = time.perf_counter()
            await self._checkpoint(step)
            self.totals.add("checkpointing", time.perf_counter() - t0)

    def _pin_validation(self) -> asyncio.Event:
        """Hold the generation engines at their current weights until the validation about to
        start has generated its answers (`_refit` waits for the returned event)."""
        self.validation_pin = asyncio.Event()
        return self.validation_pin

    async def _validate(self, step: int, pin: asyncio.Event) -> None:
        """Greedy answers to the held-out prompts, scored by the environment, all generated by
        weight version `step`: both engines apply a refit between two decode steps of a running
        request, so the refits wait for `pin`, which is set once every answer is generated (the
        scoring runs after it); and the prefix caches are reset first, since they may hold prompt
        KV of older weights (the previous validation's, up to S versions old). An answer from any
        other version would be a broken pin: the run fails rather than report it as this step's."""
        version = self.gen_version
        t0 = time.perf_counter()
        run_seconds = t0 - self.t_start  # when these weights existed: time-to-accuracy's clock
        try:
            if not self.a.validation:
                return
            await self.a.generation.reset_cache()
            outs = await asyncio.gather(
                *(
                    self.a.rollout.answer(example, self.a.validation_params, i)
                    for i, example in enumerate(self.a.validation)
                )
            )
        finally:
            pin.set()
            if self.validation_pin is pin:
                self.validation_pin = None
        mixed = [i for i, o in enumerate(outs) if (o.oldest_version, o.last_version) != (version, version)]
        if mixed:
            o = outs[mixed[0]]
            raise RuntimeError(
                f"validation of step {step} was pinned to weights {version}, but {len(mixed)} held-out "
                f"answers came from other weights (prompt {mixed[0]}: versions {o.oldest_version} to "
                f"{o.last_version})"
            )
        samples = self.counters["samples_trained"]  # at `step`: later steps may finish meanwhile

        async def score(i: int, example: Example, out: Answer) -> Score | None:
            try:
                return (await self.a.rewards.score(example, [out.text], [out.finished]))[0]
            except RewardFailedError as exc:  # left out of the averages, as a dropped group is
                self.counters["validation_reward_failures"] += 1
                log.warning("validation prompt %d not scored: %s", i, exc)
                return None

        scored = await asyncio.gather(
            *(score(i, e, o) for i, (e, o) in enumerate(zip(self.a.validation, outs, strict=True)))
        )
        scores = [s for s in scored if s is not None]
        if not scores:
            return
        self.validation_reward = sum(s.reward for s in scores) / len(scores)
        self.validation_accuracy = sum(s.correct for s in scores) / len(scores)
        self.totals.add("validation", time.perf_counter() - t0)
        self._record(
            {
                "event": "validation",
                "step": step,
                "weight_version": version,
                "samples_trained": samples,
                "run_seconds": round(run_seconds, 3),
                "validation_reward": self.validation_reward,
                "validation_accuracy": self.validation_accuracy,
            }
        )

    async def _checkpoint(self, step: int) -> None:
        # Snapshot the controller synchronously (no await) so buffer, queue and loader agree.
        state = {
            "step": step,
            "batch_index": self.batch_index,
            "buffer": self.buffer.state_dict(),
            "pending": [(dataclasses.asdict(e), t) for e, t in self.pending],
            "loader": self.a.loader.state_dict(),
            "counters": dict(self.counters),
            "validation_reward": self.validation_reward,
            "validation_accuracy": self.validation_accuracy,
        }
        # The policy workers write their own files into the checkpoint's temporary directory (the
        # state never passes through this CPU-only process); state.pt and the rename come last.
        tmp = await asyncio.to_thread(checkpoint.begin, self.s.checkpoint_path, step)
        await self.a.policy.save(str(tmp))
        meta = {"model": self.a.model.to_json()}
        await asyncio.to_thread(
            checkpoint.commit, tmp, step, state, keep_last=self.s.checkpoint_keep, meta=meta
        )
        self.last_checkpoint_step = step
        self._record({"event": "checkpoint", "step": step})
        if step >= self.s.max_steps:
            final = await asyncio.to_thread(checkpoint.publish_final, self.s.checkpoint_path, step)
            if final is not None:
                self.exported = str(final)
                self._record({"event": "export", "step": step, "path": self.exported})

    # --- watchdog -------------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        last = (-1.0, -1)
        since = time.monotonic()
        while True:
            await asyncio.sleep(self.s.watchdog_interval_seconds)
            now = (
                self.counters["groups_committed"] + self.counters["groups_dropped_uninformative"],
                self.version,
            )
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > self.s.stall_timeout_seconds:
                pinned = (
                    "; the refit waits for a validation still generating its answers"
                    if self.validation_pin is not None
                    else ""
                )
                raise StallError(
                    f"no rollout committed and no step trained for {self.s.stall_timeout_seconds:g}s "
                    f"(step {self.version}, {len(self.inflight)} groups in flight, "
                    f"{len(self.buffer)} buffered{pinned})"
                )


@ray.remote(num_cpus=1, num_gpus=0)
class SingleControllerActor:
    """SingleController as a CPU-only Ray actor with one asyncio loop (async methods)."""

    def __init__(self, args: ControllerArgs) -> None:
        logging.basicConfig(level=args.settings.log_level)
        logging.getLogger().setLevel(args.settings.log_level)
        self.c = SingleController(args)

    @failures.reports_lost_workers
    async def run(self) -> dict[str, Any]:
        return await self.c.run()

    async def poll(self, since: int) -> dict[str, Any]:
        return self.c.poll(since)

    async def ping(self) -> bool:
        return True

    async def drain(self, pods: list[str]) -> None:
        self.c.drain(pods)

    async def stop(self) -> int:
        """Finish the step in progress, checkpoint it and end `run`; returns the step reached so far."""
        self.c.stop()
        return self.c.version
