"""The chart installed on the local control plane, with the operator running as a local process.

kwok runs pods without containers, so the chart's operator Deployment never really runs. Instead
the operator runs here, on the API server's host, as the chart's ServiceAccount (a token from the
TokenRequest API, so every call it makes goes through the chart's RBAC), serving the webhook on
127.0.0.1 with the certificate the chart generated. The chart's own ValidatingWebhookConfiguration
points at it through `webhook.url`, scoped by `webhook.namespaceSelector` to namespaces labelled
for this installation, so other tests sharing the cluster never meet this webhook, and the operator
watches only this installation's jobs namespace, so it never reconciles their jobs.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import CHART, helm, set_args
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import Api, ApiError
from tests.webhook.server import free_port

SELECTOR_LABEL = "asyncgrpo.dev/webhook-e2e"
METRICS_READER = "prometheus"
"""The ServiceAccount (in the release namespace) the installation binds to the chart's
metrics-reader ClusterRole through `metrics.readers`, as a user binds their Prometheus."""
JOBS_PATH = "/apis/asyncgrpo.dev/v1alpha1/namespaces/{ns}/asyncgrpojobs"
RUNTIMES_PATH = "/apis/asyncgrpo.dev/v1alpha1/asyncgrporuntimes"

OPERATOR_MODULE = "asyncgrpo_operator.main"
"""The module `kopf run -m` loads: both roles in one process, as `python -m asyncgrpo_operator`'s
default `--role all` (until 2026-12-07 a heuristic fell back to a webhook-only stand-in when no
module but webhook.py called `configure_admission`; the webhook's own startup handler now does,
and the stand-in, which reconciles nothing and serves no /metrics, was picked)."""


@dataclass
class Kubectl:
    """kubectl as the cluster admin (what a user runs); returns the whole outcome, never raises."""

    binary: Path
    kubeconfig: Path
    cache_dir: Path

    def __call__(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}", *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)

    def apply(
        self, namespace: str, manifest: dict[str, Any] | str, *flags: str
    ) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self("apply", "-n", namespace, *flags, "-f", "-", stdin=text)


@dataclass
class Installation:
    """One `helm install` of the chart plus the local operator process serving its webhook."""

    cluster: LocalCluster
    helm_bin: Path
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="asyncgrpo-webhook-e2e-")))
    process: subprocess.Popen[bytes] | None = None
    module: str = ""
    keep_workdir: bool = False
    """Keep `workdir` after `uninstall` (the demo prints log paths in it); tests leave nothing."""
    progress_url_template: str | None = None
    """Where the operator reads the drivers' /progress (the tests serve it; kwok runs no driver)."""
    metrics_port: int | None = None
    """Serve the operator's /metrics on this port as the chart does: ASYNCGRPO_METRICS_PORT, over
    HTTPS with the webhook's certificate, for tokens RBAC lets get /metrics (`read_metrics`)."""
    values: dict[str, Any] = field(default_factory=dict)
    """More chart values (dotted keys), e.g. {"webhook.failurePolicy": "Ignore"}."""
    operator_env: dict[str, str] = field(default_factory=dict)
    """More of the local operator's environment: what the chart's Deployment sets for `values`
    (e.g. ASYNCGRPO_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME for kueue.manageJobsWithoutQueueName)."""
    watch_jobs_ns_only: bool = False
    """Install with operator.watchNamespaces = [jobs_ns]: the operator's rights on jobs and their
    children are then a Role in that namespace, not the ClusterRole."""

    @property
    def release(self) -> str:
        return f"wh-{self.suffix}"

    @property
    def namespace(self) -> str:
        return f"asyncgrpo-wh-{self.suffix}"

    @property
    def jobs_ns(self) -> str:
        """The one namespace the operator watches and the webhook validates (created by `install`).

        One explicit namespace, not a glob or all namespaces: the operator's resync lists jobs in
        the namespaces it is given, and other tests sharing the cluster run their own operators.
        """
        return f"t-wh-{self.suffix}-jobs"

    @property
    def fullname(self) -> str:
        return f"{self.release}-asyncgrpo-operator"

    @property
    def api(self) -> Api:
        return self.cluster.api

    @property
    def kubectl(self) -> Kubectl:
        binaries = Path(self.cluster.info()["binaries"]) / "bin"
        return Kubectl(binaries / "kubectl", self.cluster.kubeconfig, self.workdir / "kube-cache")

    @property
    def log(self) -> Path:
        return self.workdir / "operator.log"

    @property
    def tls_dir(self) -> Path:
        return self.workdir / "webhook-tls"

    # --- install / uninstall ---------------------------------------------------------------------

    def install(self) -> None:
        """Apply the CRD (Helm never upgrades crds/), then `helm install` with URL mode and a selector."""
        crds = self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        assert crds.returncode == 0, crds.stderr
        if self.watch_jobs_ns_only:  # the chart puts a Role there: the namespace must exist first
            self.jobs_namespace("jobs")
            self._helm_release("install", "--create-namespace")
        else:
            self._helm_release("install", "--create-namespace")
            self.jobs_namespace("jobs")

    def upgrade(self) -> None:
        """`helm upgrade` with the same values."""
        self._helm_release("upgrade")

    def _helm_release(self, verb: str, *extra: str) -> None:
        selector = json.dumps({"matchLabels": {SELECTOR_LABEL: self.release}})
        reader = json.dumps([{"kind": "ServiceAccount", "name": METRICS_READER, "namespace": self.namespace}])
        helm(
            verb,
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            *extra,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--set",
            f"webhook.url=https://127.0.0.1:{self.port}",
            "--set-json",
            f"webhook.namespaceSelector={selector}",
            "--set-json",
            f"metrics.readers={reader}",
            *(
                ["--set-json", f'operator.watchNamespaces=["{self.jobs_ns}"]']
                if self.watch_jobs_ns_only
                else []
            ),
            *set_args(self.values),
            helm_bin=self.helm_bin,
        )

    def uninstall(self) -> None:
        """Stop the operator, uninstall the release and remove the local work folder (credentials,
        the operator's log, kubectl's cache) unless `keep_workdir`."""
        try:
            self.stop_operator()
            self.delete_namespace(self.jobs_ns)
            helm(
                "uninstall",
                self.release,
                "--namespace",
                self.namespace,
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                helm_bin=self.helm_bin,
            )
            try:
                self.api.delete(f"/api/v1/namespaces/{self.namespace}")
            except ApiError as err:
                if err.status != 404:
                    raise
        finally:
            if not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the chart's credentials, as the pod would get them --------------------------------------

    @property
    def ray_token_key_file(self) -> Path:
        return self.workdir / "ray-token-key" / "key"

    def write_mounted_secret(self) -> None:
        """The webhook Secret's and the Ray token key Secret's files, as the kubelet would mount
        them into the operator pod."""
        secret = self.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{self.fullname}-webhook-tls")
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (self.tls_dir / key).write_bytes(base64.b64decode(secret["data"][key]))
        key_secret = self.api.get(
            f"/api/v1/namespaces/{self.namespace}/secrets/{self.fullname}-ray-token-key"
        )
        self.ray_token_key_file.parent.mkdir(parents=True, exist_ok=True)
        self.ray_token_key_file.write_bytes(base64.b64decode(key_secret["data"]["key"]))

    def token(self, service_account: str) -> str:
        """A TokenRequest token of a ServiceAccount of the release namespace (created if missing)."""
        accounts = f"/api/v1/namespaces/{self.namespace}/serviceaccounts"
        try:
            self.api.create(accounts, {"metadata": {"name": service_account}})
        except ApiError as err:
            if err.status != 409:
                raise
        return str(
            self.api.create(
                f"{accounts}/{service_account}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600},
                },
            )["status"]["token"]
        )

    def service_account_kubeconfig(self) -> Path:
        """A kubeconfig holding a TokenRequest token of the chart's ServiceAccount, nothing else."""
        sa = self.fullname
        token = self.token(sa)
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "local", "user": sa}}],
            "current-context": "sa",
        }
        path = self.workdir / "sa-kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # --- the operator process --------------------------------------------------------------------

    def start_operator(self, timeout: float = 90) -> None:
        """Run the operator as the chart's ServiceAccount; return once the webhook answers TLS."""
        self.write_mounted_secret()
        kubeconfig = self.service_account_kubeconfig()
        self.module = OPERATOR_MODULE
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "ASYNCGRPO_WEBHOOK_ADDR": "127.0.0.1",
            "ASYNCGRPO_WEBHOOK_PORT": str(self.port),
            "ASYNCGRPO_WEBHOOK_CERT_DIR": str(self.tls_dir),
            "ASYNCGRPO_WEBHOOK_CERT_CHECK_SECONDS": "2",
            "ASYNCGRPO_WATCH_NAMESPACES": self.jobs_ns,
            # as the chart's Deployment sets them: the Lease lives in the release namespace
            "ASYNCGRPO_LEADER_ELECTION": "true",
            "POD_NAMESPACE": self.namespace,
            "POD_NAME": f"{self.fullname}-local",
            "ASYNCGRPO_RAY_TOKEN_KEY_FILE": str(self.ray_token_key_file),
            "ASYNCGRPO_OPERATOR_POD_LABELS": (
                f"app.kubernetes.io/instance={self.release},app.kubernetes.io/name=asyncgrpo-operator"
            ),
        }
        env.update(self.operator_env)
        if self.progress_url_template:
            env["ASYNCGRPO_PROGRESS_URL_TEMPLATE"] = self.progress_url_template
        if self.metrics_port:  # as the chart's Deployment sets them (metrics.secure)
            env["ASYNCGRPO_METRICS_PORT"] = str(self.metrics_port)
            env["ASYNCGRPO_METRICS_SECURE"] = "true"
            env["ASYNCGRPO_METRICS_CERT_DIR"] = str(self.tls_dir)
            env["ASYNCGRPO_METRICS_CERT_CHECK_SECONDS"] = env["ASYNCGRPO_WEBHOOK_CERT_CHECK_SECONDS"]
        argv = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            f"--namespace={self.jobs_ns}",
            f"--liveness=http://127.0.0.1:{free_port()}/healthz",
            f"--module={OPERATOR_MODULE}",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self.webhook_answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"webhook not serving after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop_operator(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)

    def webhook_answers(self) -> bool:
        """A TLS handshake with the chart's CA succeeds on the webhook port."""
        context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
                context.wrap_socket(sock, server_hostname="127.0.0.1"),
            ):
                return True
        except OSError:
            return False

    def read_metrics(self, token: str | None) -> tuple[int, str]:
        """GET /metrics as a scraper does: HTTPS verified with the chart's CA, the bearer token if
        any. Returns the status and the body."""
        assert self.metrics_port is not None, "installed without metrics_port"
        request = urllib.request.Request(f"https://127.0.0.1:{self.metrics_port}/metrics")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the operator process (VmRSS)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    # --- namespaces for jobs ---------------------------------------------------------------------

    def jobs_namespace(self, name: str, *, validated: bool = True) -> str:
        """A namespace for test jobs; `validated` labels it so this installation's webhook applies."""
        full = f"t-wh-{self.suffix}-{name}"[:63].rstrip("-")
        labels = {"asyncgrpo.dev/test-namespace": "true"}
        if validated:
            labels[SELECTOR_LABEL] = self.release
        self.api.create("/api/v1/namespaces", {"metadata": {"name": full, "labels": labels}})
        return full

    def delete_all_jobs(self, namespace: str) -> None:
        """Delete every job in a namespace and wait until they are gone (between tests)."""
        outcome = self.kubectl(
            "delete", "asyncgrpojobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s"
        )
        assert outcome.returncode == 0, outcome.stderr

    def delete_namespace(self, name: str) -> None:
        try:
            self.api.delete(f"/api/v1/namespaces/{name}")
        except ApiError as err:
            if err.status != 404:
                raise


@contextmanager
def running_chart(
    cluster: LocalCluster,
    helm_bin: Path,
    *,
    progress_url_template: str | None = None,
    metrics_port: int | None = None,
) -> Iterator[Installation]:
    """helm install (URL-mode webhook) and the operator running as the chart's ServiceAccount;
    on exit the operator's log tail goes to stderr (shown when a test fails) and the chart is
    uninstalled."""
    installation = Installation(
        cluster, helm_bin, progress_url_template=progress_url_template, metrics_port=metrics_port
    )
    try:
        installation.install()
    except BaseException:  # interrupted or failed: nothing to uninstall, but the work folder exists
        shutil.rmtree(installation.workdir, ignore_errors=True)
        raise
    try:
        installation.start_operator()
        yield installation
    finally:
        sys.stderr.write(f"\n--- operator log ({installation.log}) ---\n{installation.log_tail(30)}\n")
        installation.uninstall()
