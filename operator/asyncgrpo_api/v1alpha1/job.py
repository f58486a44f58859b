"""The AsyncGRPOJob resource: spec, status and the object envelope."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from asyncgrpo_api.v1alpha1.base import ApiModel, DnsSubdomain, LabelKey, LabelValue, ShortText
from asyncgrpo_api.v1alpha1.placement import ClusterSpec
from asyncgrpo_api.v1alpha1.runtime import (
    CheckpointSpec,
    CleanupPolicy,
    EnvVar,
    NetworkSpec,
    ProgressWatchSpec,
    SchedulerSpec,
    SecretRef,
    StorageSpec,
)
from asyncgrpo_api.v1alpha1.trainer import TrainerSpec

GROUP = "asyncgrpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AsyncGRPOJob"
PLURAL = "asyncgrpojobs"
SINGULAR = "asyncgrpojob"
SHORT_NAMES = ("agj",)
DRIVER_PROGRESS_PORT = 8090
"""Port of the driver's HTTP server on the head pod: GET /progress (JSON) and /metrics."""

ImageRef = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\s]+$")]


class RuntimeRef(ApiModel):
    """The AsyncGRPORuntime a job runs under (asyncgrpo_api.v1alpha1.admin_runtime)."""

    name: DnsSubdomain = Field(description="Name of the AsyncGRPORuntime (cluster-scoped).")


class AsyncGRPOJobSpec(ApiModel):
    """The desired state of one asynchronous GRPO training run."""

    image: ImageRef = Field(description="Trainer image (Ray, torch and asyncgrpo) for the head and workers.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of the trainer image."
    )
    suspend: bool = Field(
        default=False,
        description="true suspends the RayCluster in place (its pods are deleted; the job, its attempt and "
        "its RayCluster stay: Suspended); false resumes it from the latest checkpoint. For a job Kueue "
        "manages it is Kueue's gate: the operator holds it true until the job's Workload is admitted and "
        "sets it true again when Kueue evicts it (stop such a job with its Workload's spec.active false).",
    )
    managed_by: Literal["kueue.x-k8s.io/multikueue"] | None = Field(
        default=None,
        description="The controller that runs the job. Unset: this operator. kueue.x-k8s.io/multikueue: "
        "Kueue's MultiKueue dispatches the job to a worker cluster, where that cluster's operator runs it; "
        "here the operator only keeps the job's Workload (so Kueue queues it), creates no RayCluster and "
        "writes no status (MultiKueue copies the worker's). Needs the job queued in Kueue. Cannot change "
        "once the job exists. See docs/guides/scheduling.md#multikueue.",
    )
    backoff_limit: int = Field(
        default=2,
        ge=0,
        le=99,
        description="Retries of infrastructure failures (head pod lost, driver killed by a signal, node "
        "gone); training errors are never retried. status.restarts counts them.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="Fail the job (DeadlineExceeded) this long after status.startTime; "
        "suspended time does not count. Under Kueue only the time admitted counts, in all admissions "
        "together (the Workload's accumulatedPastExecutionTimeSeconds): time queued never does.",
    )
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=1,
        le=86_400,
        description="How long every pod has to stop when it is deleted (a Kueue preemption, "
        "spec.suspend, a drain): the driver finishes the step in progress, checkpoints it and exits, "
        "and the Ray containers stop only after it (a preStop hook waits for the driver). Give it "
        "more than a step plus a checkpoint takes; past it the kubelet kills the pods and the run "
        "resumes from the last periodic checkpoint.",
    )
    startup_deadline_seconds: int | None = Field(
        default=1800,
        ge=1,
        le=31_536_000,
        description="Fail an attempt whose driver is not running this long after its RayCluster was "
        "created (e.g. GPUs never become available); under Kueue, after the job was admitted. Unset waits "
        "forever.",
    )
    progress: ProgressWatchSpec = Field(
        default_factory=ProgressWatchSpec, description="Progress polling and stall detection."
    )
    cleanup_policy: CleanupPolicy = Field(
        default_factory=CleanupPolicy, description="What is deleted after the job finishes."
    )
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="The Ray cluster's pools.")
    storage: StorageSpec = Field(default_factory=StorageSpec, description="Volumes mounted into the pods.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    secrets: list[SecretRef] = Field(
        default_factory=list, max_length=32, description="Secrets exposed to the trainer as environment."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra environment variables for the trainer."
    )
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="NCCL and pod networking.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="Queueing and priority.")
    image_pull_secrets: list[DnsSubdomain] = Field(
        default_factory=list, max_length=16, description="Secret names used to pull the trainer image."
    )
    service_account_name: DnsSubdomain | None = Field(
        default=None,
        description="ServiceAccount of the pods; unset uses the namespace default without a mounted token.",
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Extra labels on the RayCluster and its pods."
    )
    runtime_ref: RuntimeRef | None = Field(
        default=None,
        description="The AsyncGRPORuntime (cluster-scoped, an administrator's) the job runs under: "
        "admission refuses what it does not allow, and the pods get the ServiceAccount and "
        "securityContext it fixes. Unset: no runtime. Cannot change once the job exists. See "
        "docs/security.md#runtimes.",
    )
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="The training run itself.")


