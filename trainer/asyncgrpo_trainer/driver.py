"""The driver: parse the job, build everything, run the controller, report, exit with a code.

Setup order (nothing heavy is built inside the controller actor, which only receives built
objects): validate the job with asyncgrpo_api.rules (the webhook's rules) -> tokenizer and model
recipe, the data files, the reward function's check and the reward model's checkpoint
(`read_inputs`, no Ray needed) -> Ray -> placement groups -> policy (per `POLICY_BACKENDS`) and
generation worker groups (in parallel), the reward model's engine and reward workers -> data
loader -> replay buffer and sampler -> rollout manager -> weight synchronizer (its transport per
`rules.refit_transport`) -> restore the latest checkpoint if there is one -> SingleControllerActor.

Exit codes are the operator's contract (asyncgrpo_api.exitcodes, `exit_code`): 0 when training
finished; 3 when the model files are unusable (InvalidModelError); 4 when the data files or the
reward function the spec names are (InvalidDataError); both are found before any worker starts.
1 for any other training error (an exception in a pump, an invalid spec). The error is the last
line on stderr and the `error` of /progress, which keeps answering with the final state for
ASYNCGRPO_EXIT_GRACE_SECONDS (5 s) before the process exits. A driver killed by a signal is an
infrastructure failure the operator retries; the retry resumes from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray
import yaml

from asyncgrpo_api import exitcodes, outputs, ray_auth, rules
from asyncgrpo_api.v1alpha1 import DRIVER_PROGRESS_PORT, AsyncGRPOJob
from asyncgrpo_api.v1alpha1.runtime import CheckpointSpec
from asyncgrpo_trainer import (
    checkpoint,
    cluster,
    controller,
    data,
    durable_run,
    envs,
    failures,
    fleet,
    judge,
    megatron_workers,
    progress,
    reward_function,
    runlog,
    specmap,
    tracking,
    weights,
    workers,
)
from asyncgrpo_trainer import rewards as reward_workers
from asyncgrpo_trainer.backends import vllm_engine
from asyncgrpo_trainer.buffer import ReplayBuffer
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tokenizer import CharTokenizer, Tokenizer
from asyncgrpo_trainer.object_store import ObjectStoreRefusedError
from asyncgrpo_trainer.rollout import RolloutManager

log = logging.getLogger("asyncgrpo_trainer")
GRACE_ENV = "ASYNCGRPO_EXIT_GRACE_SECONDS"
POLL_SECONDS = 0.5


class SpecError(ValueError):
    """The job spec is invalid (schema or cross-field rules)."""


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A job file (YAML or JSON; the operator mounts JSON). A bare spec is wrapped into a job."""
    text = Path(path).read_text()
    raw = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping")
    if "spec" not in raw and "kind" not in raw:
        raw = {"apiVersion": "asyncgrpo.dev/v1alpha1", "kind": "AsyncGRPOJob", "spec": raw}
    return raw


def parse_job(manifest: dict[str, Any]) -> AsyncGRPOJob:
    """The validated job, or SpecError listing every finding (the webhook's own rules)."""
    report = rules.validate_manifest(manifest)
    for warning in report.warnings:
        log.warning("job spec: %s", warning)
    if report.errors or report.job is None:
        raise SpecError("invalid job spec: " + "; ".join(str(e) for e in report.errors))
    return report.job


@dataclass
class Built:
    args: controller.ControllerArgs
    pools: tuple[cluster.Pool, cluster.Pool]
    ready: list[Any]
    """Refs that resolve when every worker is up; the workers start in parallel."""
    data_warning: str | None = None
    """The rows of the data that were skipped (`data.Prompts.summary`), reported once."""


def load_prompts(job: AsyncGRPOJob, env: envs.Environment, tokenizer: Tokenizer) -> data.Prompts:
    """The job's prompts (InvalidDataError when its data is unusable); skipped rows are logged once."""
    d = job.spec.trainer.data
    prompts = data.load_prompts(
        env,
        tokenizer,
        train_path=d.train_path,
        validation_path=d.validation_path,
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        num_validation=d.num_validation_prompts,
        max_prompt_length=d.max_prompt_length,
        seed=job.spec.trainer.grpo.seed,
    )
    warning = prompts.summary(d.max_prompt_length)
    if warning is not None:
        log.warning("data: %s", warning)
    log.info("data: %d training and %d validation prompts", len(prompts.train), len(prompts.validation))
    return prompts


