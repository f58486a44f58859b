"""The ConfigMap watch against the real API server (issue 27): ConfigMaps anyone may label with a
job's name are not cached, and what is cached carries no data.

The operator's informer runs in-process against the local control plane, next to 100 foreign
ConfigMaps of 512 KiB (50 MiB) labelled `asyncgrpo.dev/job-name`, and one spec ConfigMap the
operator would write. The informer must hold only the latter, and its list must not bring the
foreign data into memory (it used to: the selector was the job-name label alone, full objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from asyncgrpo_operator import k8s, manifests, naming
from asyncgrpo_operator.cache import Cache
from asyncgrpo_operator.informer import Informer
from asyncgrpo_operator.manifests import Owner
from tests.cluster.rest import JSON, Api
from tests.e2e import test_operator as base
from tests.e2e.test_operator import create_job, job_manifest
from tests.operator.builders import job

asyncgrpo_crd = base.asyncgrpo_crd  # the fixture: the job that owns the spec ConfigMap

FOREIGN = 100
FOREIGN_BYTES = 512 << 10


async def cache_configmaps(kubeconfig: Path, namespace: str) -> tuple[Cache, int]:
    """The ConfigMaps the operator's watch caches in `namespace`, and the peak of memory allocated
    while it listed them."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api = k8s.Api(client.ApiClient(configuration=configuration))
    cache = Cache(scopes=(namespace,))
    listed = asyncio.Event()
    informer = Informer(
        api,
        "configmaps",
        namespace,
        cache.configmaps,
        changed=lambda _: None,
        listed=listed.set,
        label_selector=naming.SPEC_CONFIGMAP_SELECTOR,
        metadata_only=True,
    )
    tracemalloc.start()
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(listed.wait(), timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
    return cache, peak


@pytest.mark.cluster
def test_foreign_configmaps_with_a_jobs_label_are_neither_cached_nor_read(
    kube_api: Api, kubeconfig: Path, namespace: str, asyncgrpo_crd: JSON
) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(FOREIGN):
        labels = {naming.JOB_NAME_LABEL: f"job-{i}"}
        kube_api.create(
            path,
            {"metadata": {"name": f"job-{i}-spec", "labels": labels}, "data": {"blob": "x" * FOREIGN_BYTES}},
        )
    # The job exists: the garbage collector deletes a ConfigMap whose owner does not, and did so
    # before the informer listed it on a CI run.
    created = create_job(kube_api, namespace, job_manifest("demo"))
    owner = Owner(name="demo", uid=created["metadata"]["uid"])
    ours = manifests.spec_configmap(job(), owner)  # job demo's, as the operator writes it
    ours["metadata"]["namespace"] = namespace
    kube_api.create(path, ours)

    cache, peak = asyncio.run(cache_configmaps(kubeconfig, namespace))

    assert len(cache.configmaps) == 1, f"{len(cache.configmaps)} ConfigMaps cached"
    [view] = cache.configmaps.of((namespace, "demo"))
    assert (view.name, view.owner_uid) == ("demo-spec", owner.uid)
    assert view.digest == ours["metadata"]["annotations"][naming.SPEC_DIGEST_ANNOTATION]
    foreign_mib = FOREIGN * FOREIGN_BYTES >> 20
    assert peak < 8 << 20, f"listing took {peak / 2**20:.0f} MiB with {foreign_mib} MiB foreign"
