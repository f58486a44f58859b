"""The AsyncGRPORuntime resource: what a cluster administrator fixes for the jobs that name it.

Creating an AsyncGRPOJob is the right to run pods (docs/security.md): its author picks the image,
the ServiceAccount, the volumes, host access and, through a pool's podTemplate, securityContexts,
init containers and sidecars. An AsyncGRPORuntime, cluster-scoped and so writable only by whoever
RBAC lets write cluster-scoped objects, takes those choices back, like Kubeflow Trainer's
ClusterTrainingRuntime: a job names one (`spec.runtimeRef`), admission refuses what the runtime
does not allow (asyncgrpo_api.runtime_rules), and the operator renders the pods with the values
the runtime fixes (the ServiceAccount, the securityContexts), so a runtime is not advisory.

What the runtime does not mention it leaves to the job, and to Pod Security Admission and the
namespace's policies; what it allows is listed, so a new kind of volume or container is refused
until an administrator adds it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from asyncgrpo_api.v1alpha1.base import ApiModel, DnsSubdomain, ShortText
from asyncgrpo_api.v1alpha1.job import ObjectMeta

RUNTIME_KIND = "AsyncGRPORuntime"
RUNTIME_PLURAL = "asyncgrporuntimes"
RUNTIME_SINGULAR = "asyncgrporuntime"
RUNTIME_SHORT_NAMES = ("agrt",)

ImagePattern = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\s*]*\*?$")]
"""An exact image reference, or a prefix followed by one `*` (the only wildcard, at the end)."""

VolumeType = Literal[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
]
"""The sources of a core/v1 Volume, by their key in the Volume object."""

RESTRICTED_VOLUME_TYPES: tuple[VolumeType, ...] = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
"""The volume types Pod Security `restricted` allows: a runtime's default."""


class SeccompProfile(ApiModel):
    """A core/v1 SeccompProfile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description="Kind of profile.")
    localhost_profile: ShortText | None = Field(
        default=None, description="The profile's file on the node, for type Localhost."
    )


class Capabilities(ApiModel):
    """core/v1 Capabilities: the Linux capabilities added to and dropped from a container's."""

    add: list[ShortText] = Field(default_factory=list, max_length=64, description="Capabilities added.")
    drop: list[ShortText] = Field(default_factory=list, max_length=64, description="Capabilities dropped.")


class PodSecurity(ApiModel):
    """The keys of a core/v1 PodSecurityContext a runtime can fix."""

    run_as_non_root: bool | None = Field(default=None, description="Refuse to start containers as uid 0.")
    run_as_user: int | None = Field(default=None, ge=0, le=2**31 - 1, description="uid of the processes.")
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="gid of the processes.")
    fs_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Group owning the volumes.")
    supplemental_groups: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(
        default=None, max_length=64, description="Extra groups of the processes."
    )
    seccomp_profile: SeccompProfile | None = Field(default=None, description="The pods' seccomp profile.")


class ContainerSecurity(ApiModel):
    """The keys of a core/v1 SecurityContext a runtime can fix on every container."""

    allow_privilege_escalation: bool | None = Field(
        default=None, description="Whether a process may gain more privileges than its parent."
    )
    privileged: bool | None = Field(default=None, description="Run the container privileged.")
    read_only_root_filesystem: bool | None = Field(
        default=None, description="Mount the container's root filesystem read-only."
    )
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start the container as uid 0.")
    run_as_user: int | None = Field(default=None, ge=0, le=2**31 - 1, description="uid of the processes.")
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="gid of the processes.")
    capabilities: Capabilities | None = Field(default=None, description="Linux capabilities.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="The container's profile.")


class RuntimeSecurityContext(ApiModel):
    """securityContext values every pod and container of the runtime's jobs gets."""

    pod: PodSecurity = Field(
        default_factory=PodSecurity,
        description="Set on every pod, over the operator's defaults and a podTemplate's; a podTemplate "
        "that sets one of these keys to another value is refused.",
    )
    container: ContainerSecurity = Field(
        default_factory=ContainerSecurity,
        description="Set on every container (the operator's, sidecars, init containers), over the "
        "operator's defaults and a podTemplate's; a podTemplate that sets one of these keys to another "
        "value is refused.",
    )


def fixed_values(security: PodSecurity | ContainerSecurity) -> dict[str, Any]:
    """The securityContext keys a runtime fixes, as they appear in a pod (camelCase, set keys only)."""
    return security.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


class RuntimeAllowances(ApiModel):
    """What a job may add to its pods; what is not listed is refused at admission."""

    host_network: bool = Field(
        default=False, description="Whether a job may set spec.network.hostNetwork (the node's network)."
    )
    volumes: list[VolumeType] = Field(
        default=list(RESTRICTED_VOLUME_TYPES),
        max_length=32,
        description="Volume types a job may use, in spec.storage (pvc is persistentVolumeClaim) and in a "
        "podTemplate's volumes. The default is what Pod Security restricted allows; add hostPath to let "
        "jobs mount node directories. The operator's own volumes (emptyDir, the spec configMap) are "
        "always rendered.",
    )
    sidecars: bool = Field(
        default=False, description="Whether a podTemplate may add containers beside the operator's."
    )
    init_containers: bool = Field(default=False, description="Whether a podTemplate may add initContainers.")


class AsyncGRPORuntimeSpec(ApiModel):
    """What the cluster administrator fixes for every job that names this runtime."""

    images: list[ImagePattern] = Field(
        min_length=1,
        max_length=64,
        description="Images the pods may run: the trainer image (spec.image) and every image a podTemplate "
        "adds. An entry is an exact reference, or a prefix ending in `*` (registry.example.com/team/*); "
        "one exact entry fixes the image.",
    )
    service_account_name: DnsSubdomain | None = Field(
        default=None,
        description="The ServiceAccount of the pods. A job may leave spec.serviceAccountName unset or name "
        "this one. Unset: the pods run as the namespace's default ServiceAccount without an API token, and "
        "a job may name none.",
    )
    security_context: RuntimeSecurityContext = Field(
        default_factory=RuntimeSecurityContext,
        description="securityContext values the operator sets on every pod and container.",
    )
    allow: RuntimeAllowances = Field(
        default_factory=RuntimeAllowances, description="What a job may add to its pods."
    )


class AsyncGRPORuntime(ApiModel):
    """An administrator's runtime for AsyncGRPOJobs: fixed values and allowances (cluster-scoped)."""

    api_version: Literal["asyncgrpo.dev/v1alpha1"] = Field(
        default="asyncgrpo.dev/v1alpha1", description="asyncgrpo.dev/v1alpha1."
    )
    kind: Literal["AsyncGRPORuntime"] = Field(default="AsyncGRPORuntime", description="AsyncGRPORuntime.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: AsyncGRPORuntimeSpec = Field(description="What jobs naming this runtime get and may add.")
