"""Where pods land: resources, node selectors, tolerations and affinity, per pool."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from asyncgrpo_api.v1alpha1 import podtemplate
from asyncgrpo_api.v1alpha1.affinity import Affinity
from asyncgrpo_api.v1alpha1.base import ApiModel, LabelKey, LabelValue, Quantity, ShortText

GPU_RESOURCE = "nvidia.com/gpu"
MAX_AUTOSCALING_WINDOW_STEPS = 10
"""The most step windows an elastic fleet's rule reads: the driver's /progress carries this many."""

GENERATION_POOL_LABEL = "asyncgrpo.dev/pool"
"""The Ray node label the operator puts on every generation worker's node, valued
`GENERATION_POOL`: an elastic fleet's driver starts an engine on each such node it gains."""
GENERATION_POOL = "generation"
WORKER_POD_LABEL = "asyncgrpo.dev/pod"
"""The Ray node label naming the worker's pod: the pod a drain request names (the operator's
status.generationFleet.drainRequest) is found among the Ray nodes by it."""


class Toleration(ApiModel):
    """A core/v1 Toleration: lets a pool's pods land on tainted nodes (GPU pools are tainted)."""

    key: LabelKey | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Exists matches any value; Equal matches `value`."
    )
    value: LabelValue | None = Field(default=None, description="Taint value to match with Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="For NoExecute taints: how long the pod stays bound after the taint appears.",
    )


class Resources(ApiModel):
    """CPU, memory and other per-container requests and limits, as Kubernetes quantities.

    GPUs are not set here: `gpusPerReplica` sets nvidia.com/gpu requests and limits together.
    """

    requests: dict[LabelKey, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Minimum resources the scheduler reserves, e.g. {cpu: '8', memory: 64Gi}.",
    )
    limits: dict[LabelKey, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Maximum resources the container may use, e.g. {memory: 64Gi}.",
    )


class Placement(ApiModel):
    """Scheduling constraints shared by the head and both worker pools."""

    resources: Resources = Field(
        default_factory=Resources, description="Container requests and limits (without GPUs)."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels the pool's pods require, e.g. {pool: gpu-h100}.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Taints the pool's pods tolerate; GPU pools usually taint nvidia.com/gpu.",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="A core/v1 Affinity (nodeAffinity, podAffinity, podAntiAffinity), typed and checked "
        "like the API server checks a pod's (by the admission webhook and `asyncgrpo validate`), then "
        "copied into the pod spec unchanged.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "maxProperties": 3},
    )
    annotations: dict[LabelKey, ShortText] = Field(
        default_factory=dict, max_length=32, description="Extra annotations on the pool's pods."
    )
    pod_template: dict[str, Any] | None = Field(
        default=None,
        description="A partial core/v1 PodTemplateSpec merged into the pool's pods: metadata.labels and "
        "annotations; spec.securityContext (merged key by key over the operator's Pod Security restricted "
        "defaults), runtimeClassName, topologySpreadConstraints, priorityClassName, initContainers, volumes, "
        "and containers (an entry named like the operator's container adds env, envFrom and volumeMounts and "
        "merges its securityContext over the operator's; other entries are added as sidecars). The "
        "driver command, the Ray ports and the operator's names cannot be overridden; admission names the "
        "field. See docs/guides/pod-templates.md.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "maxProperties": 2},
    )