Phase = Literal[
    "Pending", "Queued", "Provisioning", "Running", "Suspended", "Restarting", "Succeeded", "Failed"
]
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""spec.managedBy of a job MultiKueue dispatches (Kueue's MultiKueueControllerName)."""
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
"""On a worker cluster's copy of a dispatched job: the Workload MultiKueue created for it there,
which the job uses instead of one of its own (Kueue's constants.PrebuiltWorkloadLabel)."""
"""Kueue's convention for the queue of a job; on an AsyncGRPOJob it is copied to its RayCluster."""
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})


class Condition(ApiModel):
    """A metav1.Condition: the source of truth of the job's state."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)] = Field(
        description="Condition type, e.g. Ready, Running, Succeeded, Failed, Suspended, Stalled."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="CamelCase reason, e.g. Unschedulable or DeadlineExceeded."
    )
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        default="", description="Human-readable detail."
    )
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


MAX_PROGRESS_INT = 2**53 - 1
"""The largest count status.progress holds: the driver runs the job author's code and may report
any number, and one the API server cannot store (above int64) would fail every status write of
the job. 2^53 - 1 is also the largest integer a JSON client (kubectl's, a dashboard's) reads
exactly; the operator caps what it reads to it."""


class Progress(ApiModel):
    """Training progress read from the driver's /progress endpoint."""

    step: int = Field(default=0, ge=0, le=MAX_PROGRESS_INT, description="RL steps completed.")
    max_steps: int = Field(default=0, ge=0, le=MAX_PROGRESS_INT, description="RL steps the job will run.")
    policy_version: int = Field(
        default=0, ge=0, le=MAX_PROGRESS_INT, description="Weight version of the generation workers."
    )
    reward_mean: float | None = Field(default=None, description="Mean reward of the last step's samples.")
    accuracy: float | None = Field(
        default=None,
        description="Fraction of the last step's samples that are exactly the reference answer "
        "(no partial credit, unlike a shaped reward).",
    )
    mean_staleness: float | None = Field(
        default=None, description="Mean policy-version lag of the last step's samples."
    )
    mean_oldest_staleness: float | None = Field(
        default=None,
        description="The last step's mean staleness measured on each group's stamp: the oldest weights "
        "that shaped any of its tokens (meanStaleness counts the weights it was dispatched with).",
    )
    behaviour_kl: float | None = Field(
        default=None,
        description="KL(pi_generation || pi_old) per trained token of the last step: how far the weights "
        "trained had moved from those that generated the data (docs/guides/async-modes.md).",
    )
    is_out_of_bounds: float | None = Field(
        default=None,
        description="Share of the last step's trained tokens whose importance weight the truncation "
        "changed (loss.truncatedImportanceSamplingType).",
    )
    tokens_per_second: float | None = Field(
        default=None, description="Generated tokens per second over the last 10 steps."
    )
    policy_idle_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the last step's time the policy waited for rollouts (measured; "
        "docs/guides/trainer.md#who-waits-for-whom). High: generation is the bottleneck.",
    )
    generation_idle_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Mean share of the last step's time a generation engine had no request to serve.",
    )
    generation_gated_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Mean share of the last step's time a generation engine sat idle behind the staleness "
        "gate (part of generationIdleShare): an engine a larger fleet would not use either.",
    )
    buffer_fill: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Groups generated and waiting to be trained at the last step's end, over "
        "asyncRL.maxBufferedRollouts.",
    )
    refit_seconds: float | None = Field(
        default=None, ge=0, description="The last step's weight transfer into the generation engines."
    )
    samples_untrained: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PROGRESS_INT,
        description="Samples generated and never trained on so far (dropped, evicted, or still waiting).",
    )
    time_to_first_step_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds from the attempt's start (status.attemptStartTime, after any queueing) to "
        "its first trained step: pods, image pulls, Ray, model loading and the first rollouts.",
    )
    validation_reward: float | None = Field(default=None, description="Mean reward of the last validation.")
    validation_accuracy: float | None = Field(
        default=None,
        description="Fraction of the held-out prompts answered exactly (greedy) at the last validation; "
        "once the job has Succeeded, its final accuracy when grpo.valAtEnd is on.",
    )
    reward_failures: int = Field(
        default=0,
        ge=0,
        le=MAX_PROGRESS_INT,
        description="Prompt groups dropped because scoring them failed twice (env.timeoutSeconds or an "
        "error); never trained on.",
    )
    last_checkpoint_step: int | None = Field(
        default=None, ge=0, le=MAX_PROGRESS_INT, description="Step of the newest checkpoint."
    )
    durable_checkpoint_step: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PROGRESS_INT,
        description="Step of the newest checkpoint complete in spec.storage.objectStore (what a retry "
        "resumes from once the pods and their volumes are gone).",
    )
    updated_at: datetime | None = Field(
        default=None,
        description="When the operator read these figures (a poll that reads the same is not written).",
    )