def check_supported(job: AsyncGRPOJob) -> None:
    """Reject, before anything starts, what the backends of this build cannot run."""
    if rules.generation_backend(job) == "vllm":
        vllm_engine.check_available(value=job.spec.trainer.generation.backend)


def _start_torch_policy(
    job: AsyncGRPOJob, pool: cluster.Pool, model: ModelBuild
) -> tuple[workers.PolicyGroup, list[Any]]:
    t = job.spec.trainer
    return workers.start_policy_group(
        pool,
        model,
        specmap.optim_config(t),
        specmap.loss_config(t),
        job.spec.cluster.policy_workers.gpus_per_replica,
        sharding=specmap.sharding(t),
        activation_checkpointing=t.policy.activation_checkpointing,
    )


def _start_megatron_policy(
    job: AsyncGRPOJob, pool: cluster.Pool, model: ModelBuild
) -> tuple[workers.PolicyGroup, list[Any]]:
    t = job.spec.trainer
    mp = t.policy.megatron
    return megatron_workers.start_megatron_policy_group(
        pool,
        model,
        specmap.optim_config(t),
        specmap.loss_config(t),
        job.spec.cluster.policy_workers.gpus_per_replica,
        tensor_parallel_size=mp.tensor_parallel_size,
        pipeline_parallel_size=mp.pipeline_parallel_size,
        context_parallel_size=mp.context_parallel_size,
    )


@dataclass(frozen=True)
class PolicyBackend:
    """How the driver starts one policy backend, and what its group can do."""

    start: Callable[[AsyncGRPOJob, cluster.Pool, ModelBuild], tuple[workers.PolicyGroup, list[Any]]]
    ranks_per_replica: Callable[[AsyncGRPOJob], int]
    """Actors per data-parallel replica (the model-parallel size; one GPU each)."""


def _megatron_model_parallel(job: AsyncGRPOJob) -> int:
    mp = job.spec.trainer.policy.megatron
    return mp.tensor_parallel_size * mp.pipeline_parallel_size * mp.context_parallel_size


POLICY_BACKENDS = {
    "torch": PolicyBackend(_start_torch_policy, lambda _: 1),
    "megatron": PolicyBackend(_start_megatron_policy, _megatron_model_parallel),
}
"""spec.trainer.policy.backend -> how to start it."""


def model_of(job: AsyncGRPOJob, env: envs.Environment) -> tuple[ModelBuild, Tokenizer]:
    """The model recipe and tokenizer: the checkpoint's own (read here once, so a bad checkpoint
    fails the driver before any worker starts) or the tiny model's character tokenizer; with
    policy.lora the recipe carries the adapters' config, which the policy and the engines read."""
    t = job.spec.trainer
    tokenizer: Tokenizer
    if t.model.source == "pretrained":
        assert t.model.path is not None  # the admission rules require it
        build, tokenizer = recipe.pretrained_build(
            t.model.path,
            max_sequence_length=t.model.max_sequence_length,
            dtype=t.model.dtype,
            seed=t.grpo.seed,
            chat_template=t.data.chat_template,
            system_prompt=t.data.system_prompt,
        )
    else:
        tokenizer = CharTokenizer(env.alphabet)
        build = specmap.tiny_recipe(t, tokenizer)
    return dataclasses.replace(build, lora=specmap.lora_config(t)), tokenizer


def generation_layout(job: AsyncGRPOJob, policy_ranks: int) -> tuple[int, int]:
    """(engines, GPUs per engine). Colocated: one engine next to each policy rank, on its GPU (the
    rules require generationWorkers.replicas 0 then). Otherwise one torch engine per GPU of the
    pool, or one vLLM engine per generation.tensorParallelSize GPUs; on CPU one per replica."""
    t, cl = job.spec.trainer, job.spec.cluster
    if t.generation.colocated:
        return policy_ranks, min(cl.policy_workers.gpus_per_replica, 1)
    pool = cl.generation_workers
    if pool.gpus_per_replica == 0:
        return max(pool.replicas, 1), 0
    per_engine = t.generation.tensor_parallel_size if rules.generation_backend(job) == "vllm" else 1
    return pool.replicas * rules.engines_per_replica(job), per_engine


