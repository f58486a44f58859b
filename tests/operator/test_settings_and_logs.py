"""kopf settings under our own domain, and JSON log lines with the structured fields."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
from kopf._cogs.structs import references

from asyncgrpo_operator import logs, naming, raytoken, runtime, settings, webhook
from asyncgrpo_operator.manifests import OperatorPods


def test_kopf_persists_nothing_under_kopf_zalando_org() -> None:
    config = kopf.OperatorSettings()
    settings.apply(config)
    assert config.persistence.finalizer == "asyncgrpo.dev/kopf-finalizer"
    assert isinstance(config.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert config.persistence.progress_storage.prefix == "asyncgrpo.dev"
    assert isinstance(config.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert config.persistence.diffbase_storage.prefix == "asyncgrpo.dev"
    assert config.posting.level == logging.WARNING
    assert config.peering.standalone is True


def test_watching_given_namespaces_kopf_reads_no_namespaces_and_no_crds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its scanning lists and watches namespaces and watches CRDs, cluster-wide: with it off, the
    chart grants a namespaced install nothing cluster-wide to read (issue 47, item 13)."""
    monkeypatch.setenv(runtime.WATCH_NAMESPACES_ENV, "team-a,team-b")
    config = kopf.OperatorSettings()
    settings.apply(config)
    assert config.scanning.disabled is True
    monkeypatch.delenv(runtime.WATCH_NAMESPACES_ENV)
    config = kopf.OperatorSettings()
    settings.apply(config)
    assert config.scanning.disabled is False  # all namespaces: a reinstalled CRD is noticed


def resource(group: str, version: str, plural: str) -> references.Resource:
    return references.Resource(
        group=group, version=version, plural=plural, namespaced=True, verbs=["list", "watch"]
    )


def test_kopf_watches_no_children_the_informers_do() -> None:
    """Pods and RayClusters are the informers' (informer.py): kopf streams none of them."""
    config = kopf.OperatorSettings()
    settings.apply(config)
    for group, version, plural in (("", "v1", "pods"), ("ray.io", "v1", "rayclusters")):
        assert list(config.watching.label_selectors.collect(resource(group, version, plural))) == []


def test_no_handler_makes_kopf_add_a_finalizer() -> None:
    import asyncgrpo_operator.main  # noqa: F401, PLC0415 - registers the handlers

    registry = kopf.get_default_registry()
    handler_ids = {h.id for h in registry._watching.get_all_handlers()}
    assert handler_ids == {naming.HANDLER_JOB_EVENT}
    assert not registry._spawning.get_all_handlers()  # timers/daemons would add a finalizer
    assert not registry._changing.get_all_handlers()


def test_log_lines_are_json_with_the_extra_fields() -> None:
    record = logging.LogRecord("asyncgrpo", logging.INFO, __file__, 1, "reconciled", (), None)
    record.job_name = "demo"
    record.phase = "Running"
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["message"] == "reconciled"
    assert (line["job_name"], line["phase"], line["level"]) == ("demo", "Running", "INFO")


def registered(role: str) -> dict[str, set[str]]:
    """The kopf handlers `python -m asyncgrpo_operator --role <role>` registers (in a fresh
    interpreter: kopf's registry is per process)."""
    code = (
        "import importlib, json, kopf; from asyncgrpo_operator.__main__ import ROLES;"
        f"importlib.import_module(ROLES[{role!r}]); r = kopf.get_default_registry();"
        "print(json.dumps({k: sorted(h.id for h in getattr(r, '_' + k).get_all_handlers())"
        " for k in ('activities', 'watching', 'webhooks')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {kind: set(ids) for kind, ids in json.loads(out).items()}


def test_each_role_registers_its_handlers_and_only_the_webhook_roles_serve_admission() -> None:
    """Issue 47 item 5: the chart runs the reconciler and the webhook as two Deployments, so that
    an OOM-killed reconciler does not take admission with it. `--role reconciler` must then
    neither serve nor require an admission server; `--role webhook` watches and reconciles nothing."""
    webhooks = {webhook.HANDLER_ID, naming.HANDLER_DEFAULT_QUEUE}
    reconciling = {naming.HANDLER_START_CONTROLLER, naming.HANDLER_PROBE}
    both = registered("all")
    assert both["webhooks"] == webhooks and both["watching"] == {naming.HANDLER_JOB_EVENT}
    assert reconciling | {naming.HANDLER_STARTUP, naming.HANDLER_ADMISSION_SERVER} <= both["activities"]
    reconciler = registered("reconciler")
    assert reconciler["webhooks"] == set() and reconciler["watching"] == {naming.HANDLER_JOB_EVENT}
    assert naming.HANDLER_ADMISSION_SERVER not in reconciler["activities"]
    assert reconciling <= reconciler["activities"]
    admission = registered("webhook")
    assert admission["webhooks"] == webhooks and admission["watching"] == set()
    assert {naming.HANDLER_START_ADMISSION, naming.HANDLER_ADMISSION_SERVER} <= admission["activities"]
    assert not reconciling & admission["activities"]


def test_importing_the_operator_loads_neither_torch_nor_ray() -> None:
    code = (
        "import sys, asyncgrpo_operator.main; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_ray_token_key_is_read_from_the_mounted_file_and_a_short_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"k" * 64 + b"\n")  # as a mounted Secret's file may end
    monkeypatch.setenv(raytoken.KEY_FILE_ENV, str(key))
    assert raytoken.load_key() == b"k" * 64
    key.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 32"):
        raytoken.load_key()
    monkeypatch.delenv(raytoken.KEY_FILE_ENV)
    with caplog.at_level(logging.WARNING):
        drawn = raytoken.load_key()
    assert len(drawn) == raytoken.MIN_KEY_BYTES and "cannot be derived again" in caplog.text


def test_each_job_gets_its_own_token_and_the_same_one_after_a_restart() -> None:
    key = b"k" * 32
    token = raytoken.derive(key, "team", "demo", "uid-1")
    assert token == raytoken.derive(key, "team", "demo", "uid-1")  # another replica, a restart
    assert len(token) == 43 and token.isascii()
    others = {
        raytoken.derive(key, "team", "demo", "uid-2"),  # deleted and created again: another UID
        raytoken.derive(key, "other", "demo", "uid-1"),
        raytoken.derive(b"j" * 32, "team", "demo", "uid-1"),
    }
    assert token not in others and len(others) == 3


def test_the_operator_knows_its_pods_as_the_chart_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "asyncgrpo-system")
    monkeypatch.setenv(runtime.POD_LABELS_ENV, "app.kubernetes.io/instance=a,app.kubernetes.io/name=op")
    assert runtime.operator_pods() == OperatorPods(
        "asyncgrpo-system", {"app.kubernetes.io/instance": "a", "app.kubernetes.io/name": "op"}
    )
    monkeypatch.delenv("POD_NAMESPACE")
    assert runtime.operator_pods() is None  # not a pod: its NetworkPolicies admit no operator pod
