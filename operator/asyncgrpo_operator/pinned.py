"""What an AsyncGRPORuntime fixes in a rendered pod template: its ServiceAccount and securityContexts.

Pure, like overrides.py, and applied after it, last for every pool (manifests.py): admission has
already refused a job whose podTemplate contradicts the runtime (asyncgrpo_api.runtime_rules), so
in the pods of an admitted job the runtime's values only confirm the job's; applying them anyway
is what makes the runtime more than advice. The image needs nothing here: admission and every
pass check the job's image against the runtime's list, and a job it does not allow is not run.
"""

from __future__ import annotations

import copy
from typing import Any

from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime, fixed_values

Manifest = dict[str, Any]


def pin(template: Manifest, runtime: AsyncGRPORuntime | None) -> Manifest:
    """The pod template with the runtime's values set (a new dict); unchanged without a runtime."""
    if runtime is None:
        return template
    out = copy.deepcopy(template)
    pod = out["spec"]
    pod.pop("serviceAccountName", None)
    pod.pop("automountServiceAccountToken", None)
    if runtime.spec.service_account_name is not None:
        pod["serviceAccountName"] = runtime.spec.service_account_name
    else:
        # As for a job that names none: the trainer never talks to the Kubernetes API.
        pod["automountServiceAccountToken"] = False
    security = runtime.spec.security_context
    pod["securityContext"] = {**pod.get("securityContext", {}), **fixed_values(security.pod)}
    for container in [*pod["containers"], *pod.get("initContainers", [])]:
        container["securityContext"] = {
            **container.get("securityContext", {}),
            **fixed_values(security.container),
        }
    return out
