"""Merging a pool's `podTemplate` override into the pod template the operator rendered.

Pure, like manifests.py, which calls it last for every pool. The override was checked at admission
(asyncgrpo_api.v1alpha1.podtemplate says what may be set and why the rest may not), so the merge
only has to be faithful: what the override adds is added, what it sets is set, and the operator's
own entries (containers, volumes, labels, environment) keep their place and their values.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from asyncgrpo_api.v1alpha1.podtemplate import LIST_FIELDS, SET_FIELDS

Manifest = dict[str, Any]


def merge(template: Manifest, override: Mapping[str, Any] | None) -> Manifest:
    """The rendered pod template with `override` merged in (a new dict; inputs are not changed)."""
    if not override:
        return template
    out = copy.deepcopy(template)
    meta = override.get("metadata") or {}
    for key in ("labels", "annotations"):
        if meta.get(key):
            out.setdefault("metadata", {})[key] = {**dict(meta[key]), **out["metadata"].get(key, {})}
    spec = override.get("spec") or {}
    pod = out["spec"]
    for key in SET_FIELDS:
        if key == "securityContext" and key in spec:
            pod[key] = _merged(pod.get(key), spec[key])
        elif key in spec:
            pod[key] = copy.deepcopy(spec[key])
    for key in LIST_FIELDS:
        if spec.get(key):
            pod[key] = [*pod.get(key, []), *copy.deepcopy(list(spec[key]))]
    ours = {c["name"]: c for c in pod["containers"]}
    for container in spec.get("containers") or []:
        target = ours.get(container["name"])
        if target is None:
            pod["containers"].append(copy.deepcopy(dict(container)))
            continue
        for key in ("env", "envFrom", "volumeMounts"):
            if container.get(key):
                target[key] = [*target.get(key, []), *copy.deepcopy(list(container[key]))]
        if "securityContext" in container:
            target["securityContext"] = _merged(target.get("securityContext"), container["securityContext"])
    return out


def _merged(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any]) -> Manifest:
    """A securityContext with the override's keys over the operator's `restricted` defaults: an
    override that adds `fsGroup` keeps `runAsNonRoot` and the seccomp profile; one that sets
    `runAsNonRoot: false` (an image that runs as root) replaces just that."""
    return {**copy.deepcopy(dict(ours or {})), **copy.deepcopy(dict(theirs))}