@dataclass(frozen=True)
class Inputs:
    """What the job's files give: the model recipe, its tokenizer and the prompts."""

    model: ModelBuild
    tokenizer: Tokenizer
    prompts: data.Prompts
    env: envs.Environment
    """The environment (env.name or env.class): a multi-turn one answers the policy's turns."""
    judge: judge.Judge | None = None
    """The reward model's checkpoint (rewardModel), read like the policy's."""


def read_inputs(job: AsyncGRPOJob) -> Inputs:
    """The model, tokenizer and data files, a check (in a child process) that env.function loads, and
    the reward model's checkpoint: all that only the files can show to be wrong (InvalidModelError,
    InvalidDataError). No Ray is
    needed, so `execute` calls it before Ray starts and such a job fails in seconds, whatever the
    state of the cluster."""
    check_supported(job)
    t = job.spec.trainer
    env = envs.build(t.env.name, t.env.env_class)
    specmap.conversations(t, env)  # InvalidDataError: turn settings of a single-turn env.class
    model, tokenizer = model_of(job, env)
    prompts = load_prompts(job, env, tokenizer)
    if t.env.function is not None:
        reward_function.check(t.env.function, t.env.function_scope)
    judged = judge.read(t.reward_model, t.grpo.seed) if t.reward_model is not None else None
    return Inputs(model, tokenizer, prompts, env, judged)


def build(job: AsyncGRPOJob, inputs: Inputs | None = None) -> Built:
    """Every object the controller needs, built here in the driver (see the module docstring)."""
    inputs = inputs if inputs is not None else read_inputs(job)
    model, tokenizer, prompts = inputs.model, inputs.tokenizer, inputs.prompts
    t, cl = job.spec.trainer, job.spec.cluster
    backend = POLICY_BACKENDS[t.policy.backend]
    policy_ranks = rules.policy_data_parallel_size(job) * backend.ranks_per_replica(job)
    gen_ranks, gen_gpus = generation_layout(job, policy_ranks)
    pools = cluster.build_pools(
        policy_ranks=policy_ranks,
        policy_gpus=min(cl.policy_workers.gpus_per_replica, 1),
        generation_ranks=gen_ranks,
        generation_gpus=gen_gpus,
        colocated=t.generation.colocated,
        name=job.metadata.name or "asyncgrpo",
    )
    try:
        policy_group, policy_ready = backend.start(job, pools[0], model)
        engine = workers.EngineSpec(
            model,
            gen_gpus,
            max_prefix_age=t.async_rl.max_staleness_versions,
            torch_decode=t.generation.torch_decode,
            vllm=specmap.vllm_options(t) if rules.generation_backend(job) == "vllm" else None,
        )
        generation_group, generation_ready = workers.start_generation_group(pools[1], engine)
        reward_model, judge_ready = judge.start(inputs.judge) if inputs.judge is not None else (None, None)
        rewards = reward_workers.RewardPool(
            t.env.name,
            t.env.function,
            t.env.num_workers,
            t.env.timeout_seconds,
            score_truncated=t.env.score_truncated,
            env_class=t.env.env_class,
            function_scope=t.env.function_scope,
            reward_model=reward_model,
        )
        rollout = RolloutManager(
            generation_group,
            rewards,
            tokenizer,
            specmap.sampling_params(t),
            num_generations=t.grpo.num_generations_per_prompt,
            timeout_seconds=t.async_rl.rollout_timeout_seconds,
            max_attempts=t.async_rl.max_rollout_attempts,
            seed=t.grpo.seed,
            overlong=specmap.overlong_penalty(t),
            conversations=specmap.conversations(t, inputs.env),
        )
        args = controller.ControllerArgs(
            settings=dataclasses.replace(specmap.settings(job), attempt=runlog.attempt_from_env()),
            policy=policy_group,
            generation=generation_group,
            rewards=rewards,
            rollout=rollout,
            weights=weights.build(
                t.weight_sync, policy_group, generation_group, transport=rules.refit_transport(job)
            ),
            loader=data.PromptLoader(
                prompts.train, t.grpo.num_prompts_per_step, t.grpo.seed, shuffle=t.data.shuffle
            ),
            validation=prompts.validation,
            buffer=ReplayBuffer(),
            sampler=specmap.sampler_of(t),
            tokenizer=tokenizer,
            validation_params=specmap.sampling_params(t, greedy=True),
            model=model,
            fleet=elastic_fleet(job, generation_group, engine),
        )
        return Built(
            args,
            pools,
            [*policy_ready, *generation_ready, *rewards.ready(), *([judge_ready] if judge_ready else [])],
            prompts.summary(t.data.max_prompt_length),
        )
    except BaseException:
        cluster.release(*pools)  # the workers started so far die with this driver
        raise


