"""Fault injection for tests: label an object and kwok's fault stages (kwok-stages.yaml) act on it.

Why labels and not direct status writes: a test that patches pod status races kwok, which owns the
status of pods on its nodes; a label hands the change to kwok, which then applies it like a kubelet
would report it (a Failed phase with a terminated container and exit code, or Ready=False on a node,
after which KCM's node-lifecycle controller adds the not-ready taints).
"""

from __future__ import annotations

from tests.cluster.rest import JSON, Api

FAULT_LABEL = "asyncgrpo.dev/fault"
EXIT_CODE_ANNOTATION = "asyncgrpo.dev/fault-exit-code"
REASON_ANNOTATION = "asyncgrpo.dev/fault-reason"
MESSAGE_ANNOTATION = "asyncgrpo.dev/fault-message"

POD_FAIL = "fail"  # Running -> Failed
POD_STUCK = "stuck"  # never becomes Ready (set it on the pod template, before the pod starts)
NODE_NOT_READY = "not-ready"


def fail_pod_patch(
    exit_code: int = 1, reason: str = "Error", message: str = "asyncgrpo fault injection"
) -> JSON:
    """The metadata to put on a pod (or a pod template) so kwok fails it once it runs."""
    return {
        "metadata": {
            "labels": {FAULT_LABEL: POD_FAIL},
            "annotations": {
                EXIT_CODE_ANNOTATION: str(exit_code),
                REASON_ANNOTATION: reason,
                MESSAGE_ANNOTATION: message,
            },
        }
    }


def fail_pod(
    api: Api,
    namespace: str,
    name: str,
    *,
    exit_code: int = 1,
    reason: str = "Error",
    message: str = "asyncgrpo fault injection",
) -> JSON:
    """Make a running pod on a kwok node go Failed with `exit_code` (like a container crash)."""
    patch = fail_pod_patch(exit_code, reason, message)
    return api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}", patch)


def make_node_not_ready(api: Api, node: str) -> JSON:
    """Turn a kwok node's Ready condition False (as if its kubelet reported a failure)."""
    return api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {FAULT_LABEL: NODE_NOT_READY}}})


def restore_node(api: Api, node: str) -> JSON:
    """Remove the fault label; kwok's node-initialize stage marks the node Ready again."""
    return api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {FAULT_LABEL: None}}})
