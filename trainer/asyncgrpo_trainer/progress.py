"""What the driver tells the world: /progress (JSON), /metrics (Prometheus), JSON step lines.

The operator polls /progress on DRIVER_PROGRESS_PORT and is the only writer of the job's status;
the field names here are the contract it reads (camelCase, as in status.progress). After the run
ends the server keeps answering with state "succeeded" or "failed" (and the error) for a grace
period so the operator can read the final state before the pod goes away.

In a job's pod the server asks for the job's Ray token (`Authorization: Bearer <token>`, as Ray's
dashboard does; asyncgrpo_api.ray_auth): /progress and /metrics tell how the job trains, and
nothing but the operator, and whoever may read the job's Secret, should learn it. /healthz says
only that the server is up, and is open, like Ray's own health checks.

POST /drain `{"worker": "<pod>"}` (the same token) is how the operator asks an elastic fleet to
drain a generation worker pod before it deletes it (`fleet`); the trainer never reads Kubernetes.
The driver relays each pod once (`drain_requests`); /progress lists it in drainedWorkers once its
engines are gone. The answer is 202 with the pods drained so far.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, TextIO

from asyncgrpo_api import ray_auth
from asyncgrpo_api.v1alpha1.placement import MAX_AUTOSCALING_WINDOW_STEPS

STATES = ("starting", "running", "succeeded", "failed")

RATE_WINDOW_STEPS = 10
"""tokensPerSecond covers this many of the latest steps."""
FLEET_WINDOW_STEPS = MAX_AUTOSCALING_WINDOW_STEPS
"""/progress carries this many of the latest step windows (`fleet_window`): the operator's elastic
fleet decides from them (its autoscaling.windowSteps is at most this)."""


def fleet_window(record: dict[str, Any]) -> dict[str, Any]:
    """Who waited for whom in one step's window, for the operator (camelCase, as on the wire)."""
    return {
        "step": record["step"],
        "seconds": record["step_seconds"],
        "policyIdleShare": record["policy_idle_share"],
        "generationIdleShare": record["generation_idle_share"],
        "generationGatedShare": record["generation_gated_share"],
        "generationEngines": record["generation_engines"],
    }


def recent_token_rate(steps: Sequence[dict[str, Any]]) -> float | None:
    """Generated tokens per second over the last `RATE_WINDOW_STEPS` step records (oldest first).

    Why a window: a single step's rate is 0 whenever nothing was generated during it (the last
    steps of a gated run, whose rollouts were all generated earlier), which is what `kubectl get`
    showed at the end of every demo."""
    window = steps[-RATE_WINDOW_STEPS:]
    seconds = sum(float(r["step_seconds"]) for r in window)
    if not window or seconds <= 0:
        return None
    return sum(float(r["tokens_per_second"]) * float(r["step_seconds"]) for r in window) / seconds