class HeadGroup(Placement):
    """The Ray head pod: runs the Ray head and the training driver; needs no GPU."""

    driver_resources: Resources = Field(
        default_factory=Resources,
        description="Requests and limits of the head pod's driver container (`resources` is the Ray head "
        "container's). Set them where a ResourceQuota or LimitRange asks every container for limits, or to "
        "bound the driver's memory: a driver over its memory limit is OOMKilled, and the job's status says "
        "so and names this field.",
    )

    @field_validator("pod_template")
    @classmethod
    def _head_override(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        podtemplate.check(value, podtemplate.HEAD_CONTAINERS)
        return value


class WorkerGroup(Placement):
    """A pool of identical Ray worker pods (one Ray node each)."""

    replicas: int = Field(default=1, ge=0, le=1024, description="Number of worker pods in the pool.")
    gpus_per_replica: int = Field(
        default=0,
        ge=0,
        le=16,
        description="nvidia.com/gpu per pod, set as both request and limit; 0 for CPU-only pools.",
    )

    @field_validator("pod_template")
    @classmethod
    def _worker_override(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        podtemplate.check(value, podtemplate.WORKER_CONTAINERS)
        return value

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole pool."""
        return self.replicas * self.gpus_per_replica

    @property
    def fewest(self) -> int:
        """The fewest pods the pool may have: its replicas (an elastic pool's minReplicas)."""
        return self.replicas

    @property
    def most(self) -> int:
        """The most pods the pool may have: its replicas (an elastic pool's maxReplicas)."""
        return self.replicas

    @property
    def elastic(self) -> bool:
        """Whether the operator may change the pool's size."""
        return self.fewest != self.most


class Autoscaling(ApiModel):
    """When the operator grows or shrinks an elastic generation fleet (minReplicas < maxReplicas), from
    the step windows the driver measures (docs/guides/job-lifecycle.md#elastic-generation). Separate
    thresholds, a run of windows and a cooldown keep a load that sits at a threshold from flapping."""

    policy_idle_above: float = Field(
        default=0.3,
        gt=0,
        lt=1,
        description="Add a generation worker when the policy waited for rollouts for more than this share "
        "of each of the last windowSteps step windows (status.progress.policyIdleShare), below maxReplicas.",
    )
    generation_gated_above: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Remove one, above minReplicas, when the generation engines sat idle behind the "
        "staleness gate for more than this share of each of those windows "
        "(status.progress.generationGatedShare) while the policy waited for rollouts less than half of "
        "policyIdleAbove (the band between the two keeps a fleet that just grew from shrinking back).",
    )
    window_steps: int = Field(
        default=5,
        ge=1,
        le=MAX_AUTOSCALING_WINDOW_STEPS,
        description="How many consecutive step windows, all measured since the fleet last changed, must "
        "agree before it changes.",
    )
    cooldown_seconds: int = Field(
        default=300,
        ge=0,
        le=86_400,
        description="At least this long between two changes of the fleet.",
    )


class GenerationWorkerGroup(WorkerGroup):
    """The generation pool: a fixed fleet of `replicas`, or an elastic one between minReplicas and
    maxReplicas that starts at `replicas`."""

    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="The fewest generation workers an elastic fleet shrinks to (at most replicas). Unset: "
        "replicas.",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="The most generation workers an elastic fleet grows to (at least replicas). Unset: "
        "replicas.",
    )
    autoscaling: Autoscaling = Field(
        default_factory=Autoscaling,
        description="The rule that grows and shrinks an elastic fleet; ignored by a fixed one.",
    )

    @property
    def fewest(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def most(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas


class ClusterSpec(ApiModel):
    """The Ray cluster a job runs on: one head and two worker pools (policy, generation)."""

    ray_version: str = Field(
        default="2.60.0",
        pattern=r"^2\.[0-9]+(\.[0-9]+)?$",
        max_length=16,
        description="Ray version of the trainer image; KubeRay uses it for version-specific defaults.",
    )
    head: HeadGroup = Field(default_factory=HeadGroup, description="The head pod (Ray head + driver).")
    policy_workers: WorkerGroup = Field(
        default_factory=WorkerGroup,
        description="Pool that trains the policy (computes log-probs, gradients, optimizer steps).",
    )
    generation_workers: GenerationWorkerGroup = Field(
        default_factory=GenerationWorkerGroup,
        description="Pool that samples rollouts from the latest synced policy weights; elastic between "
        "minReplicas and maxReplicas.",
    )
