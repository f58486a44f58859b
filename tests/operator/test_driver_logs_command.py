"""`asyncgrpo logs`: what it shows for a job in each state (the API calls are in tests/e2e/test_kueue.py,
against a real API server; kwok's fake nodes serve no container logs, so streaming itself is not
exercised there), and that a streamed log reaches the terminal without its control sequences (from
a local stand-in for the API server's three answers)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from asyncgrpo_operator.driverlog import Files, NoSuchAttempt, Stored, Stream, decide

OUTPUTS = {
    "volume": "PersistentVolumeClaim ckpt at /ck",
    "driverLog": "/ck/logs/driver-attempt-1.log",
    "steps": "/ck/logs/steps.jsonl",
    "tensorboard": "/ck/tensorboard",
}


def the_job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "demo"}, "status": status}


def head(name: str, driver_state: dict[str, Any], *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [{"name": "driver", "state": driver_state}]}}


def test_a_running_driver_is_streamed_and_followed_on_request() -> None:
    job = the_job(phase="Running", rayClusterName="demo-1", outputs=OUTPUTS)
    assert decide(job, [head("demo-1-head-x", {"running": {}})], follow=True) == Stream("demo-1-head-x", True)
    assert decide(job, [head("demo-1-head-x", {"running": {}})], follow=False) == Stream(
        "demo-1-head-x", False
    )


def test_a_finished_driver_whose_pod_is_kept_is_printed_once() -> None:
    job = the_job(phase="Failed", rayClusterName="demo-1", outputs=OUTPUTS)
    assert decide(job, [head("p", {"terminated": {"exitCode": 1}})], follow=True) == Stream("p", False)


def test_once_the_pod_is_gone_it_says_where_the_files_are_and_on_which_volume() -> None:
    job = the_job(phase="Succeeded", reason="DriverSucceeded", outputs=OUTPUTS)
    outcome = decide(job, [head("old", {"running": {}}, deleting=True)], follow=True)
    assert isinstance(outcome, Files)
    assert "Succeeded: DriverSucceeded" in outcome.text and "RayCluster is gone" in outcome.text
    for value in OUTPUTS.values():
        assert value in outcome.text


def test_a_queued_job_has_no_driver_yet() -> None:
    outcome = decide(
        the_job(phase="Queued", reason="Pending", rayClusterName="demo-0", outputs=OUTPUTS), [], follow=True
    )
    assert isinstance(outcome, Files) and "is Queued: Pending; its driver has not started yet" in outcome.text


def test_once_the_pods_are_gone_a_job_with_an_object_store_reads_the_log_from_it() -> None:
    store = {"endpoint": "https://s3.example.com", "bucket": "ckpts", "credentials": {"secretName": "s3"}}
    job = the_job(phase="Failed", reason="BackoffLimitExceeded", outputs=OUTPUTS)
    job["metadata"]["namespace"] = "rl"
    job["spec"] = {"storage": {"objectStore": store}}

    outcome = decide(job, [], follow=True)

    assert isinstance(outcome, Stored)
    assert (outcome.store.bucket, outcome.namespace) == ("ckpts", "rl")
    assert "its RayCluster is gone" in outcome.why


def test_an_earlier_attempt_is_read_from_the_object_store_even_while_a_newer_one_runs() -> None:
    store = {"endpoint": "https://s3.example.com", "bucket": "ckpts", "credentials": {"secretName": "s3"}}
    job = the_job(phase="Running", attempt=2, rayClusterName="demo-2", outputs=OUTPUTS)
    job["spec"] = {"storage": {"objectStore": store}}
    running = [head("demo-2-head-x", {"running": {}})]

    outcome = decide(job, running, follow=True, attempt=0)

    assert isinstance(outcome, Stored) and outcome.attempt == 0
    assert "attempt 0 of job demo ended (the job is at attempt 2)" in outcome.why
    assert decide(job, running, follow=True, attempt=2) == Stream("demo-2-head-x", True)  # the current one


def test_an_earlier_attempt_without_an_object_store_is_named_on_the_volume() -> None:
    job = the_job(phase="Succeeded", attempt=1, outputs=OUTPUTS)
    job["spec"] = {"checkpoint": {"path": "/ck"}}

    outcome = decide(job, [], follow=False, attempt=0)

    assert isinstance(outcome, Files)
    assert "/ck/logs/driver-attempt-0.log on the PersistentVolumeClaim ckpt at /ck" in outcome.text


def test_an_attempt_the_job_has_not_reached_is_refused_with_the_attempts_it_has() -> None:
    outcome = decide(the_job(phase="Running", attempt=1), [], follow=False, attempt=3)
    assert outcome == NoSuchAttempt("job demo has no attempt 3: its attempts so far are 0 to 1")


# --- what reaches the terminal ------------------------------------------------------------------

HOSTILE_LOG = [
    b"step 1 \x1b[31mreward\x1b[0m\t0.5\n",
    b"\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;title\x1b\\",  # write the clipboard, set the window title
    b"\x1b[2J\x1b[Hstep 2\r\x08\xc2\x9b6n caf\xc3",  # clear the screen, C1 CSI, a split character
    b"\xa9 \x1b[3",  # a colour split between two chunks
    b"1mdone\x1bc\n",  # ... and RIS, the terminal's reset
]


class _ApiServer(http.server.BaseHTTPRequestHandler):
    """The three calls `asyncgrpo logs demo` makes, answered as the API server would for a job
    whose driver runs; the log is `HOSTILE_LOG`, one chunk at a time."""

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path.endswith("/log"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            for chunk in HOSTILE_LOG:
                self.wfile.write(chunk)
                self.wfile.flush()
            return
        if path == "/apis/asyncgrpo.dev/v1alpha1/namespaces/team/asyncgrpojobs/demo":
            answer: dict[str, Any] = {**the_job(phase="Running", rayClusterName="demo-0")}
        elif path == "/api/v1/namespaces/team/pods":
            answer = {"items": [head("demo-0-head", {"running": {}})]}
        else:
            self.send_error(404)
            return
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads what the command printed, not the server's access log."""


def test_the_log_reaches_the_terminal_without_its_escape_sequences_and_control_characters(
    tmp_path: Path,
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
                "current-context": "x",
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}  # not in-cluster
    try:
        done = subprocess.run(
            [sys.executable, "-m", "asyncgrpo_cli.main", "logs", "demo"],
            env={**env, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            timeout=120,
            check=False,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "step 1 reward\t0.5\nstep 26n café done\n"
