"""What the pods need from the cluster: storage, secrets, networking, scheduling and lifecycle."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from asyncgrpo_api.v1alpha1.base import (
    AbsolutePath,
    ApiModel,
    DnsLabel,
    DnsSubdomain,
    EnvName,
    Quantity,
    ShortText,
)


class PvcSource(ApiModel):
    """An existing PersistentVolumeClaim in the job's namespace."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class HostPathSource(ApiModel):
    """A directory on the node (single-node or node-local storage)."""

    path: AbsolutePath = Field(description="Absolute path on the node.")
    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(
        default="DirectoryOrCreate", description="core/v1 HostPathType check done by the kubelet."
    )


class EmptyDirSource(ApiModel):
    """Scratch space that lives and dies with the pod (lost on retry)."""

    medium: Literal["", "Memory"] = Field(default="", description="'' for node disk, Memory for tmpfs.")
    size_limit: Quantity | None = Field(default=None, description="Upper bound, e.g. 100Gi.")


class VolumeSpec(ApiModel):
    """One volume mounted into every pod that needs it; exactly one source must be set."""

    pvc: PvcSource | None = Field(default=None, description="Back the volume with a PVC.")
    host_path: HostPathSource | None = Field(default=None, description="Back the volume with a node path.")
    empty_dir: EmptyDirSource | None = Field(default=None, description="Back the volume with scratch space.")
    mount_path: AbsolutePath = Field(description="Where the volume is mounted in the containers.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> VolumeSpec:
        sources = [s for s in (self.pvc, self.host_path, self.empty_dir) if s is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of pvc, hostPath or emptyDir")
        return self

    @property
    def survives_pod_loss(self) -> bool:
        """Whether data written here outlives the pod (needed to resume after a retry)."""
        return self.empty_dir is None


Endpoint = Annotated[str, StringConstraints(max_length=1024, pattern=r"^https?://[^/\s]+/?$")]
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$"
BucketName = Annotated[str, StringConstraints(min_length=3, max_length=63, pattern=BUCKET_PATTERN)]
KeyPrefix = Annotated[str, StringConstraints(max_length=512, pattern=r"^([^/\s]+(/[^/\s]+)*)?$")]


class ObjectStoreCredentials(ApiModel):
    """The Secret holding the S3 access key pair; only its name is in the job, never the keys."""

    secret_name: DnsSubdomain = Field(description="Secret in the job's namespace holding the key pair.")
    access_key_id_key: ShortText = Field(
        default="AWS_ACCESS_KEY_ID", min_length=1, description="Key of the Secret holding the access key id."
    )
    secret_access_key_key: ShortText = Field(
        default="AWS_SECRET_ACCESS_KEY",
        min_length=1,
        description="Key of the Secret holding the secret access key.",
    )


class ObjectStoreTLS(ApiModel):
    """How the trainer checks the endpoint's TLS certificate (https endpoints only)."""

    ca_config_map: DnsSubdomain | None = Field(
        default=None,
        description="ConfigMap holding the CA bundle that signed the endpoint's certificate (PEM).",
    )
    ca_key: ShortText = Field(
        default="ca.crt", min_length=1, description="Key of the CA bundle in the ConfigMap."
    )
    insecure_skip_verify: bool = Field(
        default=False,
        description="Do not verify the endpoint's certificate (test setups only: anyone on the path can "
        "read and change checkpoints).",
    )


class ObjectStoreSpec(ApiModel):
    """An S3-compatible bucket that checkpoints, logs and curves are copied to while the job runs, so
    they outlive the pods and the volume (docs/guides/object-storage.md)."""

    endpoint: Endpoint = Field(
        description="The S3 endpoint's URL, scheme and host only, e.g. https://s3.us-east-1.amazonaws.com."
    )
    bucket: BucketName = Field(description="Bucket name (it must exist).")
    prefix: KeyPrefix = Field(
        default="",
        description="Key prefix, without leading or trailing slash; the job writes under "
        "<prefix>/<namespace>/<job name>/.",
    )
    region: ShortText = Field(
        default="us-east-1", min_length=1, description="Region the request signature names."
    )
    credentials: ObjectStoreCredentials = Field(description="Where the access key pair is read from.")
    tls: ObjectStoreTLS = Field(default_factory=ObjectStoreTLS, description="Certificate checks (https).")
    log_upload_interval_seconds: int = Field(
        default=30,
        ge=5,
        le=3600,
        description="How often the driver's log, step records and curves are uploaded.",
    )


class StorageSpec(ApiModel):
    """Volumes for checkpoints, model weights and caches, and datasets."""

    checkpoints: VolumeSpec | None = Field(
        default=None,
        description="Where checkpoints are written; use a PVC so retries and resumes find them.",
    )
    models: VolumeSpec | None = Field(
        default=None, description="Model weights and caches (e.g. HF_HOME), usually a read-mostly PVC."
    )
    data: VolumeSpec | None = Field(default=None, description="Training and validation datasets.")
    object_store: ObjectStoreSpec | None = Field(
        default=None,
        description="S3-compatible bucket that checkpoints, logs and curves are copied to; "
        "resumes read from it.",
    )


class SecretKeyRef(ApiModel):
    """One key of a Secret, exposed as one environment variable."""

    key: ShortText = Field(min_length=1, description="Key inside the Secret.")
    env: EnvName = Field(description="Environment variable name in the trainer containers.")


class SecretRef(ApiModel):
    """A Secret exposed to the trainer as environment (e.g. HF_TOKEN, WANDB_API_KEY)."""

    name: DnsSubdomain = Field(description="Secret name in the job's namespace.")
    keys: list[SecretKeyRef] = Field(
        default_factory=list,
        max_length=64,
        description="Keys to expose; empty exposes every key under its own name (envFrom).",
    )


class EnvVar(ApiModel):
    """A literal environment variable for the trainer containers."""

    name: EnvName = Field(description="Variable name.")
    value: str = Field(default="", max_length=4096, description="Variable value.")


class NetworkSpec(ApiModel):
    """Collective-communication settings, rendered as NCCL/Gloo environment on every pod."""

    nccl_socket_ifname: ShortText | None = Field(
        default=None, description="NCCL_SOCKET_IFNAME: interfaces NCCL may use, e.g. eth0 or ^lo,docker."
    )
    gloo_socket_ifname: ShortText | None = Field(
        default=None, description="GLOO_SOCKET_IFNAME for torch.distributed's Gloo backend."
    )
    ib_enabled: bool = Field(default=False, description="Use InfiniBand/RoCE; false sets NCCL_IB_DISABLE=1.")
    ib_hca: ShortText | None = Field(
        default=None, description="NCCL_IB_HCA: the HCAs to use when InfiniBand is on, e.g. mlx5."
    )
    host_network: bool = Field(
        default=False, description="Run pods in the node's network namespace (some RDMA setups need it)."
    )
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(
        default=None, description="NCCL_DEBUG log level."
    )


class SchedulerSpec(ApiModel):
    """Queueing, gang scheduling and priority: Kueue, KAI Scheduler or Volcano (docs/guides/scheduling.md)."""

    name: Literal["default", "kueue", "kai", "volcano"] = Field(
        default="default",
        description="default: kube-scheduler, no queue. kueue: the job is Kueue's workload (it owns a "
        "Workload with a pod set per Ray group) and its RayCluster runs once Kueue admits it, on the "
        "assigned flavors (the job is Queued until then; the job's own kueue.x-k8s.io/queue-name label "
        "does the same). kai: KAI Scheduler gang-schedules the "
        "pods (schedulerName kai-scheduler, kai.scheduler/queue). volcano: KubeRay's Volcano integration "
        "creates a PodGroup for the whole cluster (volcano.sh/queue-name, ray.io/priority-class-name).",
    )
    queue_name: DnsLabel | None = Field(
        default=None,
        description="Kueue LocalQueue (an alias of the job's kueue.x-k8s.io/queue-name label: when both are "
        "set they must agree), KAI queue or Volcano queue; required for kueue and kai.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None,
        description="PriorityClass of every pod of the job; Kueue and Volcano order and preempt by it.",
    )


class CleanupPolicy(ApiModel):
    """What happens to the RayCluster and the job once the job has finished."""

    on_success: Literal["DeleteCluster", "KeepCluster"] = Field(
        default="DeleteCluster",
        description="After success: delete the RayCluster (frees GPUs) or keep it for inspection.",
    )
    on_failure: Literal["DeleteCluster", "KeepCluster"] = Field(
        default="KeepCluster",
        description="After failure: keep the RayCluster for debugging (it keeps its GPUs; under Kueue "
        "only its head, its workers scaled to zero before the quota is given back) or delete it.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="Delete the AsyncGRPOJob itself (and so everything it owns) this long after it "
        "finished; unset keeps it forever.",
    )


class CheckpointSpec(ApiModel):
    """Where and how often the trainer checkpoints; retries and resumes start from the latest."""

    path: AbsolutePath = Field(
        default="/checkpoints",
        description="Directory for checkpoints; put it under storage.checkpoints.mountPath.",
    )
    every_steps: int = Field(default=10, ge=1, le=1_000_000, description="Checkpoint every N RL steps.")
    keep_last: int = Field(default=2, ge=1, le=1000, description="Checkpoints kept; older ones are removed.")


MIN_POLL_SECONDS = 2
"""The shortest pollSeconds: each running job costs the operator one HTTP read per interval, and
the operator reads every job's /progress with a fixed number of reads at once."""


class ProgressWatchSpec(ApiModel):
    """How the operator decides that a running driver has stalled."""

    stall_after_seconds: int = Field(
        default=900,
        ge=30,
        le=604_800,
        description="Report the Stalled condition when the driver's step has not advanced for this long.",
    )
    poll_seconds: int = Field(
        default=10,
        ge=MIN_POLL_SECONDS,
        le=3600,
        description="How often the operator reads the driver's /progress.",
    )

    @model_validator(mode="after")
    def _stall_longer_than_poll(self) -> ProgressWatchSpec:
        if self.stall_after_seconds <= self.poll_seconds:
            raise ValueError("stallAfterSeconds must be greater than pollSeconds")
        return self
