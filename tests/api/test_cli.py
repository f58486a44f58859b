"""`asyncgrpo validate`: exit codes and messages a user sees, through the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import job_with

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncgrpo_cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_the_docs_examples_are_all_valid() -> None:
    assert len(EXAMPLES) >= 4
    result = run_cli("validate", *EXAMPLES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("is valid") == len(EXAMPLES)


def test_an_invalid_job_exits_1_and_prints_every_error_with_its_field(tmp_path: Path) -> None:
    bad = job_with(
        asyncRL={"maxStalenessVersions": 1, "overSampling": False, "maxBufferedRollouts": 64},
        policy={"trainGlobalBatchSize": 7},
    )
    result = run_cli("validate", write(tmp_path, "bad.yaml", bad))
    assert result.returncode == 1
    assert "error: spec.trainer.asyncRL.maxBufferedRollouts: must equal numPromptsPerStep" in result.stdout
    assert "error: spec.trainer.policy.trainGlobalBatchSize: must divide" in result.stdout
    assert "is invalid (2 errors)" in result.stdout


def test_a_valid_job_with_an_ignored_setting_exits_0_with_a_warning(tmp_path: Path) -> None:
    job = job_with(asyncRL={"maxStalenessVersions": 0, "forceInOrder": True})
    result = run_cli("validate", write(tmp_path, "sync.yaml", job))
    assert result.returncode == 0
    assert "warning: spec.trainer.asyncRL.forceInOrder: is ignored in sync mode" in result.stdout


def test_yaml_that_does_not_parse_is_reported_with_its_line(tmp_path: Path) -> None:
    result = run_cli("validate", write(tmp_path, "broken.yaml", "spec:\n  image: [unclosed\n"))
    assert result.returncode == 2
    assert "broken.yaml: error: not valid YAML" in result.stdout
    assert "line 3" in result.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("- a\n- b\n", "expected a mapping (an AsyncGRPOJob), got list"),
        ("", "file holds no YAML document"),
        ("apiVersion: ray.io/v1\nkind: RayJob\nspec: {}\n", "apiVersion: must be asyncgrpo.dev/v1alpha1"),
    ],
    ids=["not-a-mapping", "empty", "other-kind"],
)
def test_files_that_are_not_an_async_grpo_job_are_explained(
    tmp_path: Path, content: str, expected: str
) -> None:
    result = run_cli("validate", write(tmp_path, "x.yaml", content))
    assert result.returncode != 0
    assert expected in result.stdout


def test_a_missing_file_is_reported_not_a_traceback(tmp_path: Path) -> None:
    result = run_cli("validate", tmp_path / "nope.yaml")
    assert result.returncode == 2
    assert "cannot read file" in result.stdout
    assert "Traceback" not in result.stderr


def test_every_document_of_a_multi_document_file_is_checked(tmp_path: Path) -> None:
    good = job_with()
    bad = job_with(asyncRL={"minGroupsForStreamingTrain": 100})
    path = write(tmp_path, "two.yaml", yaml.safe_dump(good) + "---\n" + yaml.safe_dump(bad))
    result = run_cli("validate", path)
    assert result.returncode == 1
    assert "two.yaml: AsyncGRPOJob job is valid" in result.stdout
    assert "two.yaml#2: error: spec.trainer.asyncRL.minGroupsForStreamingTrain" in result.stdout


def test_an_unknown_subcommand_prints_usage() -> None:
    result = run_cli("frobnicate")
    assert result.returncode == 2
    assert "usage: asyncgrpo" in result.stderr
