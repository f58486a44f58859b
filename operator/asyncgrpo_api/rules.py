"""Validation of AsyncGRPOJob manifests: schema errors plus the cross-field invariants.

One function, `validate_manifest`, is what the admission webhook, `asyncgrpo validate` and the
trainer all call, so a job is judged the same way everywhere. Every finding names the field path
as the user wrote it (camelCase, with list indices) and says how to fix it. Errors reject the job;
warnings accept it and are shown to the user (admission warnings, CLI output).

The invariants CEL can express are a table in invariants.py, which the chart's
ValidatingAdmissionPolicy is generated from (admissionpolicy.py); the rules here are the others.
The async_rl invariants (P = numPromptsPerStep, N = numGenerationsPerPrompt,
S = maxStalenessVersions) and why they exist are documented in docs/guides/async-modes.md.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from asyncgrpo_api import invariants, quantity, ray_auth
from asyncgrpo_api.naming import MAX_RAYCLUSTER_NAME_LENGTH, raycluster_name
from asyncgrpo_api.object_store_rules import object_store_problems
from asyncgrpo_api.v1alpha1 import API_VERSION, KIND, AsyncGRPOJob, podtemplate
from asyncgrpo_api.v1alpha1.job import KUEUE_QUEUE_LABEL, MULTIKUEUE, PREBUILT_WORKLOAD_LABEL
from asyncgrpo_api.v1alpha1.placement import GPU_RESOURCE, Autoscaling, Resources, WorkerGroup
from asyncgrpo_api.v1alpha1.trainer import DataSpec, MegatronSpec, TinyModelSpec, TrainerSpec

TRAINER = "spec.trainer"
ASYNC_RL = f"{TRAINER}.asyncRL"


@dataclass(frozen=True)
class Finding:
    """One problem (or warning) with a job, anchored at a field path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class Report:
    """The outcome of validating one manifest."""

    job: AsyncGRPOJob | None
    """The job when it is accepted (schema and every rule)."""
    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    parsed: AsyncGRPOJob | None = None
    """The job when the schema accepts it, even if a cross-field rule does not: the operator keeps
    running a started job under the rules it was admitted with (docs/guides/job-lifecycle.md)."""

    @property
    def ok(self) -> bool:
        """Whether the job is accepted."""
        return not self.errors


def validate_manifest(manifest: Mapping[str, Any]) -> Report:
    """Parse a manifest (a dict from YAML or an admission request) and check every rule."""
    envelope = list(_envelope_errors(manifest))
    if envelope:
        return Report(job=None, errors=tuple(envelope), warnings=())
    try:
        # Strict, through JSON, as the API server decodes it: "60" is not an integer and false is
        # not a number there, while timestamps arrive as strings.
        document = json.dumps(without_pruned_nulls(manifest, AsyncGRPOJob), default=str)
        job = AsyncGRPOJob.model_validate_json(document, strict=True)
    except ValidationError as exc:
        return Report(job=None, errors=tuple(_schema_findings(exc)), warnings=())
    errors, warnings = check_rules(job)
    return Report(job=job if not errors else None, errors=errors, warnings=warnings, parsed=job)


