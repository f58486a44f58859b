"""kopf settings under our own domain, and JSON log lines with the structured fields."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import kopf
from kopf._cogs.structs import references

from asyncgrpo_operator import logs, naming, settings


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


def resource(group: str, version: str, plural: str) -> references.Resource:
    return references.Resource(
        group=group, version=version, plural=plural, namespaced=True, verbs=["list", "watch"]
    )


def test_children_are_watched_through_a_server_side_label_selector_and_jobs_are_not() -> None:
    config = kopf.OperatorSettings()
    settings.apply(config)
    selectors = config.watching.label_selectors
    assert list(selectors.collect(resource("", "v1", "pods"))) == [naming.JOB_NAME_LABEL]
    assert list(selectors.collect(resource("ray.io", "v1", "rayclusters"))) == [naming.JOB_NAME_LABEL]
    assert list(selectors.collect(resource("asyncgrpo.dev", "v1alpha1", "asyncgrpojobs"))) == []
    assert list(selectors.collect(resource("", "v1", "configmaps"))) == []


def test_no_handler_makes_kopf_add_a_finalizer() -> None:
    import asyncgrpo_operator.main  # noqa: F401, PLC0415 - registers the handlers

    registry = kopf.get_default_registry()
    handler_ids = {h.id for h in registry._watching.get_all_handlers()}
    assert {
        naming.HANDLER_JOB_EVENT,
        naming.HANDLER_RAYCLUSTER_EVENT,
        naming.HANDLER_POD_EVENT,
    } <= handler_ids
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
