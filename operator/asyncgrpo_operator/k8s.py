"""The only module that talks to the Kubernetes API (kopf's own watches aside).

A thin, typed layer over kubernetes_asyncio's generic `call_api`: plain dicts in and out (the
plan works on dicts and pydantic models; the generated client's models would only be converted
back), one exception type with the HTTP status, and the few calls the reconciler makes. Every
write names the operator as field manager, and destructive calls carry UID preconditions so a
late delete can never hit a newer object that reused the name.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from asyncgrpo_api.v1alpha1 import GROUP, KIND, PLURAL, VERSION
from asyncgrpo_api.v1alpha1.admin_runtime import RUNTIME_PLURAL
from asyncgrpo_operator import naming
from asyncgrpo_operator.metrics import Metrics
from asyncgrpo_operator.metrics_access import Identity, identity_from_review

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
KUEUE_BASE: Final = "/apis/kueue.x-k8s.io/v1beta2"
REQUEST_TIMEOUT_SECONDS: Final = 30.0
LIST_PAGE_SIZE: Final = 500
METADATA_ONLY: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept headers that make the API server send objects without their data or spec (what
client-go's metadata informers ask for): a watch of what others may write stays small."""
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
"""The annotation of the BOOKMARK that ends a streaming list's initial events (`Api.watch`)."""
USER_AGENT: Final = f"{naming.MANAGER}/k8s"
"""Sent on every call, so the API server's audit log and metrics tell this client apart from
kopf's watches (user agent kopf/...) and from other controllers using the same credentials."""