def check_rules(job: AsyncGRPOJob) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """The cross-field invariants of a schema-valid job: (errors, warnings)."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for rule in _ERROR_RULES:
        errors.extend(rule(job))
    for rule in _WARNING_RULES:
        warnings.extend(rule(job))
    return tuple(errors), tuple(warnings)


# --- envelope and schema -------------------------------------------------------------------------


def without_pruned_nulls(value: Any, model: type[BaseModel]) -> Any:
    """Drop `field: null` where the API server would: it prunes nulls of non-nullable fields and
    applies their defaults, so `cluster:` (an empty YAML value) means "use the defaults".

    Optional fields with a non-None default are nullable in the CRD: there null is kept and means
    unset-on-purpose (e.g. startupDeadlineSeconds: null waits forever).
    """
    if not isinstance(value, Mapping):
        return value
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    out: dict[Any, Any] = {}
    for key, item in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        # Unknown keys keep their null, so they are still refused as unknown, as kubectl does.
        keeps_null = field is None or (_nullable(field.annotation) and field.default is not None)
        if item is None and not keeps_null:
            continue
        child = _model_of(field.annotation) if field is not None else None
        out[key] = _prune_child(item, child)
    return out


def _prune_child(item: Any, child: type[BaseModel] | None) -> Any:
    if child is None:
        return item
    if isinstance(item, Mapping):
        return without_pruned_nulls(item, child)
    if isinstance(item, list):
        return [without_pruned_nulls(i, child) for i in item]
    return item


def _nullable(annotation: Any) -> bool:
    return type(None) in getattr(annotation, "__args__", ())


def _envelope_errors(manifest: Mapping[str, Any]) -> Iterator[Finding]:
    if not isinstance(manifest, Mapping):
        yield Finding(
            "(document)", f"expected a mapping (an AsyncGRPOJob object), got {type(manifest).__name__}"
        )
        return
    if manifest.get("apiVersion") != API_VERSION:
        yield Finding("apiVersion", f"must be {API_VERSION}; got {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != KIND:
        yield Finding("kind", f"must be {KIND}; got {manifest.get('kind')!r}")
    if "spec" not in manifest:
        yield Finding("spec", "is required: an AsyncGRPOJob needs at least spec.image")


def _schema_findings(exc: ValidationError) -> Iterator[Finding]:
    for error in exc.errors():
        loc = error["loc"]
        path = format_path(loc)
        if error["type"] == "extra_forbidden":
            yield Finding(path, _unknown_field_message(loc))
        elif error["type"] == "missing":
            yield Finding(path, "is required")
        elif error["type"] == podtemplate.ERROR_TYPE:
            for problem in (error.get("ctx") or {}).get("problems", []):
                field, _, why = str(problem).partition(": ")
                yield Finding(f"{path}.{field}", why)
        else:
            got = error.get("input")
            shown = "" if isinstance(got, dict | list) else f"; got {got!r}"
            yield Finding(path, f"{_lower_first(error['msg'])}{shown}")


def format_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'secrets', 0, 'name') -> 'spec.secrets[0].name'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "union[", "literal[")) or part in {"str", "int", "float", "bool"}:
            continue
        else:
            out += f".{part}" if out else part
    return out or "(document)"


def _unknown_field_message(loc: tuple[int | str, ...]) -> str:
    """Suggest the closest known field name for a misspelt key."""
    known = _known_fields(loc[:-1])
    name = str(loc[-1])
    hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if hint:
        return f"unknown field; did you mean {hint[0]!r}?"
    return "unknown field; remove it" + (f" (known fields: {', '.join(sorted(known))})" if known else "")


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] | None = AsyncGRPOJob
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in {f.alias or n, n}), None)
        model = _model_of(field.annotation) if field else None
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# --- the invariants CEL can express (invariants.py; the chart's ValidatingAdmissionPolicy too) ---


def _invariants(job: AsyncGRPOJob) -> Iterator[Finding]:
    spec = job.spec.model_dump(mode="json", by_alias=True)
    for invariant, message in invariants.violations(spec):
        yield Finding(invariant.path, message)


# --- batch arithmetic over the policy pool ---------------------------------------------------------


def _batch_divides(job: AsyncGRPOJob) -> Iterator[Finding]:
    trainer = job.spec.trainer
    gbs = trainer.train_global_batch_size
    micro = trainer.policy.train_micro_batch_size
    ranks = policy_data_parallel_size(job)
    if trainer.samples_per_step % gbs:
        return  # invariants.py's globalBatchNotADivisor reports it
    if gbs == trainer.samples_per_step:
        field, what = f"{TRAINER}.grpo.numPromptsPerStep", "numPromptsPerStep x numGenerationsPerPrompt"
    else:
        field, what = f"{TRAINER}.policy.trainGlobalBatchSize", "policy.trainGlobalBatchSize"
    if gbs % ranks:
        yield Finding(
            field,
            f"{what} = {gbs} samples must split evenly over the {ranks} data-parallel policy ranks; "
            "change the batch or the policy pool size",
        )
    elif (gbs // ranks) % micro and trainer.policy.max_tokens_per_micro_batch is None:  # packed: by tokens
        yield Finding(
            f"{TRAINER}.policy.trainMicroBatchSize",
            f"must divide the per-rank batch ({what} = {gbs} samples / {ranks} ranks = {gbs // ranks}); "
            f"got {micro}",
        )


def _truncation_bounds(job: AsyncGRPOJob) -> Iterator[Finding]:
    """The truncation window of icepop and seq-mask-tis (NeMo-RL refuses the same). Not in
    invariants.py: truncatedImportanceSamplingRatio is nullable, and CEL implementations disagree
    on comparisons with null."""
    loss = job.spec.trainer.loss
    path = f"{TRAINER}.loss"
    kind = loss.truncated_importance_sampling_type
    hi, lo = loss.truncated_importance_sampling_ratio, loss.truncated_importance_sampling_ratio_min
    if kind != "tis" and (hi is None or lo is None):
        missing = " and ".join(
            name
            for name, value in (
                ("truncatedImportanceSamplingRatioMin", lo),
                ("truncatedImportanceSamplingRatio", hi),
            )
            if value is None
        )
        yield Finding(
            f"{path}.truncatedImportanceSamplingType",
            f"{kind} masks weights outside [truncatedImportanceSamplingRatioMin, "
            f"truncatedImportanceSamplingRatio], so both bounds are needed; set {missing} (NeMo-RL uses "
            "0.5 and 5 for icepop, 0.999 and 1.002 for seq-mask-tis) or use tis",
        )
    if hi is not None and lo is not None and lo > hi:
        yield Finding(
            f"{path}.truncatedImportanceSamplingRatioMin",
            f"must be at most truncatedImportanceSamplingRatio ({hi}); got {lo}",
        )


def _inflight_within_buffer(job: AsyncGRPOJob) -> Iterator[Finding]:
    trainer = job.spec.trainer
    cap = trainer.async_rl.max_inflight_prompts
    if cap is not None and cap > trainer.max_buffered_rollouts:
        yield Finding(
            f"{ASYNC_RL}.maxInflightPrompts",
            f"is above maxBufferedRollouts ({trainer.max_buffered_rollouts}), which already bounds the "
            f"groups in flight; it has no effect above {trainer.max_buffered_rollouts}",
        )


def _elastic_fleet(job: AsyncGRPOJob) -> Iterator[Finding]:
    """An elastic generation fleet (minReplicas, maxReplicas; min <= replicas <= max is an invariant)
    against its pool, the staleness bound and Kueue."""
    pool, trainer = job.spec.cluster.generation_workers, job.spec.trainer
    path = "spec.cluster.generationWorkers"
    named = (("minReplicas", pool.min_replicas), ("maxReplicas", pool.max_replicas))
    bounds = [(name, value) for name, value in named if value is not None]
    if trainer.generation.colocated:
        for name, value in bounds:
            yield Finding(
                f"{path}.{name}",
                f"({value}) must be unset when generation.colocated is true: generation then runs on the "
                "policy workers, one engine per policy rank; remove it or set colocated: false",
            )
        return
    if not pool.elastic:
        return
    field = f"{path}.maxReplicas" if pool.most != pool.replicas else f"{path}.minReplicas"
    if job.kueue_queue_name is not None:
        yield Finding(
            field,
            f"makes the generation fleet elastic ({pool.fewest} to {pool.most} workers), but Kueue queues "
            f"this job and admits a fixed number of pods: growing would use quota Kueue never granted. "
            f"Set minReplicas and maxReplicas to replicas ({pool.replicas}) or remove them, or do not "
            f"queue the job in Kueue",
        )
    per_replica = max(engines_per_replica(job), 1)
    engines, inflight = pool.most * per_replica, trainer.max_inflight_prompts
    if engines > inflight:
        yield Finding(
            f"{path}.maxReplicas",
            f"({pool.most}) would run {engines} generation engines, but the staleness bound lets at most "
            f"{inflight} prompt groups be in flight (asyncRL.maxInflightPrompts, default maxBufferedRollouts "
            f"= numPromptsPerStep x (maxStalenessVersions + 1)): the engines beyond it would never get a "
            f"group. Lower maxReplicas to {max(inflight // per_replica, 1)} or raise the bound",
        )


def engines_per_replica(job: AsyncGRPOJob) -> int:
    """Generation engines per generation worker pod: one per GPU (per tensorParallelSize GPUs with
    vLLM), one on a CPU pod."""
    pool = job.spec.cluster.generation_workers
    if pool.gpus_per_replica == 0:
        return 1
    per_engine = job.spec.trainer.generation.tensor_parallel_size if generation_backend(job) == "vllm" else 1
    return pool.gpus_per_replica // per_engine


# --- data ----------------------------------------------------------------------------------------


def _warn_unread_data_settings(job: AsyncGRPOJob) -> Iterator[Finding]:
    data = job.spec.trainer.data
    if data.validation_path is not None and data.num_validation_prompts == 0:
        yield Finding(
            f"{TRAINER}.data.validationPath",
            "is not read while data.numValidationPrompts is 0; set validation prompts or remove it",
        )
    if data.train_path is None and data.validation_path is None:
        defaults = DataSpec()
        for field, value, default in (
            ("promptKey", data.prompt_key, defaults.prompt_key),
            ("answerKey", data.answer_key, defaults.answer_key),
        ):
            if value != default:
                yield Finding(
                    f"{TRAINER}.data.{field}",
                    "is ignored without data.trainPath or data.validationPath (the built-in prompts are "
                    "used); set a data file or remove it",
                )


# --- GPU layout ----------------------------------------------------------------------------------


def policy_data_parallel_size(job: AsyncGRPOJob) -> int:
    """Data-parallel ranks of the policy: one per GPU (or per worker pod on CPU), over model parallelism."""
    pool = job.spec.cluster.policy_workers
    ranks = pool.total_gpus if pool.gpus_per_replica else max(pool.replicas, 1)
    policy = job.spec.trainer.policy
    if policy.backend == "megatron":
        mp = policy.megatron
        ranks //= max(mp.tensor_parallel_size * mp.pipeline_parallel_size * mp.context_parallel_size, 1)
    return max(ranks, 1)


RefitTransport = Literal["broadcast", "cuda-ipc", "object-store"]


def on_gpus(job: AsyncGRPOJob) -> bool:
    """Whether the policy and the generation engines run on GPUs (the engines on their own GPU pool,
    or colocated on the policy's GPUs)."""
    cl = job.spec.cluster
    return cl.policy_workers.gpus_per_replica > 0 and (
        job.spec.trainer.generation.colocated or cl.generation_workers.gpus_per_replica > 0
    )


def refit_transport(job: AsyncGRPOJob) -> RefitTransport:
    """What weightSync.transport runs for this job (the trainer builds it; the warnings name what it
    ignores). auto: the broadcast between separate GPU pools, CUDA IPC between a torch policy rank
    and the engine colocated on its GPU, else the object store; with policy.lora always the object
    store (a refit is the adapters, a few MB: `_lora_supported`); nccl: the broadcast (over gloo on
    CPU); cuda-ipc and object-store: themselves. The layout rules refuse nccl and cuda-ipc where
    they cannot connect."""
    trainer = job.spec.trainer
    transport, colocated = trainer.weight_sync.transport, trainer.generation.colocated
    if transport == "object-store" or (transport == "auto" and trainer.policy.lora is not None):
        return "object-store"
    if transport == "nccl":
        return "broadcast"
    gpus = on_gpus(job)
    if transport == "cuda-ipc" or (gpus and colocated and trainer.policy.backend == "torch"):
        return "cuda-ipc"
    return "broadcast" if gpus and not colocated else "object-store"


GenerationBackend = Literal["torch", "vllm"]


def generation_has_gpus(job: AsyncGRPOJob) -> bool:
    """Whether the pool that serves generation has GPUs: the policy pool when colocated."""
    cluster, colocated = job.spec.cluster, job.spec.trainer.generation.colocated
    serving = cluster.policy_workers if colocated else cluster.generation_workers
    return serving.gpus_per_replica > 0


def generation_backend(job: AsyncGRPOJob) -> GenerationBackend:
    """The engine generation.backend runs. auto: vLLM where it is the faster engine, for a pretrained
    checkpoint served on GPUs with responses that end at end-of-sequence: vLLM refills a slot as a
    sample ends, while the torch engine's static batch decodes to its longest row (1.5-1.9x on
    RL-shaped steps with the trainer's engine arguments, docs/benchmarks.md); the torch engine where
    vLLM cannot run or loses: on CPU, for the tiny model, and for fixed-length rows (ignoreEos:
    2.7-3.2x the other way)."""
    trainer = job.spec.trainer
    generation = trainer.generation
    if generation.backend != "auto":
        return generation.backend
    faster = generation_has_gpus(job) and trainer.model.source == "pretrained" and not generation.ignore_eos
    return "vllm" if faster else "torch"


def _sleep_while_training(job: AsyncGRPOJob) -> Iterator[Finding]:
    """An engine that sleeps while the policy trains must have nothing to generate then: sync mode
    only; and vLLM's sleep mode exists only on GPUs."""
    trainer = job.spec.trainer
    if not trainer.generation.sleep_while_training:
        return
    path = f"{TRAINER}.generation.sleepWhileTraining"
    if not trainer.is_sync:
        yield Finding(
            path,
            "needs asyncRL sync mode (maxStalenessVersions 0): in the async modes the engine generates "
            "the next steps' samples while the policy trains; set maxStalenessVersions 0 or remove this",
        )
    if generation_backend(job) == "vllm" and not generation_has_gpus(job):
        yield Finding(
            path,
            "needs GPUs with generation.backend vllm: vLLM's CPU build has no sleep mode; give the "
            "generation pool (or, colocated, the policy pool) GPUs, use generation.backend torch, or "
            "remove this",
        )


def _gpu_layout(job: AsyncGRPOJob) -> Iterator[Finding]:
    cluster = job.spec.cluster
    trainer = job.spec.trainer
    policy_pool, gen_pool = cluster.policy_workers, cluster.generation_workers
    policy_path, gen_path = "spec.cluster.policyWorkers", "spec.cluster.generationWorkers"
    if trainer.policy.backend == "megatron":
        yield from _needs_gpus(policy_pool, policy_path, "policy.backend megatron")
        mp = trainer.policy.megatron
        model_parallel = mp.tensor_parallel_size * mp.pipeline_parallel_size * mp.context_parallel_size
        if policy_pool.total_gpus and policy_pool.total_gpus % model_parallel:
            yield Finding(
                f"{TRAINER}.policy.megatron",
                f"tensorParallelSize x pipelineParallelSize x contextParallelSize = {model_parallel} must "
                f"divide the policy pool's {policy_pool.total_gpus} GPUs (replicas x gpusPerReplica); "
                f"change the parallel sizes or the pool",
            )
        if policy_pool.gpus_per_replica and policy_pool.gpus_per_replica % mp.tensor_parallel_size:
            yield Finding(
                f"{TRAINER}.policy.megatron.tensorParallelSize",
                f"must divide gpusPerReplica ({policy_pool.gpus_per_replica}) so a tensor-parallel group "
                f"stays inside one pod; got {mp.tensor_parallel_size}",
            )
        yield from _megatron_supported(trainer)
    generation = trainer.generation
    serving_pool, serving_path = (policy_pool, policy_path) if generation.colocated else (gen_pool, gen_path)
    if generation_backend(job) == "vllm":
        if generation.colocated and generation.tensor_parallel_size > 1:
            yield Finding(
                f"{TRAINER}.generation.tensorParallelSize",
                f"must be 1 when generation.colocated is true: a colocated engine shares one policy "
                f"rank's GPU and cannot span {generation.tensor_parallel_size}; set tensorParallelSize: 1 "
                f"(more policy GPUs give more engines) or colocated: false with a generationWorkers pool",
            )
        elif serving_pool.gpus_per_replica % generation.tensor_parallel_size:
            yield Finding(
                f"{TRAINER}.generation.tensorParallelSize",
                f"must divide {serving_path}.gpusPerReplica ({serving_pool.gpus_per_replica}) so one "
                f"engine stays inside one pod; got {generation.tensor_parallel_size}",
            )
    elif generation.tensor_parallel_size > 1:
        yield Finding(
            f"{TRAINER}.generation.tensorParallelSize",
            f"must be 1 with the torch generation backend (it does not shard); got "
            f"{generation.tensor_parallel_size}. Use backend vllm for tensor parallelism",
        )
    if generation.colocated and gen_pool.replicas:
        yield Finding(
            f"{gen_path}.replicas",
            "must be 0 when generation.colocated is true: generation then runs on the policy workers; "
            "set replicas: 0 or colocated: false",
        )
    if not generation.colocated and gen_pool.replicas == 0 and policy_pool.replicas == 0:
        return
    if trainer.weight_sync.transport == "cuda-ipc" and not (
        generation.colocated and policy_pool.gpus_per_replica and trainer.policy.backend == "torch"
    ):
        yield Finding(
            f"{TRAINER}.weightSync.transport",
            "cuda-ipc shares a torch policy rank's GPU memory with the engine colocated on that GPU: it "
            "needs generation.colocated true, policy GPUs and policy.backend torch; use auto",
        )
    if trainer.weight_sync.transport == "nccl":
        yield from _broadcast_layout(policy_pool, serving_pool, colocated=generation.colocated)


def _broadcast_layout(
    policy_pool: WorkerGroup, serving_pool: WorkerGroup, *, colocated: bool
) -> Iterator[Finding]:
    """weightSync.transport nccl is the bucketed broadcast, over NCCL between GPUs and over gloo
    between CPU processes (the same code). It needs both ends on one kind of device, and on GPUs
    two processes: a policy rank and the engine colocated on its GPU cannot form an NCCL group."""
    path = f"{TRAINER}.weightSync.transport"
    if bool(policy_pool.gpus_per_replica) != bool(serving_pool.gpus_per_replica):
        yield Finding(
            path,
            "nccl broadcasts between the policy and the generation pool on one kind of device (NCCL on "
            "GPUs, gloo on CPU); one of them has GPUs and the other none: give both GPUs or neither, "
            "or use object-store",
        )
    elif colocated and policy_pool.gpus_per_replica:
        yield Finding(
            path,
            "nccl cannot connect a colocated engine to the policy rank on its own GPU (generation.colocated "
            "true); use auto or cuda-ipc",
        )


def _megatron_supported(trainer: TrainerSpec) -> Iterator[Finding]:
    """What the Megatron-core backend of this release can run: tensor and data parallelism, with
    attention heads that split evenly over the tensor-parallel ranks."""
    mp, path = trainer.policy.megatron, f"{TRAINER}.policy.megatron"
    for field, size in (
        ("pipelineParallelSize", mp.pipeline_parallel_size),
        ("contextParallelSize", mp.context_parallel_size),
    ):
        if size > 1:
            yield Finding(
                f"{path}.{field}",
                f"must be 1: the Megatron-core backend runs tensor and data parallelism only (got {size}); "
                "use tensorParallelSize or more policy GPUs for data parallelism",
            )
    tp = mp.tensor_parallel_size
    if trainer.model.source == "tiny":
        heads, kv = trainer.model.tiny.num_heads, trainer.model.tiny.num_kv_heads
        if heads % tp or (kv % tp and tp % kv):
            yield Finding(
                f"{path}.tensorParallelSize",
                f"must divide model.tiny.numHeads ({heads}) and divide or be a multiple of numKvHeads ({kv}) "
                f"so each tensor-parallel rank holds whole heads; got {tp}",
            )


def _needs_gpus(pool: WorkerGroup, path: str, why: str) -> Iterator[Finding]:
    if pool.total_gpus == 0:
        yield Finding(
            f"{path}.gpusPerReplica",
            f"{why} needs GPUs, but the pool asks for none (replicas {pool.replicas}, gpusPerReplica "
            f"{pool.gpus_per_replica}); set replicas and gpusPerReplica to at least 1, or use the torch "
            f"backend",
        )


def _container_resources(job: AsyncGRPOJob) -> Iterator[tuple[str, Resources]]:
    """Each rendered container's requests and limits with the field that sets them."""
    cluster = job.spec.cluster
    yield "spec.cluster.head.resources", cluster.head.resources
    yield "spec.cluster.head.driverResources", cluster.head.driver_resources
    yield "spec.cluster.policyWorkers.resources", cluster.policy_workers.resources
    yield "spec.cluster.generationWorkers.resources", cluster.generation_workers.resources


def _requests_within_limits(job: AsyncGRPOJob) -> Iterator[Finding]:
    """The API server refuses a pod whose request exceeds its limit; a RayCluster does not check
    its pod templates, so without this the job would be admitted and its pods never created."""
    for path, resources in _container_resources(job):
        for resource, request in resources.requests.items():
            limit = resources.limits.get(resource)
            if limit is not None and quantity.parse(request) > quantity.parse(limit):
                yield Finding(
                    f"{path}.requests.{resource}",
                    f"{request} is more than the limit {limit}; a pod's request may not exceed its "
                    "limit. Lower the request or raise the limit",
                )


def _gpus_not_in_resources(job: AsyncGRPOJob) -> Iterator[Finding]:
    for path, resources in _container_resources(job):
        for kind, values in (("requests", resources.requests), ("limits", resources.limits)):
            if GPU_RESOURCE in values:
                on_head = path.startswith("spec.cluster.head.")
                fix = "a worker pool (the head needs no GPU)" if on_head else "gpusPerReplica"
                yield Finding(
                    f"{path}.{kind}",
                    f"must not set {GPU_RESOURCE}: use {fix}, which sets request and limit together",
                )


# --- names, scheduler, env -----------------------------------------------------------------------


DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
GENERATED_SUFFIX_LENGTH = 5
"""Characters the API server appends to metadata.generateName."""
MAX_ANNOTATIONS_BYTES = 262_144


def _names_fit(job: AsyncGRPOJob) -> Iterator[Finding]:
    meta = job.metadata
    if meta.name:
        path, name, shown = "metadata.name", meta.name, meta.name
    elif meta.generate_name:
        path, name = "metadata.generateName", meta.generate_name + "a" * GENERATED_SUFFIX_LENGTH
        shown = meta.generate_name
    else:
        yield Finding("metadata.name", "is required (or metadata.generateName)")
        return
    if not DNS_1035_LABEL.fullmatch(name):
        yield Finding(
            path,
            "must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter and "
            f"ending with a letter or digit), because the Ray head Service is named after it; got {shown!r}",
        )
    longest = raycluster_name(name, job.spec.backoff_limit)
    if len(longest) > MAX_RAYCLUSTER_NAME_LENGTH:
        room = MAX_RAYCLUSTER_NAME_LENGTH - (len(longest) - len(shown))
        yield Finding(
            path,
            f"is too long: the RayCluster of the last retry would be {len(longest)} characters "
            f"({longest!r}), over KubeRay's limit of {MAX_RAYCLUSTER_NAME_LENGTH}. Use at most {room} "
            f"characters (with backoffLimit {job.spec.backoff_limit})",
        )


def _annotations_fit(job: AsyncGRPOJob) -> Iterator[Finding]:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in job.metadata.annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        yield Finding(
            "metadata.annotations",
            f"total {size} bytes, over the API server's limit of {MAX_ANNOTATIONS_BYTES}; remove some",
        )


def _scheduler_queue(job: AsyncGRPOJob) -> Iterator[Finding]:
    scheduler = job.spec.scheduler
    label = job.metadata.labels.get(KUEUE_QUEUE_LABEL)
    label_path = f"metadata.labels.{KUEUE_QUEUE_LABEL}"
    if label is not None and not DNS_1123_LABEL.fullmatch(label):
        yield Finding(label_path, f"{label!r} is not a LocalQueue name (a DNS label)")
    if label and scheduler.name in {"kai", "volcano"}:
        yield Finding(
            label_path,
            f"queues the job in Kueue, but spec.scheduler.name is {scheduler.name}: choose one (remove the "
            "label, or set scheduler.name kueue)",
        )
    elif label and scheduler.queue_name is not None and scheduler.queue_name != label:
        yield Finding(
            "spec.scheduler.queueName",
            f"is {scheduler.queue_name!r} but the job's {KUEUE_QUEUE_LABEL} label is {label!r}; they "
            "name the same Kueue LocalQueue, so they must agree (or set only one)",
        )
    elif scheduler.name in {"kueue", "kai"} and scheduler.queue_name is None and not label:
        yield Finding(
            "spec.scheduler.queueName",
            f"is required when scheduler.name is {scheduler.name}: name the queue the job is submitted to",
        )


def _multikueue(job: AsyncGRPOJob) -> Iterator[Finding]:
    """MultiKueue dispatches only a job Kueue queues (its Workload carries the admission check),
    and the copy it creates on a worker (with the prebuilt-workload label) never has managedBy."""
    if job.dispatched_by_multikueue and job.kueue_queue_name is None:
        yield Finding(
            "spec.managedBy",
            f"is {MULTIKUEUE}, but the job is not queued in Kueue: add the label {KUEUE_QUEUE_LABEL} "
            "(a LocalQueue whose ClusterQueue has a MultiKueue admission check), or remove managedBy",
        )
    prebuilt = job.prebuilt_workload_name
    if prebuilt is not None:
        path = f"metadata.labels.{PREBUILT_WORKLOAD_LABEL}"
        if not DNS_1123_SUBDOMAIN.fullmatch(prebuilt):
            yield Finding(path, f"{prebuilt!r} is not a Workload name (a DNS subdomain)")
        if job.kueue_queue_name is None:
            yield Finding(path, f"names a prebuilt Workload, but the job has no {KUEUE_QUEUE_LABEL} label")
        if job.dispatched_by_multikueue:
            yield Finding(
                path,
                "is set by MultiKueue on a worker cluster's copy of a job, which has no spec.managedBy; "
                "remove one of the two",
            )


def _pod_template_overrides(job: AsyncGRPOJob) -> Iterator[Finding]:
    """What a pool's podTemplate may not set given the rest of the job (its shape is checked by
    the model): the job's own environment variables and storage mount paths, and a priority class
    other than spec.scheduler.priorityClassName."""
    job_env = {var.name for var in job.spec.env} | {ref.env for s in job.spec.secrets for ref in s.keys}
    storage = job.spec.storage
    mounts = {v.mount_path.rstrip("/") for v in (storage.checkpoints, storage.models, storage.data) if v}
    pools = (
        ("head", job.spec.cluster.head),
        ("policyWorkers", job.spec.cluster.policy_workers),
        ("generationWorkers", job.spec.cluster.generation_workers),
    )
    priority = job.spec.scheduler.priority_class_name
    for pool_name, pool in pools:
        spec = (pool.pod_template or {}).get("spec") or {}
        path = f"spec.cluster.{pool_name}.podTemplate.spec"
        wanted = spec.get("priorityClassName")
        if priority is not None and wanted is not None and wanted != priority:
            yield Finding(
                f"{path}.priorityClassName",
                f"is {wanted!r} but spec.scheduler.priorityClassName is {priority!r}; set one of them",
            )
        for field in ("initContainers", "containers"):
            for container in spec.get(field) or []:
                name = container.get("name")
                for k, var in enumerate(container.get("env") or []):
                    if var.get("name") in job_env:
                        yield Finding(
                            f"{path}.{field}[{name}].env[{k}].name",
                            f"{var.get('name')} is already set by spec.env or spec.secrets; set it once",
                        )
                for k, mount in enumerate(container.get("volumeMounts") or []):
                    if str(mount.get("mountPath", "")).rstrip("/") in mounts:
                        yield Finding(
                            f"{path}.{field}[{name}].volumeMounts[{k}].mountPath",
                            f"{mount.get('mountPath')} is where spec.storage mounts a volume; use another",
                        )


def _unique_env_names(job: AsyncGRPOJob) -> Iterator[Finding]:
    seen: dict[str, str] = {}
    for i, var in enumerate(job.spec.env):
        path = f"spec.env[{i}].name"
        if var.name in seen:
            yield Finding(path, f"{var.name} is already set by {seen[var.name]}; set each variable once")
        seen.setdefault(var.name, path)
    for i, secret in enumerate(job.spec.secrets):
        for k, ref in enumerate(secret.keys):
            path = f"spec.secrets[{i}].keys[{k}].env"
            if ref.env in seen:
                yield Finding(path, f"{ref.env} is already set by {seen[ref.env]}; set each variable once")
            seen.setdefault(ref.env, path)


def _ray_version_has_token_auth(job: AsyncGRPOJob) -> Iterator[Finding]:
    """KubeRay refuses token authentication (`authOptions`) for a Ray before 2.52 and would never
    create the job's pods: say so at admission instead."""
    version = job.spec.cluster.ray_version
    if tuple(int(part) for part in version.split(".")[:2]) < ray_auth.MIN_RAY_VERSION:
        minimum = ".".join(map(str, ray_auth.MIN_RAY_VERSION))
        yield Finding(
            "spec.cluster.rayVersion",
            f"is {version}, but every job runs with Ray's token authentication, which needs Ray {minimum} "
            f"or later in the image; use an image with Ray {minimum}+ and set its version here",
        )


def _ray_auth_env(job: AsyncGRPOJob) -> Iterator[Finding]:
    """Ray's token authentication is on for every job: a variable that would turn it off or replace
    the job's token would open the job's Ray ports to whoever reaches them (docs/security.md)."""
    for i, var in enumerate(job.spec.env):
        if var.name in ray_auth.RESERVED_ENV:
            yield Finding(f"spec.env[{i}].name", f"{var.name} {podtemplate.RAY_AUTH_REFUSAL}")
    for i, secret in enumerate(job.spec.secrets):
        for k, ref in enumerate(secret.keys):
            if ref.env in ray_auth.RESERVED_ENV:
                yield Finding(f"spec.secrets[{i}].keys[{k}].env", f"{ref.env} {podtemplate.RAY_AUTH_REFUSAL}")


def _object_store(job: AsyncGRPOJob) -> Iterator[Finding]:
    for path, message in object_store_problems(job):
        yield Finding(path, message)


# --- warnings ------------------------------------------------------------------------------------


def _warn_force_in_order_in_sync_mode(job: AsyncGRPOJob) -> Iterator[Finding]:
    rl = job.spec.trainer.async_rl
    if rl.max_staleness_versions == 0 and rl.force_in_order is not None and not rl.over_sampling:
        yield Finding(
            f"{ASYNC_RL}.forceInOrder",
            "is ignored in sync mode (maxStalenessVersions 0): every step trains on the batch generated "
            "by its own policy version anyway; remove it",
        )


def _warn_checkpoints_not_durable(job: AsyncGRPOJob) -> Iterator[Finding]:
    volume = job.spec.storage.checkpoints
    path = job.spec.checkpoint.path
    if job.spec.storage.object_store is not None:
        return  # resumes read the object store; the volume is scratch space
    if volume is None or not volume.survives_pod_loss:
        yield Finding(
            "spec.storage.checkpoints",
            "is not a durable volume (PVC or hostPath): checkpoints are lost with the pods, so retries "
            "and resumes after suspend start from step 0. Mount a PVC at checkpoint.path",
        )
    elif not (path == volume.mount_path or path.startswith(volume.mount_path.rstrip("/") + "/")):
        yield Finding(
            "spec.checkpoint.path",
            f"{path} is outside storage.checkpoints.mountPath ({volume.mount_path}), so checkpoints are "
            f"not written to the durable volume; put the path under the mount",
        )


def _warn_ignored_settings(job: AsyncGRPOJob) -> Iterator[Finding]:
    trainer = job.spec.trainer
    # Compared with the defaults, not model_fields_set: the API server fills in every default.
    if trainer.model.source == "pretrained" and trainer.model.tiny != TinyModelSpec():
        yield Finding(f"{TRAINER}.model.tiny", "is ignored when source is pretrained; remove it")
    if trainer.policy.backend != "megatron" and trainer.policy.megatron != MegatronSpec():
        yield Finding(f"{TRAINER}.policy.megatron", "is ignored unless policy.backend is megatron; remove it")
    if job.spec.scheduler.name == "default" and job.spec.scheduler.queue_name is not None:
        yield Finding(
            "spec.scheduler.queueName",
            "is ignored with scheduler.name default; set name kueue, kai or volcano",
        )
    generation = job.spec.cluster.generation_workers
    if not generation.elastic and generation.autoscaling != Autoscaling():
        yield Finding(
            "spec.cluster.generationWorkers.autoscaling",
            "is ignored by a fixed fleet (minReplicas and maxReplicas unset or equal to replicas); set "
            "minReplicas below or maxReplicas above replicas, or remove it",
        )
    if trainer.grpo.val_period and trainer.data.num_validation_prompts == 0:
        yield Finding(
            f"{TRAINER}.grpo.valPeriod",
            "has no effect while data.numValidationPrompts is 0; set validation prompts or valPeriod 0",
        )


def _non_default(block: BaseModel, *fields: str) -> Iterator[str]:
    """The API names of `fields` of `block` that hold something other than their default. Compared
    with the defaults, not model_fields_set: the API server fills in every default, and a default
    nobody chose is no setting to warn about."""
    for name in fields:
        info = type(block).model_fields[name]
        if getattr(block, name) != info.get_default(call_default_factory=True):
            yield info.alias or name


def _warn_inert_knobs(job: AsyncGRPOJob) -> Iterator[Finding]:
    """Algorithm and backend knobs that the rest of the configuration makes do nothing."""
    trainer = job.spec.trainer
    if trainer.train_global_batch_size == trainer.samples_per_step:
        for field in _non_default(trainer.loss, "ratio_clip_min", "ratio_clip_max", "ratio_clip_c"):
            yield Finding(
                f"{TRAINER}.loss.{field}",
                "is ignored with one optimizer step per RL step (policy.trainGlobalBatchSize unset or P x "
                "N): the ratio to pi_old is exactly 1; set trainGlobalBatchSize to a divisor of P x N or "
                "remove it",
            )
    if trainer.is_sync:
        for field in _non_default(trainer.async_rl, "drain_before_refit"):
            yield Finding(
                f"{ASYNC_RL}.{field}",
                "is ignored in sync mode (maxStalenessVersions 0): nothing is in flight at a refit; "
                "remove it",
            )
    if trainer.is_sync and trainer.loss.use_importance_sampling_correction:
        for field in _non_default(trainer.loss, "importance_sampling_on_stale_data"):
            yield Finding(
                f"{TRAINER}.loss.{field}",
                "is ignored in sync mode (maxStalenessVersions 0): every sample comes from the weights "
                "being trained; remove it",
            )
    if not trainer.loss.use_importance_sampling_correction:
        for field in _non_default(
            trainer.loss,
            "truncated_importance_sampling_ratio",
            "truncated_importance_sampling_ratio_min",
            "truncated_importance_sampling_type",
            "importance_sampling_on_stale_data",
        ):
            yield Finding(
                f"{TRAINER}.loss.{field}",
                "is ignored while loss.useImportanceSamplingCorrection is false (no importance weight to "
                "truncate or extend); set it true or remove this",
            )
        if trainer.train_global_batch_size == trainer.samples_per_step:
            for field in _non_default(trainer.loss, "sequence_level_importance_ratios"):
                yield Finding(
                    f"{TRAINER}.loss.{field}",
                    "is ignored with one optimizer step per RL step and no IS correction (the ratio "
                    "is 1: GSPO's gradient is GRPO's); set trainGlobalBatchSize below P x N or "
                    "useImportanceSamplingCorrection true",
                )
    if trainer.policy.max_tokens_per_micro_batch is not None:
        for field in _non_default(trainer.policy, "train_micro_batch_size", "logprob_batch_size"):
            yield Finding(
                f"{TRAINER}.policy.{field}",
                "is ignored with policy.maxTokensPerMicroBatch: micro-batches are packed by tokens, not "
                "counted in rows; remove it or unset maxTokensPerMicroBatch",
            )
    if not trainer.grpo.dynamic_sampling:
        for field in _non_default(trainer.grpo, "dynamic_sampling_max_extra_groups"):
            yield Finding(
                f"{TRAINER}.grpo.{field}",
                "is ignored while grpo.dynamicSampling is false (no group is dropped, so none is "
                "replaced); set dynamicSampling true or remove this",
            )
    if trainer.logprob_gate.threshold is None:
        for field in _non_default(trainer.logprob_gate, "steps", "fail_job"):
            yield Finding(
                f"{TRAINER}.logprobGate.{field}",
                "is ignored while logprobGate.threshold is unset (the gate is off); set a threshold or "
                "remove it",
            )
    if trainer.loss.reference_policy_kl_penalty == 0:
        for field in _non_default(trainer.loss, "kl_type"):
            yield Finding(
                f"{TRAINER}.loss.{field}",
                "is ignored while loss.referencePolicyKlPenalty is 0 (no KL term); set the penalty or "
                "remove it",
            )
    backend = generation_backend(job)
    if backend == "torch" or not generation_has_gpus(job):
        where = "the torch generation engine" if backend == "torch" else "vLLM on CPU"
        for field in _non_default(trainer.generation, "gpu_memory_utilization"):
            yield Finding(
                f"{TRAINER}.generation.{field}",
                f"is ignored with {where} (it is the share of GPU memory vLLM takes; on CPU its KV cache "
                f"is sized from the job's shape); remove it",
            )
    if backend != "torch":
        for field in _non_default(trainer.generation, "torch_decode"):
            yield Finding(
                f"{TRAINER}.generation.{field}",
                f"is ignored when vLLM generates (generation.backend {trainer.generation.backend}): it "
                "picks how the torch engine decodes, and vLLM schedules its own batches; remove it",
            )
    if not trainer.generation.colocated:
        for field in _non_default(trainer.generation, "sleep_while_training"):
            yield Finding(
                f"{TRAINER}.generation.{field}",
                "frees memory that nothing else uses while generation has its own workers (colocated "
                "false): each step pays the sleep and wake for nothing; set colocated true or remove it",
            )
    transport = refit_transport(job)
    if transport != "broadcast":
        for field in _non_default(trainer.weight_sync, "bucket_size_mb"):
            yield Finding(
                f"{TRAINER}.weightSync.{field}",
                f"is ignored with the {transport} refit this job runs (only the broadcast, weightSync."
                f"transport nccl or auto between GPU pools, packs buckets); remove it",
            )
    yield from _warn_inert_sharding(job)
    if trainer.policy.learning_rate_schedule == "constant":
        for field in _non_default(trainer.policy, "min_learning_rate_ratio"):
            yield Finding(
                f"{TRAINER}.policy.{field}",
                "is ignored with learningRateSchedule constant; set learningRateSchedule cosine or remove it",
            )
    if trainer.env.score_truncated and trainer.env.function is None and trainer.reward_model is None:
        yield Finding(
            f"{TRAINER}.env.scoreTruncated",
            "is ignored without env.function or rewardModel (the environments reward a truncated response "
            "0); set one of them or remove it",
        )
    if trainer.env.function is None:
        for field in _non_default(trainer.env, "function_scope"):
            yield Finding(
                f"{TRAINER}.env.{field}",
                "is ignored without env.function (it says how that function is called); set "
                "env.function or remove it",
            )


def _warn_inert_sharding(job: AsyncGRPOJob) -> Iterator[Finding]:
    """policy.sharding settings that this job's layout makes do nothing (the megatron backend with
    fsdp is an invariant's error)."""
    sharding, path = job.spec.trainer.policy.sharding, f"{TRAINER}.policy.sharding"
    offload = sharding.cpu_offload
    if sharding.strategy != "fsdp":
        if offload:
            yield Finding(
                f"{path}.cpuOffload",
                "is ignored unless sharding.strategy is fsdp (only FSDP's shards move to host memory); set "
                "strategy fsdp or remove it",
            )
        return
    if offload and not job.spec.cluster.policy_workers.gpus_per_replica:
        yield Finding(
            f"{path}.cpuOffload",
            "changes nothing on CPU policy workers (cluster.policyWorkers.gpusPerReplica 0): their weights, "
            "gradients and optimizer state are in host memory already; remove it",
        )
    if policy_data_parallel_size(job) == 1 and not offload:
        yield Finding(
            f"{path}.strategy",
            "fsdp over one policy rank shards nothing: that rank holds the whole model, as with strategy "
            "none. Add policy ranks (cluster.policyWorkers replicas or gpusPerReplica), set cpuOffload "
            "on GPUs, or use strategy none",
        )


def _lora_supported(job: AsyncGRPOJob) -> Iterator[Finding]:
    """policy.lora runs on the unsharded torch policy backend, and its refits (the adapters only)
    travel through the object store: the broadcast's bucket plan and the CUDA IPC buffer are laid
    out for the whole model, and adapters are small enough not to need them."""
    trainer = job.spec.trainer
    policy, path = trainer.policy, f"{TRAINER}.policy.lora"
    if policy.lora is None:
        return
    if policy.backend == "megatron":
        yield Finding(
            path, "trains adapters in the torch policy backend only: unset it or use policy.backend torch"
        )
    if policy.sharding.strategy == "fsdp":
        yield Finding(
            path,
            "trains adapters on an unsharded model: the frozen base weights are not sharded and the adapters "
            "with their optimizer state are small; set policy.sharding.strategy none, or unset lora for "
            "sharded full fine-tuning",
        )
    if trainer.weight_sync.transport in ("nccl", "cuda-ipc"):
        yield Finding(
            f"{TRAINER}.weightSync.transport",
            f"must be auto or object-store with policy.lora (got {trainer.weight_sync.transport}): a LoRA "
            "refit sends only the adapters, through the object store",
        )


_ERROR_RULES: tuple[Callable[[AsyncGRPOJob], Iterator[Finding]], ...] = (
    _names_fit,
    _annotations_fit,
    _invariants,
    _batch_divides,
    _truncation_bounds,
    _gpu_layout,
    _elastic_fleet,
    _sleep_while_training,
    _lora_supported,
    _gpus_not_in_resources,
    _requests_within_limits,
    _scheduler_queue,
    _multikueue,
    _pod_template_overrides,
    _unique_env_names,
    _ray_version_has_token_auth,
    _ray_auth_env,
    _object_store,
)
_WARNING_RULES: tuple[Callable[[AsyncGRPOJob], Iterator[Finding]], ...] = (
    _warn_unread_data_settings,
    _warn_force_in_order_in_sync_mode,
    _inflight_within_buffer,
    _warn_checkpoints_not_durable,
    _warn_ignored_settings,
    _warn_inert_knobs,
)


# --- updates -------------------------------------------------------------------------------------

ALWAYS_MUTABLE = frozenset(
    {
        "suspend",
        "backoffLimit",
        "activeDeadlineSeconds",
        "startupDeadlineSeconds",
        "progress",
        "cleanupPolicy",
    }
)
"""Top-level spec fields that may change at any time: they steer the operator, not the run."""

MUTABLE_WHILE_SUSPENDED = frozenset({"cluster", "scheduler", "labels"})
"""Placement fields that may change while a job is suspended or not yet started (Kueue rewrites
node selectors and tolerations when it admits a job); the next RayCluster uses the new values."""


def locked_changes(
    old_spec: Mapping[str, Any], new_spec: Mapping[str, Any], *, suspended: bool
) -> list[Finding]:
    """Spec fields an update changes that cannot change now; empty when the update is allowed.

    A running job's trainer reads its spec once, so changing, say, the batch size would silently
    do nothing until the next retry and make checkpoints inconsistent: such changes are refused.
    """
    mutable = ALWAYS_MUTABLE | (MUTABLE_WHILE_SUSPENDED if suspended else frozenset())
    findings: list[Finding] = []
    for key in sorted(set(old_spec) | set(new_spec)):
        if key in mutable or old_spec.get(key) == new_spec.get(key):
            continue
        when = "while the job runs" if key in MUTABLE_WHILE_SUSPENDED else "once the job exists"
        fix = (
            "suspend the job first (spec.suspend: true) or create a new job"
            if key in MUTABLE_WHILE_SUSPENDED
            else "create a new job (or delete and re-create this one)"
        )
        findings.append(Finding(f"spec.{key}", f"cannot change {when}; {fix}"))
    return findings