def elastic_fleet(
    job: AsyncGRPOJob, group: workers.GenerationGroup, engine: workers.EngineSpec
) -> fleet.Fleet | None:
    """An elastic generation pool's joins and drains (`fleet`): as many engines per pod as start
    on each (`rules.engines_per_replica`), up to maxReplicas' worth; None for a fixed pool."""
    pool = job.spec.cluster.generation_workers
    if not pool.elastic or job.spec.trainer.generation.colocated:
        return None
    per_pod = rules.engines_per_replica(job)
    return fleet.Fleet(group, engine, engines_per_node=per_pod, max_engines=pool.most * per_pod)


USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"


RAY_START_SECONDS = 300.0
"""How long a Ray node started here may take, over its attempts: Ray gives one attempt a fixed 30 s
(Ray 2.60's node.py) after its processes are up, and on a 2-core machine at load 10 one start took
46 s in all, at load 20-25 each attempt took about 75 s and none came up within three
(docs/benchmarks.md, "Ray's start under load")."""
RAY_START_TIMED_OUT = "timed out during startup"
"""Ray's words when the node it starts here is not up within its fixed 30 s (Ray 2.60's node.py)."""


def init_ray(**options: Any) -> None:
    """ray.init with Ray's usage-stats reporting off unless the user set RAY_USAGE_STATS_ENABLED:
    the product runs in offline clusters, where a phone-home is at best a timeout. (Set in the
    environment, so the Ray processes started here inherit it.)

    A Ray node started here that is not up within Ray's fixed 30 s is started again, for up to
    RAY_START_SECONDS in all, each slow start reported as a warning with the machine's load: on a
    busy 2-core machine (load 17-50 in a clean-clone CI run) the raylet's agents took longer, and
    the whole job failed before its first step. The processes a timed-out attempt started (its GCS
    server, raylet and agents, which Ray leaves running when its node fails to come up) are stopped
    first, so that the next attempt does not compete with them for the CPU."""
    os.environ.setdefault(USAGE_STATS_ENV, "0")
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        before = _child_pids()
        try:
            ray.init(**options)
            return
        except Exception as exc:  # Ray raises a bare Exception for a node that did not come up
            elapsed = time.monotonic() - started
            if RAY_START_TIMED_OUT not in str(exc) or elapsed >= RAY_START_SECONDS:
                raise
            log.warning("Ray's node did not start within Ray's 30 s (attempt %d, %.0f s so far, load %.1f); "
                        "starting it again", attempt, elapsed, os.getloadavg()[0])  # fmt: skip
            ray.shutdown()
            _stop(_child_pids() - before)


