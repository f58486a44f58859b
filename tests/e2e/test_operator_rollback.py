"""A job's status the operator cannot fully read keeps the job's running attempt (issue 47 item 8).

Like tests/e2e/test_operator.py (whose fixtures these reuse), the operator is a subprocess
watching the test's namespace. Each job first loses its head pod once, so that it runs attempt 1:
a status read as empty would start over at attempt 0 and delete attempt 1's RayCluster.

- A rollback: a newer operator, with the newer CRD that knows its fields, wrote status fields this
  version does not know, at any depth; Helm leaves a chart's CRDs as they are on a rollback, so
  the API server keeps serving them. The rolled-back operator reads the rest of the status.
- A status it cannot read at all (wiped through the status subresource by whoever may write it):
  the operator rebuilds it from the job's RayCluster and says so with a Warning event.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
import yaml

from tests.cluster import faults
from tests.cluster.rest import JSON, Api
from tests.cluster.samples import wait_until
from tests.e2e import test_operator as base
from tests.e2e.test_operator import (
    CRD_FILE,
    JOBS,
    OperatorProcess,
    ProgressServer,
    create_job,
    end_driver,
    events,
    get_job,
    head_pod,
    job_manifest,
    live_rayclusters,
    rayclusters,
    run_until_running,
    wait_phase,
)

pytestmark = pytest.mark.cluster

# The fixtures of tests/e2e/test_operator.py: the CRD, the operator subprocess, the drivers' /progress.
asyncgrpo_crd = base.asyncgrpo_crd
operator = base.operator
driver_progress = base.driver_progress

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/asyncgrpojobs.asyncgrpo.dev"


@pytest.fixture
def newer_crd(kube_api: Api, asyncgrpo_crd: JSON) -> Iterator[None]:
    """The CRD as a newer version would ship it: status fields this version does not know, at the
    top, in progress and in every condition. The project's own CRD is applied back afterwards."""
    ours: JSON = yaml.safe_load(CRD_FILE.read_text())
    newer = copy.deepcopy(ours)
    for version in newer["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        status["fieldOfANewerVersion"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        status["progress"]["properties"]["figureOfANewerVersion"] = {"type": "number"}
        status["conditions"]["items"]["properties"]["newerKey"] = {"type": "integer"}
    kube_api.apply(CRD_PATH, json.dumps(newer))
    yield
    kube_api.apply(CRD_PATH, json.dumps(ours))


def status_path(ns: str, name: str) -> str:
    return f"{JOBS.format(ns=ns)}/{name}/status"


def running_attempt_1(api: Api, ns: str, name: str, progress: ProgressServer) -> JSON:
    """The job running its second attempt (its first head pod failed), and that attempt's cluster."""
    create_job(api, ns, job_manifest(name))
    run_until_running(api, ns, name, progress)
    faults.fail_pod(api, ns, head_pod(api, ns, f"{name}-0")["metadata"]["name"], exit_code=137)

    def retried() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        return status if (status.get("attempt"), status.get("phase")) == (1, "Running") else None

    wait_until(retried, f"{name} running attempt 1", timeout=90)
    wait_until(lambda: live_rayclusters(api, ns, name) == [f"{name}-1"] or None, f"only {name}-1 left")
    return only_cluster(api, ns, name)


def only_cluster(api: Api, ns: str, name: str) -> JSON:
    found = [rc for rc in rayclusters(api, ns, name) if not rc["metadata"].get("deletionTimestamp")]
    assert len(found) == 1, [rc["metadata"]["name"] for rc in found]
    return found[0]


def goes_on_and_completes(api: Api, ns: str, name: str, progress: ProgressServer, cluster_uid: str) -> None:
    """The operator reads the driver's progress into the status, then the driver's exit ends the
    job: attempt 1 on the same RayCluster all along."""
    progress.doc = {**progress.doc, "step": 7, "policyVersion": 7}

    def stepped() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        return status if (status.get("progress") or {}).get("step") == 7 else None

    status = wait_until(stepped, f"{name} status.progress.step 7", timeout=60)
    assert (status["attempt"], status["rayClusterName"], status["phase"]) == (1, f"{name}-1", "Running")
    assert only_cluster(api, ns, name)["metadata"]["uid"] == cluster_uid
    progress.doc = {**progress.doc, "step": 20, "state": "succeeded"}
    end_driver(api, ns, head_pod(api, ns, f"{name}-1"), 0)
    done = wait_phase(api, ns, name, "Succeeded", "DriverSucceeded")
    assert (done["attempt"], done["restarts"]) == (1, 1)


def test_a_rolled_back_operator_keeps_the_attempt_a_newer_one_left_with_fields_it_does_not_know(
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
    newer_crd: None,
) -> None:
    name = "rolled"
    cluster = running_attempt_1(kube_api, namespace, name, driver_progress)
    operator.stop()  # the newer operator goes, leaving its status behind

    stored = get_job(kube_api, namespace, name)["status"]
    conditions = [{**c, "newerKey": 1} for c in stored["conditions"]]
    newer = {
        "fieldOfANewerVersion": {"nested": {"deeper": ["a", "b"]}},
        "progress": {"figureOfANewerVersion": 0.5},
        "conditions": conditions,
    }

    def written() -> JSON | None:  # once the API server serves the newer CRD, it keeps the fields
        status = kube_api.merge_patch(status_path(namespace, name), {"status": newer})["status"]
        kept = status.get("fieldOfANewerVersion") and "figureOfANewerVersion" in status["progress"]
        return status if kept and all("newerKey" in c for c in status["conditions"]) else None

    wait_until(written, "the newer version's status fields stored", timeout=30, interval=0.5)

    operator.start()  # the rolled-back operator
    operator.wait_live()
    goes_on_and_completes(kube_api, namespace, name, driver_progress, cluster["metadata"]["uid"])
    assert "StatusRebuilt" not in {e["reason"] for e in events(kube_api, namespace, name)}


def test_a_status_wiped_through_the_status_subresource_is_rebuilt_from_the_jobs_raycluster(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    name = "wiped"
    cluster = running_attempt_1(kube_api, namespace, name, driver_progress)

    assert not kube_api.merge_patch(status_path(namespace, name), {"status": None}).get("status")

    def rebuilt() -> JSON | None:
        status = get_job(kube_api, namespace, name).get("status") or {}
        return status if status.get("rayClusterName") else None

    status = wait_until(rebuilt, "the status naming a RayCluster again", timeout=60)
    assert (status["attempt"], status["restarts"], status["rayClusterName"]) == (1, 1, f"{name}-1")
    assert only_cluster(kube_api, namespace, name)["metadata"]["uid"] == cluster["metadata"]["uid"]

    def warned() -> JSON | None:  # events follow the status write that announced them
        found = [e for e in events(kube_api, namespace, name) if e["reason"] == "StatusRebuilt"]
        return found[0] if found else None

    warning = wait_until(warned, "a StatusRebuilt event", timeout=15)
    assert warning["type"] == "Warning" and f"{name}-1" in warning["message"]
    goes_on_and_completes(kube_api, namespace, name, driver_progress, cluster["metadata"]["uid"])
