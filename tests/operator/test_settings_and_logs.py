"""kopf settings under our own domain, and JSON log lines with the structured fields."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import kopf
import pytest
from kopf._cogs.structs import references

from asyncgrpo_operator import logs, naming, runtime, settings


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


def test_python_dash_m_entry_point_registers_the_handlers() -> None:
    code = (
        "import kopf, asyncgrpo_operator.__main__; r = kopf.get_default_registry();"
        "print(sorted(h.id for h in r._activities.get_all_handlers()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert {naming.HANDLER_START_CONTROLLER, naming.HANDLER_STARTUP, naming.HANDLER_PROBE} <= set(eval(out))


def test_importing_the_operator_loads_neither_torch_nor_ray() -> None:
    code = (
        "import sys, asyncgrpo_operator.main; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