def _child_pids() -> set[int]:
    """This process's descendants now."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _stop(pids: set[int]) -> None:
    """Kill these processes and wait for them (a process gone already is skipped)."""
    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            process.kill()
            processes.append(process)
    psutil.wait_procs(processes, timeout=10)


def resume_state(path: str) -> tuple[controller.ResumeState, Path] | None:
    """The controller's state of the newest checkpoint under `path`, and its step directory, from
    which the policy workers read their own files (`workers.PolicyGroup.load`)."""
    step = checkpoint.latest(path)
    if step is None:
        return None
    payload = checkpoint.load(path, step)
    state = controller.ResumeState(
        step=payload["step"],
        batch_index=payload["batch_index"],
        buffer=payload["buffer"],
        pending=payload["pending"],
        loader=payload["loader"],
        counters=payload["counters"],
        validation_reward=payload["validation_reward"],
        validation_accuracy=payload["validation_accuracy"],
    )
    return state, checkpoint.step_dir(Path(path), step)


def supervise(
    actor: Any,
    server: progress.ProgressServer | None,
    *,
    stall_seconds: float,
    reporters: Sequence[progress.Reporter] = (),
) -> dict[str, Any]:
    """Wait for the controller, relaying its step records and progress; returns its summary."""
    try:
        return _supervise(actor, server, stall_seconds, reporters)
    finally:
        for reporter in reporters:
            reporter.end()


def _supervise(
    actor: Any,
    server: progress.ProgressServer | None,
    stall_seconds: float,
    reporters: Sequence[progress.Reporter],
) -> dict[str, Any]:
    run_ref = actor.run.remote()
    since = drains = 0
    last_answer = time.monotonic()
    while True:
        ready, _ = ray.wait([run_ref], timeout=POLL_SECONDS)
        if server is not None and (pods := server.drain_requests(drains)):
            actor.drain.remote(pods)  # the operator's drain requests (POST /drain), each once
            drains += len(pods)
        try:
            poll = ray.get(actor.poll.remote(since), timeout=max(stall_seconds, 1.0))
            last_answer = time.monotonic()
        except ray.exceptions.GetTimeoutError:
            if time.monotonic() - last_answer > stall_seconds:
                raise controller.StallError(
                    f"the controller's event loop did not answer for {stall_seconds:g}s"
                ) from None
            poll = None
        except ray.exceptions.RayError:
            poll = None  # the actor died; run_ref carries the reason
        if poll is not None:
            since += len(poll["records"])
            prog = poll["progress"]
            if server is not None:
                server.update(
                    **{k: v for k, v in prog.items() if k not in ("state", "error")},
                    state="running" if prog["state"] == "starting" else prog["state"],
                )
            for reporter in reporters:
                reporter.update(prog, poll["records"])
        if ready:
            summary: dict[str, Any] = ray.get(run_ref)
            return summary


def exit_code(exc: BaseException) -> int:
    """The driver's exit code for a failed run (`asyncgrpo_api.exitcodes`: what the operator retries)."""
    if isinstance(_cause(exc), InvalidModelError) or _creation_raised(exc, InvalidModelError):
        return exitcodes.INVALID_MODEL
    if isinstance(exc, ObjectStoreRefusedError):
        return exitcodes.OBJECT_STORE_REFUSED
    if failures.lost_ray_worker(exc):
        return exitcodes.RAY_WORKER_LOST
    if isinstance(_cause(exc), InvalidDataError):
        return exitcodes.INVALID_DATA
    return exitcodes.TRAINING_ERROR


def _creation_raised(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `exc` is an actor that died because its constructor raised `kind` (a vLLM engine that
    refused the checkpoint): Ray keeps only the text of a creation task's error."""
    return (
        isinstance(exc, ray.exceptions.RayActorError)
        and bool(getattr(exc, "_actor_init_failed", False))
        and kind.__name__ in str(exc)
    )


def _cause(exc: BaseException) -> BaseException:
    """The original exception of a Ray task error (what a worker raised), else `exc`."""
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, BaseException):
        return _cause(exc.cause)
    return exc


def error_text(exc: BaseException) -> str:
    """The user-facing error: the original exception of a Ray task, without Ray's wrapping."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        if cause is not None and not isinstance(cause, ray.exceptions.RayTaskError):
            return f"{type(cause).__name__}: {cause}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def execute(
    manifest: dict[str, Any],
    server: progress.ProgressServer | None = None,
    *,
    reporters: Sequence[progress.Reporter] = (),
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Validate, build, restore, run the controller and tear down; the run summary, or raise.
    With spec.storage.objectStore the newest durable checkpoint is restored first and the run's
    checkpoints and logs are copied to the store as it goes (`durable_run`)."""
    job = parse_job(manifest)

    def durable(step: int) -> None:
        if server is not None:
            server.update(durable_checkpoint_step=step)

    with durable_run.durable_storage(job, runlog.attempt_from_env(), durable):
        return _execute(job, server, reporters=reporters, ray_address=ray_address)