class Outputs(ApiModel):
    """Where the driver leaves what outlives the pods (under checkpoint.path; `asyncgrpo logs`)."""

    volume: ShortText = Field(description="The volume that holds them, and whether it outlives the pods.")
    driver_log: ShortText = Field(description="The current attempt's driver log (stdout and stderr).")
    steps: ShortText = Field(description="One JSON line per step and validation record, every attempt.")
    tensorboard: ShortText = Field(
        description="TensorBoard event files (tensorboard --logdir, asyncgrpo plot)."
    )


class DrainRequest(ApiModel):
    """A generation worker the operator asked the driver to drain before it removes the pod."""

    pod: ShortText = Field(description="The generation worker pod to drain and then remove.")
    replicas: int = Field(ge=0, le=1024, description="The fleet's size once it is removed.")
    requested_at: datetime = Field(description="When the operator asked.")
    message: Annotated[str, StringConstraints(max_length=4096)] = Field(
        default="", description="Why: the step windows that decided it."
    )


class GenerationFleet(ApiModel):
    """What the operator did to an elastic generation fleet of the current attempt's RayCluster
    (docs/guides/job-lifecycle.md#elastic-generation)."""

    ray_cluster_name: ShortText = Field(description="The RayCluster whose generation group this is.")
    replicas: int = Field(ge=0, le=1024, description="The generation group's replicas the operator last set.")
    last_change_time: datetime | None = Field(
        default=None, description="When the operator last changed the fleet (the cooldown's clock)."
    )
    last_change_step: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PROGRESS_INT,
        description="The driver's step when it did: only step windows after it decide the next change.",
    )
    drain_request: DrainRequest | None = Field(
        default=None,
        description="A scale-down waiting for the driver to report the worker drained (progress "
        "drainedWorkers); the pod is removed only then.",
    )