@dataclass
class Progress:
    """The /progress document (snake_case here, camelCase on the wire)."""

    step: int = 0
    max_steps: int = 0
    policy_version: int = 0
    reward_mean: float | None = None
    accuracy: float | None = None
    """Fraction of the last step's samples that are exactly the reference answer."""
    mean_staleness: float | None = None
    tokens_per_second: float | None = None
    """Generated tokens per second over the latest steps (`recent_token_rate`)."""
    last_checkpoint_step: int | None = None
    durable_checkpoint_step: int | None = None
    """The newest checkpoint complete in spec.storage.objectStore (its manifest written)."""
    validation_reward: float | None = None
    reward_failures: int = 0
    """Prompt groups dropped because scoring them failed twice (never trained on)."""
    data_warning: str | None = None
    """The data rows skipped at start (bad rows, prompts over maxPromptLength), in one line."""
    validation_accuracy: float | None = None
    """Fraction of the held-out prompts answered exactly, greedily, at the last validation."""
    gen_logprob_error: float | None = None
    """The newest measured mean exp|logp_engine - logp_policy| (1 = the engine and the policy agree),
    over the tokens a step trained that the policy's current weights generated (staleness 0)."""
    logprob_mismatch: str | None = None
    """While the log-prob gate is tripped (`logprob_gate`), why, in one line; the operator sets the
    LogprobMismatch condition from it."""
    gen_kl_error: float | None = None
    behaviour_kl: float | None = None
    """KL(pi_gen || pi_old) over the newest step's trained tokens (k3): how far the weights trained
    had moved from those that generated the data."""
    is_out_of_bounds: float | None = None
    """The share of the newest step's trained tokens whose importance weight the truncation changed."""
    mean_oldest_staleness: float | None = None
    """The newest step's mean staleness measured on each group's stamp, the oldest weights that
    shaped any of its tokens (mean_staleness measures the weights it was dispatched with)."""
    entropy: float | None = None
    clip_fraction: float | None = None
    response_length_mean: float | None = None
    response_length_max: float | None = None
    truncated_fraction: float | None = None
    """The newest step's figures (the step record's keys of the same names), as gauges on /metrics."""
    refit_seconds: float | None = None
    """The newest step's weight transfer into the generation engines, as the controller waited for
    it (a gauge too, as are the next)."""
    generation_pause_seconds: float | None = None
    """How long the newest step's refit stopped generation (the longest of the engines)."""
    policy_idle_share: float | None = None
    """Who waited for whom in the newest step's window (the step record's keys of the same names,
    docs/guides/trainer.md#who-waits-for-whom): the share the policy waited for rollouts, and the
    share it computed."""
    policy_busy_share: float | None = None
    generation_idle_share: float | None = None
    """The engines' mean share with no request to serve; `generation_idle_shares` per engine."""
    generation_gated_share: float | None = None
    """The engines' mean share idle while the staleness gate held groups back."""
    generation_idle_shares: list[float] | None = None
    buffer_fill: float | None = None
    """Groups generated and waiting to be trained at the newest step's end, over maxBufferedRollouts."""
    samples_untrained: float | None = None
    """Samples generated and never trained on (dropped, evicted, or still waiting) by the newest step."""
    first_step_at: float | None = None
    """When this attempt trained its first step (epoch seconds)."""
    windows: list[dict[str, Any]] = field(default_factory=list)
    """The latest step windows, oldest first (`fleet_window`)."""
    drained_workers: list[str] = field(default_factory=list)
    """Generation worker pods an elastic fleet has drained (`fleet`): the operator may delete them."""
    joining_workers: list[str] = field(default_factory=list)
    """Generation worker pods an elastic fleet gained whose engines are up and join at the next refit."""
    state: str = "starting"
    error: str | None = None
    mode: str = ""
    counters: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        return {_camel(k): v for k, v in raw.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def prometheus_text(p: Progress) -> str:
    """Prometheus exposition of the progress document and the run counters."""
    gauges: dict[str, float | None] = {
        "asyncgrpo_step": p.step,
        "asyncgrpo_max_steps": p.max_steps,
        "asyncgrpo_policy_version": p.policy_version,
        "asyncgrpo_reward_mean": p.reward_mean,
        "asyncgrpo_accuracy": p.accuracy,
        "asyncgrpo_mean_staleness": p.mean_staleness,
        "asyncgrpo_tokens_per_second": p.tokens_per_second,
        "asyncgrpo_last_checkpoint_step": p.last_checkpoint_step,
        "asyncgrpo_durable_checkpoint_step": p.durable_checkpoint_step,
        "asyncgrpo_validation_reward": p.validation_reward,
        "asyncgrpo_validation_accuracy": p.validation_accuracy,
        "asyncgrpo_gen_logprob_error": p.gen_logprob_error,
        "asyncgrpo_logprob_mismatch": float(p.logprob_mismatch is not None),
        "asyncgrpo_gen_kl_error": p.gen_kl_error,
        "asyncgrpo_behaviour_kl": p.behaviour_kl,
        "asyncgrpo_is_out_of_bounds": p.is_out_of_bounds,
        "asyncgrpo_mean_oldest_staleness": p.mean_oldest_staleness,
        "asyncgrpo_entropy": p.entropy,
        "asyncgrpo_clip_fraction": p.clip_fraction,
        "asyncgrpo_response_length_mean": p.response_length_mean,
        "asyncgrpo_response_length_max": p.response_length_max,
        "asyncgrpo_truncated_fraction": p.truncated_fraction,
        "asyncgrpo_refit_seconds": p.refit_seconds,
        "asyncgrpo_generation_pause_seconds": p.generation_pause_seconds,
        "asyncgrpo_policy_idle_share": p.policy_idle_share,
        "asyncgrpo_policy_busy_share": p.policy_busy_share,
        "asyncgrpo_generation_idle_share": p.generation_idle_share,
        "asyncgrpo_generation_gated_share": p.generation_gated_share,
        "asyncgrpo_buffer_fill": p.buffer_fill,
        "asyncgrpo_samples_untrained": p.samples_untrained,
        "asyncgrpo_first_step_timestamp_seconds": p.first_step_at,
    }
    lines: list[str] = []
    for name, value in gauges.items():
        if value is not None:
            lines += [f"# TYPE {name} gauge", f"{name} {float(value):g}"]
    if p.generation_idle_shares:
        lines += ["# TYPE asyncgrpo_generation_engine_idle_share gauge"]
        lines += [
            f'asyncgrpo_generation_engine_idle_share{{engine="{i}"}} {float(v):g}'
            for i, v in enumerate(p.generation_idle_shares)
        ]
    lines += ["# TYPE asyncgrpo_state gauge"]
    lines += [f'asyncgrpo_state{{state="{s}"}} {1 if p.state == s else 0}' for s in STATES]
    for key, value in sorted(p.counters.items()):
        name = "asyncgrpo_" + "".join(c if c.isalnum() else "_" for c in key) + "_total"
        lines += [f"# TYPE {name} counter", f"{name} {float(value):g}"]
    return "\n".join(lines) + "\n"


def refusal(authorization: str | None, token: str | None) -> int | None:
    """The HTTP status refusing a request whose Authorization header is `authorization`, or None
    to answer it: 401 without a bearer token, 403 with another than `token` (None: none needed)."""
    if token is None:
        return None
    if not authorization or not authorization.startswith(ray_auth.BEARER):
        return 401
    given = authorization.removeprefix(ray_auth.BEARER).encode()
    return None if hmac.compare_digest(given, token.encode()) else 403


REFUSAL_HEADERS: dict[int, dict[str, str]] = {401: {"WWW-Authenticate": "Bearer"}, 403: {}}
MAX_DRAIN_BYTES = 1024
"""The most of a drain request's body read (a pod's name is at most MAX_POD_NAME characters)."""
MAX_POD_NAME = 253


def _length(headers: Any) -> int:
    try:
        return max(int(headers.get("Content-Length") or 0), 0)
    except ValueError:
        return 0


def _answer(path: str, snap: Progress) -> tuple[int, bytes, dict[str, str]] | None:
    """Status, body and headers of a GET of `path`, or None for a path the server does not know."""
    if path == "/progress":
        return 200, json.dumps(snap.to_json()).encode(), {"Content-Type": "application/json"}
    if path == "/metrics":
        return 200, prometheus_text(snap).encode(), {"Content-Type": "text/plain; version=0.0.4"}
    if path == "/healthz":
        return 200, b"ok", {"Content-Type": "text/plain"}
    return None


class ProgressServer:
    """A background HTTP server over a shared Progress; `update` replaces the document. With a
    `token`, /progress and /metrics answer only requests that carry it (`refusal`)."""

    def __init__(self, port: int, host: str = "0.0.0.0", token: str | None = None) -> None:
        self._lock = threading.Lock()
        self._progress = Progress()
        self._drains: list[str] = []
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                refused = refusal(self.headers.get("Authorization"), token)
                if refused is not None:
                    self._send(refused, b"", REFUSAL_HEADERS[refused])
                    return
                if path != "/drain":
                    self.send_error(404)
                    return
                status, body = server_self._drain(
                    self.rfile.read(min(_length(self.headers), MAX_DRAIN_BYTES))
                )
                self._send(status, body, {"Content-Type": "application/json"})

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    return

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                refused = refusal(self.headers.get("Authorization"), token) if path != "/healthz" else None
                if refused is not None:
                    answer: tuple[int, bytes, dict[str, str]] | None = (
                        refused,
                        b"",
                        REFUSAL_HEADERS[refused],
                    )
                else:
                    answer = _answer(path, server_self.snapshot())
                if answer is None:
                    self.send_error(404)
                    return
                # A client that gave up (a poll timing out on a busy node) is not an error of the
                # run: a traceback would land in the container's termination message.
                self._send(*answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="progress-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def snapshot(self) -> Progress:
        with self._lock:
            return Progress(**{**asdict(self._progress), "counters": dict(self._progress.counters)})

    def _drain(self, raw: bytes) -> tuple[int, bytes]:
        """Record a drain request (see the module docstring); the status and the JSON answer."""
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        worker = doc.get("worker") if isinstance(doc, dict) else None
        if not isinstance(worker, str) or not 0 < len(worker) <= MAX_POD_NAME:
            why = f'expected {{"worker": "<pod name, at most {MAX_POD_NAME} characters>"}}'
            return 400, json.dumps({"error": why}).encode()
        with self._lock:
            if worker not in self._drains:
                self._drains.append(worker)
            drained = list(self._progress.drained_workers)
        return 202, json.dumps({"drainedWorkers": drained}).encode()

    def drain_requests(self, since: int) -> list[str]:
        """The pods asked to drain after the first `since` (each is recorded once)."""
        with self._lock:
            return self._drains[since:]

    def update(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self._progress, key, value)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class Reporter(Protocol):
    """Where the driver relays the run as it goes: step lines for machines (`JsonLines`), a bar
    and a summary for a person (`console.HumanProgress`)."""

    def update(self, progress: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """The controller's latest progress and the step records since the previous update."""

    def end(self) -> None:
        """The run stopped (finished or failed); nothing live is drawn after this."""

    def summary(self, summary: dict[str, Any]) -> None:
        """The controller's run summary, once training finished."""


class JsonLines:
    """One JSON line per step record and one for the summary (`jq` friendly): the in-cluster
    driver's stdout, and `asyncgrpo run --jsonl`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def update(self, progress: dict[str, Any], records: list[dict[str, Any]]) -> None:
        for record in records:
            self.stream.write(json.dumps({"event": "step", **record}, default=float) + "\n")
        self.stream.flush()

    def end(self) -> None:
        self.stream.flush()

    def summary(self, summary: dict[str, Any]) -> None:
        body = {k: v for k, v in summary.items() if k != "records"}
        self.stream.write(json.dumps({"event": "summary", **body}, default=float) + "\n")
        self.stream.flush()