def _execute(
    job: AsyncGRPOJob,
    server: progress.ProgressServer | None,
    *,
    reporters: Sequence[progress.Reporter],
    ray_address: str | None,
) -> dict[str, Any]:
    t = job.spec.trainer
    logging.getLogger("asyncgrpo_trainer").setLevel(t.log_level)
    if server is not None:
        # A resumed attempt reports its checkpoint's step from the start, so the job's status (and
        # `kubectl get agj`) does not show step 0 while the workers start.
        resumed_at = checkpoint.latest(job.spec.checkpoint.path)
        server.update(
            max_steps=t.grpo.max_num_steps,
            state="starting",
            step=resumed_at or 0,
            policy_version=resumed_at or 0,
            last_checkpoint_step=resumed_at,
        )
    # The spec, then the files: an invalid spec, model or data set fails without a cluster.
    inputs = read_inputs(job)
    if not ray.is_initialized():
        init_ray(address=ray_address, include_dashboard=False, logging_level=logging.WARNING)
    built = build(job, inputs)
    if server is not None:
        server.update(data_warning=built.data_warning)
    try:
        resume = resume_state(job.spec.checkpoint.path)
        if resume is not None:
            built.args.resume = resume[0]
            log.info("resuming from the checkpoint of step %d", resume[0].step)
        # The controller process starts while the workers finish starting.
        actor = controller.SingleControllerActor.options(**_controller_placement(job)).remote(  # type: ignore[attr-defined]
            built.args
        )
        curves = tracking.open_curves(
            job.spec.checkpoint.path,
            job_name=job.metadata.name or "asyncgrpo",
            config=job.spec.trainer.model_dump(mode="json", by_alias=True),
            resumed_step=None if resume is None else resume[0].step,
        )
        try:
            ray.get(built.ready)
            if resume is not None:
                asyncio.run(built.args.policy.load(str(resume[1])))
            with _stop_on_sigterm(actor):
                return supervise(
                    actor,
                    server,
                    stall_seconds=t.async_rl.stall_timeout_seconds,
                    reporters=[*reporters, curves],
                )
        finally:
            curves.close()
            ray.kill(actor, no_restart=True)
    finally:
        _teardown(built)


HEAD_NODE_RESOURCE = "node:__internal_head__"
"""Ray's resource of the head node (the driver's pod)."""


def _controller_placement(job: AsyncGRPOJob) -> dict[str, Any]:
    """With spec.storage.objectStore the controller runs on the head, beside the driver: it writes
    the checkpoints (state.pt, and the policy files workers could not write on a volume they do not
    share) into checkpoint.path, where the driver's mirror must see them to upload them."""
    if job.spec.storage.object_store is None:
        return {}
    return {"resources": {HEAD_NODE_RESOURCE: 0.001}}