class ApiError(Exception):
    """A failed API call: `status` is the HTTP code (0 when there was no answer), `message` the
    API server's own words (the Status object's message), `reason` its reason (e.g. Invalid)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.reason = reason


class Api:
    """An authenticated API client. Create with `await Api.connect()`; close with `close()`."""

    def __init__(self, api_client: client.ApiClient, metrics: Metrics | None = None) -> None:
        self._client = api_client
        self.identity = socket.gethostname()
        self.metrics = metrics

    @classmethod
    async def connect(cls, metrics: Metrics | None = None) -> Api:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG)."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException:
            await config.load_kube_config(client_configuration=configuration)
        api_client = client.ApiClient(configuration=configuration)
        api_client.user_agent = USER_AGENT
        return cls(api_client, metrics)

    async def close(self) -> None:
        await self._client.close()

    # --- generic ---------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        """One API call; returns the decoded JSON body. Raises ApiError on any non-2xx answer."""
        started, code = time.monotonic(), 0
        try:
            result = await self._call(
                method, path, body=body, query=query, content_type=content_type, accept=accept
            )
            code = 200
            return result
        except ApiError as err:
            code = err.status
            raise
        finally:
            if self.metrics is not None:
                verb, resource = verb_and_resource(method, path)
                self.metrics.api_requests.labels(verb, resource, str(code)).inc()
                self.metrics.api_seconds.labels(verb).observe(time.monotonic() - started)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
        accept: str,
    ) -> Obj:
        headers = {"Accept": accept, "Content-Type": content_type}
        try:
            result = await self._client.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as exc:
            message, reason = _status_of(exc)
            raise ApiError(int(exc.status or 0), message, reason) from exc
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise ApiError(0, f"{method} {path}: {exc!r}") from exc
        return result if isinstance(result, dict) else {}

    async def get_or_none(self, path: str) -> Obj | None:
        try:
            return await self.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def list_items(self, path: str, label_selector: str | None = None) -> list[Obj]:
        query = {"labelSelector": label_selector} if label_selector else None
        answer = await self.request("GET", path, query=query)
        return list(answer.get("items") or [])

    async def list_all(
        self, path: str, label_selector: str | None = None, *, metadata_only: bool = False
    ) -> tuple[list[Obj], str]:
        """Every object of a collection (only their metadata if `metadata_only`), and the list's
        resourceVersion, from which a watch continues. For collections whose objects are the
        operator's own (jobs); what others write is read page by page (`list_pages`)."""
        items: list[Obj] = []
        version = ""
        async for page, at in self.list_pages(path, label_selector, metadata_only=metadata_only):
            items += page
            version = at
        return items, version

    async def list_pages(
        self,
        path: str,
        label_selector: str | None = None,
        *,
        metadata_only: bool = False,
        page_size: int = LIST_PAGE_SIZE,
    ) -> AsyncIterator[tuple[list[Obj], str]]:
        """A collection in pages of `page_size` objects, each with the list's resourceVersion
        ("" until the last page): a caller that keeps only what it needs of each page holds one
        page at a time, not the whole collection."""
        token = ""
        while True:
            query = {"limit": str(page_size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            accept = METADATA_ONLY_LIST if metadata_only else "application/json"
            answer = await self.request("GET", path, query=query, accept=accept)
            meta = answer.get("metadata") or {}
            token = str(meta.get("continue") or "")
            yield list(answer.get("items") or []), "" if token else str(meta.get("resourceVersion") or "")
            if not token:
                return

    async def watch(
        self,
        path: str,
        label_selector: str | None,
        resource_version: str,
        timeout_seconds: int,
        *,
        metadata_only: bool = False,
        initial_events: bool = False,
    ) -> AsyncIterator[Obj]:
        """The watch events of a collection from `resource_version` on, until the API server ends
        the stream (after `timeout_seconds`). A 410 Gone (the version was compacted away) comes as
        an ERROR event, as the API server sends it; other refusals raise ApiError.

        `initial_events` (with `resource_version` ""): a streaming list (Kubernetes' WatchList):
        the stream begins with an ADDED event per object that exists, then a BOOKMARK annotated
        `INITIAL_EVENTS_END` at the list's resourceVersion, then goes on as a watch. The list
        arrives one object at a time instead of in pages. An API server without it (before 1.32,
        or 1.33 where it is off by default) refuses the request (400 or 422)."""
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if initial_events:
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if self.metrics is not None:
            self.metrics.api_requests.labels(*verb_and_resource("WATCH", path), "200").inc()
        try:
            response = await self._client.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": METADATA_ONLY if metadata_only else "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=REQUEST_TIMEOUT_SECONDS, sock_read=timeout_seconds + 30
                ),
            )
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise ApiError(0, f"watch {path}: {exc!r}") from exc
        try:
            if response.status != 200:
                raise ApiError(response.status, (await response.text())[:1024])
            # One event per line; a line (an object others wrote: up to the API server's limit)
            # is joined once, when its end arrives, and dropped once decoded.
            pieces: list[bytes] = []
            async for chunk in response.content.iter_any():
                rest = chunk
                while (end := rest.find(b"\n")) >= 0:
                    line = b"".join((*pieces, rest[:end]))
                    pieces, rest = [], rest[end + 1 :]
                    if line.strip():
                        yield json.loads(line)
                pieces.append(rest)
        except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise ApiError(0, f"watch {path}: {exc!r}") from exc
        finally:
            response.release()

    # --- jobs ----------------------------------------------------------------------------------

    @staticmethod
    def current_namespace() -> str:
        """The kubeconfig context's namespace, else "default" (what kubectl uses without -n)."""
        try:
            _, context = config.list_kube_config_contexts()
        except (ConfigException, OSError, TypeError):
            return "default"
        return str((context or {}).get("context", {}).get("namespace") or "default")

    async def get_job(self, namespace: str, name: str) -> Obj | None:
        return await self.get_or_none(_job_path(namespace, name))

    async def list_jobs(self, namespace: str | None = None) -> tuple[list[Obj], str]:
        """Jobs in one namespace, or in all namespaces when None, and the list's resourceVersion."""
        base = f"/apis/{GROUP}/{VERSION}"
        path = f"{base}/namespaces/{namespace}/{PLURAL}" if namespace else f"{base}/{PLURAL}"
        return await self.list_all(path)

    async def patch_job_status(self, namespace: str, name: str, resource_version: str, status: Obj) -> Obj:
        """Write the whole status through /status, failing with 409 if the job changed since it
        was read (optimistic concurrency: a stale decision is re-planned, never written)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return await self.request(
            "PATCH",
            _job_path(namespace, name) + "/status",
            body=body,
            content_type=MERGE_PATCH,
            query={"fieldManager": naming.MANAGER},
        )

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(_job_path(namespace, name), uid)

    # --- children ------------------------------------------------------------------------------

    async def list_rayclusters(self, namespace: str, job_name: str) -> list[Obj]:
        path = _rayclusters_path(namespace)
        return await self.list_items(path, f"{naming.JOB_NAME_LABEL}={job_name}")

    async def list_pods(self, namespace: str, job_name: str) -> list[Obj]:
        return await self.list_items(
            f"/api/v1/namespaces/{namespace}/pods", f"{naming.JOB_NAME_LABEL}={job_name}"
        )

    async def create_workload(self, manifest: Obj) -> Obj | None:
        namespace = manifest["metadata"]["namespace"]
        return await self._create(f"{KUEUE_BASE}/namespaces/{namespace}/workloads", manifest)

    async def patch_workload(
        self, namespace: str, name: str, resource_version: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        """Merge-patch a Workload (or its status), failing with 409 if Kueue changed it since it was
        read: Kueue's newer decision wins, and the next pass plans on it."""
        body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version}}
        path = f"{KUEUE_BASE}/namespaces/{namespace}/workloads/{name}" + ("/status" if status else "")
        return await self.request(
            "PATCH", path, body=body, content_type=MERGE_PATCH, query={"fieldManager": naming.MANAGER}
        )

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(f"{KUEUE_BASE}/namespaces/{namespace}/workloads/{name}", uid)

    async def get_resource_flavor(self, name: str) -> Obj | None:
        return await self.get_or_none(f"{KUEUE_BASE}/resourceflavors/{name}")

    async def get_runtime(self, name: str) -> Obj | None:
        """An AsyncGRPORuntime (cluster-scoped), or None when it does not exist."""
        return await self.get_or_none(f"/apis/{GROUP}/{VERSION}/{RUNTIME_PLURAL}/{name}")

    async def get_priority_class(self, name: str) -> Obj | None:
        return await self.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    async def get_workload_priority_class(self, name: str) -> Obj | None:
        return await self.get_or_none(f"{KUEUE_BASE}/workloadpriorityclasses/{name}")

    async def get_local_queue(self, namespace: str, name: str) -> Obj | None:
        """A Kueue LocalQueue, or None when it does not exist (or Kueue's API is not served)."""
        return await self.get_or_none(f"{KUEUE_BASE}/namespaces/{namespace}/localqueues/{name}")

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> Obj:
        """Write the job's spec.suspend (JSON patch with a UID test: never a namesake's)."""
        ops = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/spec/suspend", "value": suspend},
        ]
        return await self.request(
            "PATCH",
            _job_path(namespace, name),
            body=ops,
            content_type=JSON_PATCH,
            query={"fieldManager": naming.MANAGER},
        )

    async def set_raycluster_spec(
        self, namespace: str, name: str, uid: str, suspend: bool, spec: Obj | None
    ) -> Obj:
        """Suspend a RayCluster in place (`spec` None), or replace its whole spec (UID test)."""
        if spec is None:
            op: Obj = {"op": "add", "path": "/spec/suspend", "value": suspend}
        else:
            op = {"op": "replace", "path": "/spec", "value": {**spec, "suspend": suspend}}
        return await self._patch_raycluster(namespace, name, uid, [op])

    async def scale_raycluster_workers(self, namespace: str, name: str, uid: str, groups: int) -> Obj:
        """Every worker group of a RayCluster to zero replicas (minReplicas too; UID test)."""
        ops = [
            {"op": "add", "path": f"/spec/workerGroupSpecs/{i}/{field}", "value": 0}
            for i in range(groups)
            for field in ("replicas", "minReplicas")
        ]
        return await self._patch_raycluster(namespace, name, uid, ops)

    async def scale_generation_workers(
        self, namespace: str, name: str, uid: str, *, group: int, replicas: int, remove: tuple[str, ...]
    ) -> Obj:
        """The generation group's replicas (UID test), and the pods KubeRay deletes for a shrink."""
        base = f"/spec/workerGroupSpecs/{group}"
        ops: list[Obj] = [{"op": "add", "path": f"{base}/replicas", "value": replicas}]
        if remove:
            strategy = {"workersToDelete": list(remove)}
            ops.append({"op": "add", "path": f"{base}/scaleStrategy", "value": strategy})
        return await self._patch_raycluster(namespace, name, uid, ops)

    async def _patch_raycluster(self, namespace: str, name: str, uid: str, ops: list[Obj]) -> Obj:
        """A JSON patch of the RayCluster `name`, applied only while its UID is `uid`."""
        test: Obj = {"op": "test", "path": "/metadata/uid", "value": uid}
        return await self.request(
            "PATCH",
            f"{_rayclusters_path(namespace)}/{name}",
            body=[test, *ops],
            content_type=JSON_PATCH,
            query={"fieldManager": naming.MANAGER},
        )

    async def stream_pod_log(
        self, namespace: str, pod: str, container: str, *, follow: bool
    ) -> AsyncIterator[bytes]:
        """A container's log as it arrives (kubectl logs [-f]); no timeout while following."""
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        query = [("container", container), ("follow", "true" if follow else "false")]
        try:
            response = await self._client.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": "*/*"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=None if follow else REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as exc:
            message, reason = _status_of(exc)
            raise ApiError(int(exc.status or 0), message, reason) from exc
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        finally:
            response.release()

    async def create_configmap(self, manifest: Obj) -> Obj | None:
        """Create a ConfigMap; returns it as created, or None when one of that name exists."""
        path = f"/api/v1/namespaces/{manifest['metadata']['namespace']}/configmaps"
        return await self._create(path, manifest)

    async def find_configmap(self, namespace: str, name: str) -> Obj | None:
        """One ConfigMap by name, read with a list (the operator may list ConfigMaps, not get them)."""
        items = await self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/configmaps",
            query={"fieldSelector": f"metadata.name={name}"},
        )
        found = items.get("items") or []
        return found[0] if found else None

    async def replace_configmap_data(self, manifest: Obj, resource_version: str) -> Obj:
        """Replace an existing ConfigMap's data, labels and annotations, failing with 409 if it
        changed since `resource_version`: the caller checked at that version that the ConfigMap is
        its own, so the write cannot land on one that changed hands since."""
        meta = manifest["metadata"]
        body = {
            "metadata": {
                "resourceVersion": resource_version,
                "labels": meta.get("labels") or {},
                "annotations": meta.get("annotations") or {},
            },
            "data": manifest["data"],
        }
        return await self.request(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/configmaps/{meta['name']}",
            body=body,
            content_type=MERGE_PATCH,
            query={"fieldManager": naming.MANAGER},
        )

    async def create_secret(self, manifest: Obj) -> Obj | None:
        """Create a Secret; returns it as created, or None when one of that name exists. The
        operator may create Secrets and read none (raytoken.py says why it needs no read)."""
        return await self._create(f"/api/v1/namespaces/{manifest['metadata']['namespace']}/secrets", manifest)

    async def create_network_policy(self, manifest: Obj) -> Obj | None:
        """Create a NetworkPolicy; returns it as created, or None when one of that name exists."""
        return await self._create(_network_policies_path(manifest["metadata"]["namespace"]), manifest)

    async def get_network_policy(self, namespace: str, name: str) -> Obj | None:
        return await self.get_or_none(f"{_network_policies_path(namespace)}/{name}")

    async def replace_network_policy(self, manifest: Obj, resource_version: str) -> Obj:
        """Replace a NetworkPolicy, failing with 409 if it changed since `resource_version`: the
        caller checked at that version that it is its own."""
        meta = manifest["metadata"]
        body = {**manifest, "metadata": {**meta, "resourceVersion": resource_version}}
        path = f"{_network_policies_path(meta['namespace'])}/{meta['name']}"
        return await self.request("PUT", path, body=body, query={"fieldManager": naming.MANAGER})

    async def create_raycluster(self, manifest: Obj) -> Obj | None:
        """Create a RayCluster; returns it as created, or None when it already exists (idempotent:
        names are per attempt)."""
        namespace = manifest["metadata"]["namespace"]
        path = _rayclusters_path(namespace)
        return await self._create(path, manifest)

    async def dry_run_raycluster(self, manifest: Obj) -> None:
        """POST a RayCluster with dryRun=All: the API server runs its whole create path (schema,
        CEL, admission webhooks and policies, quota) and stores nothing. Raises its refusal."""
        namespace = manifest["metadata"]["namespace"]
        path = _rayclusters_path(namespace)
        await self.request(
            "POST", path, body=manifest, query={"dryRun": "All", "fieldManager": naming.MANAGER}
        )

    async def delete_raycluster(self, namespace: str, name: str, uid: str) -> None:
        path = _rayclusters_path(namespace)
        await self._delete(f"{path}/{name}", uid)

    # --- who may read /metrics (metrics_access.py) -----------------------------------------------

    async def review_token(self, token: str) -> Identity | None:
        """A TokenReview: the token's identity, or None when the API server does not know it."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        answer = await self.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=review)
        return identity_from_review(answer.get("status") or {})

    async def review_access(self, identity: Identity, path: str, verb: str) -> bool:
        """A SubjectAccessReview: whether `identity` may `verb` the non-resource URL `path`."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": identity.username,
                "uid": identity.uid,
                "groups": list(identity.groups),
                "extra": {key: list(values) for key, values in identity.extra},
                "nonResourceAttributes": {"path": path, "verb": verb},
            },
        }
        answer = await self.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)
        return (answer.get("status") or {}).get("allowed") is True

    # --- events ----------------------------------------------------------------------------------

    async def post_event(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the job (what `kubectl describe agj` shows)."""
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": naming.MANAGER},
            "reportingComponent": naming.MANAGER,
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)

    # --- leases (leader election) --------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        return await self.get_or_none(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")

    async def create_lease(self, namespace: str, lease: Obj) -> bool:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return await self._create(path, lease) is not None

    async def replace_lease(self, namespace: str, name: str, lease: Obj) -> Obj:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        return await self.request("PUT", path, body=lease, query={"fieldManager": naming.MANAGER})

    # --- helpers -------------------------------------------------------------------------------

    async def _create(self, path: str, manifest: Obj) -> Obj | None:
        """The created object, or None when one of that name exists already (409)."""
        try:
            return await self.request("POST", path, body=manifest, query={"fieldManager": naming.MANAGER})
        except ApiError as err:
            if err.status == 409:
                return None
            raise

    async def _delete(self, path: str, uid: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            await self.request("DELETE", path, body=body)
        except ApiError as err:
            if err.status not in (404, 409):  # gone already, or a newer object has the name
                raise


def verb_and_resource(method: str, path: str) -> tuple[str, str]:
    """The Kubernetes verb and resource of a call, for metrics: ("list", "pods"),
    ("patch", "asyncgrpojobs/status"), ("create", "rayclusters")."""
    parts = [p for p in path.split("?", maxsplit=1)[0].split("/") if p]
    # /api/v1/... or /apis/<group>/<version>/...; then optionally namespaces/<ns>/
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if rest else "unknown"
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verbs = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch"}
    return verbs.get(method.upper(), method.lower()), resource


def _rayclusters_path(namespace: str) -> str:
    return f"/apis/{naming.RAY_GROUP}/{naming.RAY_VERSION}/namespaces/{namespace}/{naming.RAYCLUSTER_PLURAL}"


def _network_policies_path(namespace: str) -> str:
    return f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"


def _job_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


def _status_of(exc: ApiException) -> tuple[str, str]:
    """(message, reason) of a failed call: from the metav1.Status body the API server sends, else
    the raw body or the HTTP reason phrase."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        status = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status" and status.get("message"):
        return str(status["message"]), str(status.get("reason") or "")
    return str(body or exc.reason or exc), ""