class AsyncGRPOJobStatus(ApiModel):
    """The observed state, written only by the operator."""

    phase: Phase = Field(default="Pending", description="Derived from conditions, for printing.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="metav1.Condition list, one per type; the source of truth.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Generation last acted on.")
    admitted_generation: int | None = Field(
        default=None,
        ge=0,
        description="The newest spec generation that passed every admission rule when the operator "
        "read it. A started job whose spec fails the rules at this generation was admitted under older "
        "rules and keeps running; a newer generation that fails them never passed admission (it was "
        "written while the webhook was not called) and is refused.",
    )
    ray_cluster_name: ShortText | None = Field(default=None, description="RayCluster of the current attempt.")
    workload_name: ShortText | None = Field(
        default=None,
        description="The job's Kueue Workload, for a job Kueue manages (one for the job's whole life; "
        "set its spec.active false to stop the job).",
    )
    dashboard_url: ShortText | None = Field(
        default=None,
        description="Ray dashboard of the current attempt; it asks for the job's Ray token "
        "(`kubectl get secret <job>-ray-token -o jsonpath='{.data.auth_token}' | base64 -d`).",
    )
    head_pod: ShortText | None = Field(
        default=None,
        description="Head pod of the current (or last) attempt: its `driver` container runs the training "
        "driver, whose exit decides the attempt.",
    )
    driver_logs: ShortText | None = Field(
        default=None,
        description="Where the driver's log is: the kubectl command that prints it (the head pod's "
        "`driver` container). Kept after the job finishes while the RayCluster is kept.",
    )
    attempt: int = Field(default=0, ge=0, description="Index of the current attempt (0 is the first).")
    restarts: int = Field(default=0, ge=0, description="Retries after infrastructure failures.")
    start_time: datetime | None = Field(
        default=None,
        description="When the job started running, reset on resume after suspend (like a batch/v1 Job): "
        "the clock of activeDeadlineSeconds.",
    )
    attempt_start_time: datetime | None = Field(default=None, description="When this attempt started.")
    completion_time: datetime | None = Field(default=None, description="When the job finished.")
    reason: ShortText | None = Field(default=None, description="Reason of the current phase.")
    message: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        default=None, description="Detail of the current phase."
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    generation_fleet: GenerationFleet | None = Field(
        default=None, description="The elastic generation fleet's size and last change (elastic jobs only)."
    )
    outputs: Outputs | None = Field(
        default=None, description="Where the driver's log, step records and curves are written."
    )


class ObjectMeta(ApiModel):
    """metav1.ObjectMeta: the fields the API server knows, so a misspelt key is an error here too.

    Only name, generateName, labels and annotations are checked in detail; the server-managed
    fields are accepted as they come (they appear when a stored object is validated again).
    """

    name: Annotated[str, StringConstraints(max_length=253)] = Field(default="", description="Object name.")
    generate_name: Annotated[str, StringConstraints(max_length=253)] = Field(
        default="", description="Prefix of a server-generated name (5 random characters are appended)."
    )
    namespace: Annotated[str, StringConstraints(max_length=63)] | None = Field(
        default=None, description="Namespace."
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, description="Labels.")
    annotations: dict[LabelKey, str] = Field(default_factory=dict, description="Annotations.")
    uid: str | None = Field(default=None, description="Server-set unique id.")
    resource_version: str | None = Field(default=None, description="Server-set version.")
    generation: int | None = Field(default=None, description="Server-set spec generation.")
    creation_timestamp: str | None = Field(default=None, description="Server-set creation time.")
    deletion_timestamp: str | None = Field(default=None, description="Server-set deletion time.")
    deletion_grace_period_seconds: int | None = Field(default=None, description="Server-set grace period.")
    owner_references: list[dict[str, Any]] = Field(default_factory=list, description="Owners.")
    finalizers: list[str] = Field(default_factory=list, description="Finalizers.")
    managed_fields: list[dict[str, Any]] = Field(
        default_factory=list, description="Server-side apply owners."
    )
    self_link: str | None = Field(default=None, description="Deprecated, server-set.")


class AsyncGRPOJob(ApiModel):
    """An asynchronous GRPO training job run on a KubeRay RayCluster."""

    api_version: Literal["asyncgrpo.dev/v1alpha1"] = Field(
        default="asyncgrpo.dev/v1alpha1", description="asyncgrpo.dev/v1alpha1."
    )
    kind: Literal["AsyncGRPOJob"] = Field(default="AsyncGRPOJob", description="AsyncGRPOJob.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: AsyncGRPOJobSpec = Field(description="Desired state.")
    status: AsyncGRPOJobStatus | None = Field(default=None, description="Observed state.")

    @property
    def kueue_queue_name(self) -> str | None:
        """The Kueue LocalQueue the job waits in, or None when Kueue does not manage it.

        The job's kueue.x-k8s.io/queue-name label (Kueue's convention, what Kueue's own tooling sets)
        is read first; spec.scheduler.queueName with scheduler.name kueue is an alias for it. When
        both are set, admission refuses them unless they agree, so neither silently wins.
        """
        label = self.metadata.labels.get(KUEUE_QUEUE_LABEL)
        if label:
            return label
        scheduler = self.spec.scheduler
        return scheduler.queue_name if scheduler.name == "kueue" else None

    @property
    def dispatched_by_multikueue(self) -> bool:
        """On the manager cluster: MultiKueue runs the job elsewhere (spec.managedBy)."""
        return self.spec.managed_by == MULTIKUEUE

    @property
    def prebuilt_workload_name(self) -> str | None:
        """On a worker cluster: the Workload MultiKueue built for this copy of a dispatched job."""
        return self.metadata.labels.get(PREBUILT_WORKLOAD_LABEL) or None

    def to_manifest(self) -> dict[str, Any]:
        """The object as a Kubernetes manifest (camelCase, defaults included, no status)."""
        return self.model_dump(mode="json", by_alias=True, exclude={"status"}, exclude_none=True)