@contextlib.contextmanager
def _stop_on_sigterm(actor: Any) -> Iterator[None]:
    """While the controller runs, SIGTERM (the pod is deleted: a Kueue preemption, a suspend, a
    drain) asks it to finish the step in progress and checkpoint it, within the pod's
    terminationGracePeriodSeconds; the driver then exits 128+15 (`run_job`). Main thread only
    (Python delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: stopping after the step in progress, with a checkpoint of it")
        actor.stop.remote()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


STOPPED_EXIT_CODE = 128 + signal.SIGTERM
"""A run stopped by SIGTERM exits as if killed by it: the operator counts a stop it did not cause
(a drain) as an infrastructure failure and retries it from the checkpoint just written."""


def run_job(
    manifest: dict[str, Any],
    *,
    server: progress.ProgressServer | None,
    grace_seconds: float | None = None,
    reporters: Sequence[progress.Reporter] = (),
    ray_address: str | None = None,
) -> int:
    """Run one job to completion in the current Ray cluster; the process exit code. `server`
    answers /progress until the end (the grace period after it) and is closed here."""
    code, error = 0, None
    try:
        summary = execute(manifest, server, reporters=reporters, ray_address=ray_address)
        if summary.get("stopped"):
            code = STOPPED_EXIT_CODE
            print(
                f"asyncgrpo: stopped by SIGTERM after step {summary['steps']}, which is checkpointed; "
                "a resumed run continues after it",
                file=sys.stderr,
                flush=True,
            )
        if server is not None:
            server.update(state="stopped" if code else "succeeded")
        for reporter in reporters:
            reporter.summary(summary)
    except Exception as exc:
        code = exit_code(exc)
        error = error_text(exc)
        log.debug("training failed", exc_info=True)
        if server is not None:
            server.update(state="failed", error=error)
    if error is not None:
        sys.stderr.flush()
        print(f"asyncgrpo: training failed: {error}", file=sys.stderr, flush=True)
        _write_termination_message(f"asyncgrpo: training failed: {error}")
    if server is not None:
        grace = float(os.environ.get(GRACE_ENV, "5")) if grace_seconds is None else grace_seconds
        time.sleep(grace)
        server.close()
    return code


TERMINATION_MESSAGE_ENV = "ASYNCGRPO_TERMINATION_MESSAGE_PATH"
"""Where the kubelet reads the container's termination message (set by the operator's pod spec)."""


def _write_termination_message(text: str) -> None:
    """Leave the error where Kubernetes reports it, so Ray's shutdown output that follows it in
    the log cannot push it out of the failed job's status message."""
    path = os.environ.get(TERMINATION_MESSAGE_ENV)
    if not path:
        return
    try:
        Path(path).write_text(text[-4096:])
    except OSError:
        log.warning("could not write the termination message to %s", path, exc_info=True)


def _teardown(built: Built) -> None:
    a = built.args
    try:
        workers.kill(a.policy, a.generation, a.rewards)
        cluster.release(*built.pools)
    except Exception:  # teardown must not mask the run's own outcome
        log.warning("teardown failed", exc_info=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--job-spec", required=True, help="AsyncGRPOJob manifest or spec (YAML or JSON)")
    parser.add_argument(
        "--progress-port",
        type=int,
        default=DRIVER_PROGRESS_PORT,
        help="port of /progress and /metrics (0 picks a free one)",
    )
    parser.add_argument(
        "--ray-address", default=None, help="Ray cluster to join (default: RAY_ADDRESS or local)"
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        manifest = read_manifest(ns.job_spec)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"asyncgrpo: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    stop_tee = _log_to_checkpoint_volume(manifest)
    try:
        # The job's Ray token (its Secret, in the pod's environment) guards /progress as it guards Ray.
        server = progress.ProgressServer(ns.progress_port, token=os.environ.get(ray_auth.TOKEN_ENV) or None)
        log.info("progress on http://0.0.0.0:%d/progress", server.port)
        return run_job(
            manifest, server=server, reporters=[progress.JsonLines(sys.stdout)], ray_address=ns.ray_address
        )
    finally:
        if stop_tee is not None:
            stop_tee()
            # The run's verdict (its summary, `training failed: ...`, `stopped by SIGTERM ...`) is
            # written after the checkpoint mirror's last upload: without this, the log a user reads
            # from the store once the pods are gone would end before the line that says how it ended.
            job = rules.validate_manifest(manifest).job
            if job is not None:
                durable_run.upload_driver_log(job, runlog.attempt_from_env())


def _log_to_checkpoint_volume(manifest: dict[str, Any]) -> Callable[[], None] | None:
    """Copy the driver's output into <checkpoint.path>/logs/driver-attempt-<N>.log, so it outlives
    the pod; a path that cannot be written costs that copy (a warning), not the run."""
    spec = manifest.get("spec", manifest)
    ckpt = spec.get("checkpoint") if isinstance(spec, dict) else None
    path = ckpt.get("path") if isinstance(ckpt, dict) else None
    target = Path(outputs.driver_log(str(path or CheckpointSpec().path), runlog.attempt_from_env()))
    try:
        stop = runlog.tee_output(target)
    except OSError as exc:
        log.warning("the driver's log is not copied to %s: %s", target, exc)
        return None
    log.info("the driver's log is copied to %s", target)
    return stop
