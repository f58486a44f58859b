"""Bad input: generated job specs through `asyncgrpo validate` and through the API server + webhook.

What must hold for every case (docs/reliability.md, "Bad input"):
* neither path crashes: the CLI exits 0/1/2 and never raises; the API server never answers 5xx and
  never times out (a webhook that hangs or 500s would block every `kubectl apply`);
* every rejection names a field path;
* the two paths agree on accept/reject, and every path a webhook denial names is among the CLI's
  errors (the webhook runs the same `validate_manifest`, so anything else is drift);
* except for the disagreements this suite found and that are recorded as open in
  docs/reliability.md (`verdicts.known_gap`): they are counted, and any *other* disagreement fails.

Counts come from the environment so CI stays small: ASYNCGRPO_RELIABILITY_OFFLINE_CASES (default
500, CLI only, no cluster) and ASYNCGRPO_RELIABILITY_API_CASES (default 500, both paths).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncgrpo_api import validate_cli
from asyncgrpo_api.rules import validate_manifest
from tests.reliability.conftest import count
from tests.reliability.specgen import (
    BASES,
    MALFORMED_YAML,
    SIZE_LIMIT_KINDS,
    WRONG_ENVELOPES,
    at_size_limit,
    mutated_manifest,
)
from tests.reliability.verdicts import (
    ApiVerdict,
    CliVerdict,
    api_verdict,
    as_yaml_file_reads,
    cli_verdict,
    coerced,
    known_gap,
    related,
)
from tests.webhook.cluster_harness import Installation

STATS: Counter[str] = Counter()


def _check_cli_alone(manifest: Any) -> None:
    manifest = as_yaml_file_reads(manifest)
    report = validate_manifest(manifest)
    verdict = cli_verdict(manifest)
    assert verdict.exit_code in (0, 1, 2), verdict.output
    assert verdict.ok == report.ok or not isinstance(manifest, dict), verdict.output
    for error in report.errors:
        assert error.path and error.path != "(document)", f"error without a field path: {error}"
        assert error.message, error
    if not report.ok:
        assert verdict.paths and all(p in verdict.output for p in verdict.paths), verdict.output


@settings(
    max_examples=count("offline_cases", 500),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated_manifest())
def test_validate_never_crashes_and_every_error_names_a_field(manifest: dict[str, Any]) -> None:
    STATS["offline"] += 1
    _check_cli_alone(manifest)


@pytest.mark.parametrize("name", sorted(MALFORMED_YAML))
def test_malformed_yaml_is_reported_with_exit_2_not_a_crash(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(MALFORMED_YAML[name], encoding="utf-8")
    out = io.StringIO()
    code = validate_cli.main([str(path)], out=out)
    assert code in (1, 2), out.getvalue()
    assert "error" in out.getvalue(), out.getvalue()


def test_a_file_that_is_not_utf8_is_reported_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("metadata: {name: jöb}\n".encode("latin-1"))
    out = io.StringIO()
    assert validate_cli.main([str(path)], out=out) == 2
    assert "cannot read file" in out.getvalue()


# --- both paths, against the real API server and webhook -----------------------------------------


def _check_both(chart: Installation, manifest: Any, stats: Counter[str]) -> None:
    manifest = as_yaml_file_reads(manifest)
    cli = cli_verdict(manifest)
    api = api_verdict(chart.api, chart.jobs_ns, manifest)
    stats["cases"] += 1
    stats["api-accepted" if api.ok else "api-rejected"] += 1
    stats["by-webhook"] += api.by_webhook
    stats["max-ms"] = max(stats["max-ms"], round(api.seconds * 1000))
    assert api.status >= 0, f"API server timed out: {api.message}"
    assert api.status < 500, f"API server answered {api.status}: {api.message}"
    if not api.ok:
        assert api.paths, f"rejection names no field path ({api.status}): {api.message}"
    problem = _disagreement(cli, api)
    if problem is None:
        stats["agreed"] += 1
        return
    gap = known_gap(manifest) or coerced(cli, api)
    if gap is not None:  # a recorded open finding: counted, not failed
        stats[f"known-gap:{gap}"] += 1
        return
    raise AssertionError(
        f"{problem}\nAPI {api.status}: {api.message}\nCLI: {cli.output}\n"
        f"{yaml.safe_dump(manifest, allow_unicode=True)[:3000]}"
    )


def _disagreement(cli: CliVerdict, api: ApiVerdict) -> str | None:
    """How the two verdicts disagree, or None when they agree."""
    if cli.ok != api.ok:
        return (
            f"CLI {'accepts' if cli.ok else 'rejects'}, the API server {'accepts' if api.ok else 'rejects'}"
        )
    if api.by_webhook:
        missing = [p for p in api.paths if p not in cli.paths]
        if missing:
            return f"webhook named {missing}, the CLI only {cli.paths}"
    elif not api.ok and api.status == 422 and not any(related(a, c) for a in api.paths for c in cli.paths):
        return f"the API server named {api.paths}, the CLI {cli.paths}"
    return None


@pytest.mark.cluster
def test_api_server_and_webhook_agree_with_the_cli_on_generated_specs(
    chart: Installation, record_property: Any
) -> None:
    stats: Counter[str] = Counter()

    @settings(
        max_examples=count("api_cases", 500),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutated_manifest())
    def case(manifest: dict[str, Any]) -> None:
        _check_both(chart, manifest, stats)

    proxy = getattr(chart, "proxy", None)
    seen = len(proxy.calls) if proxy is not None else 0
    case()
    if proxy is not None:  # the webhook's dry-runs of the accepted jobs' RayClusters, by answer
        for call in proxy.calls[seen:]:
            if call.method == "POST" and call.path.endswith("/rayclusters") and "dryRun=All" in call.query:
                stats[f"dry-run-{call.status}"] += 1
    record_property("stats", dict(stats))
    print("bad-input stats:", json.dumps(dict(stats)))
    assert stats["api-accepted"] > 0 and stats["by-webhook"] > 0, stats


@pytest.mark.cluster
@pytest.mark.parametrize("kind", SIZE_LIMIT_KINDS)
def test_specs_at_the_size_limits_get_the_same_verdict_on_both_paths(chart: Installation, kind: str) -> None:
    stats: Counter[str] = Counter()
    _check_both(chart, at_size_limit(kind), stats)
    assert stats["agreed"] == 1, stats


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(WRONG_ENVELOPES))
def test_wrong_kinds_and_api_versions_are_refused_by_both_paths(chart: Installation, name: str) -> None:
    stats: Counter[str] = Counter()
    _check_both(chart, WRONG_ENVELOPES[name], stats)
    assert stats["api-rejected"] == 1


@pytest.mark.cluster
@given(st.sampled_from(BASES))
@settings(max_examples=len(BASES), deadline=None, database=None)
def test_every_seed_manifest_gets_the_same_verdict(chart: Installation, manifest: dict[str, Any]) -> None:
    _check_both(chart, manifest, Counter())
