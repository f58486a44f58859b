"""The rules CI holds the suite to, checked on small pytest runs of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import halves
from tests.leftovers import OPTION as LEFTOVERS_OPTION
from tests.leftovers import OWNER_FILE, RUN_FOLDERS, sweep_unused_run_folders
from tests.skip_policy import CUDA_REASON, OPTION

REPO = Path(__file__).resolve().parents[1]

SKIPS = f"""
import pytest

def test_on_a_gpu():
    pytest.skip({CUDA_REASON!r})

def test_with_helm():
    pytest.skip("no helm binary")

def test_that_runs():
    pass
"""


def run_pytest(
    tmp_path: Path,
    source: str,
    *args: str,
    plugin: str = "tests.skip_policy",
    tmpdir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in RUN_FOLDERS}  # this run's own, not ours
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", plugin, "-p", "no:cacheprovider", *args],
        check=False,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ci_fails_a_run_with_a_skip_for_want_of_a_tool_and_names_it(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, SKIPS, OPTION)
    assert result.returncode == 1, result.stdout
    assert "test_sample.py::test_with_helm: no helm binary" in result.stdout
    assert "test_on_a_gpu" not in result.stdout.split("skips other than")[1]


def test_ci_accepts_a_run_whose_only_skip_needs_a_cuda_gpu(tmp_path: Path) -> None:
    source = SKIPS.replace('pytest.skip("no helm binary")', "pass")
    result = run_pytest(tmp_path, source, OPTION)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout


def test_a_module_skipped_at_collection_fails_the_ci_run(tmp_path: Path) -> None:
    source = 'import pytest\npytest.importorskip("a_module_nobody_installed")\n\ndef test_x():\n    pass\n'
    result = run_pytest(tmp_path, source, OPTION)
    assert result.returncode == 1, result.stdout
    assert "a_module_nobody_installed" in result.stdout.split("skips other than")[1]


def test_without_the_option_a_local_run_may_skip(tmp_path: Path) -> None:
    assert run_pytest(tmp_path, SKIPS).returncode == 0


LEAVES = """
import os, pathlib, tempfile

def test_ray_goes_to_a_folder_of_this_run():
    ray_dir = pathlib.Path(os.environ["RAY_TMPDIR"])
    (ray_dir / "ray" / "session_x").mkdir(parents=True)  # what ray.init would write
    pathlib.Path("ray_dir.txt").write_text(str(ray_dir))

def test_vllm_goes_to_a_folder_of_this_run():
    vllm_dir = pathlib.Path(os.environ["VLLM_RPC_BASE_PATH"])
    (vllm_dir / "0b7e5a8e-3f1c-4e4e-9d55-6a1f0c3b2a11").touch()  # what an engine would write
    pathlib.Path("vllm_dir.txt").write_text(str(vllm_dir))

def test_that_forgets_its_folder():
    pathlib.Path("left.txt").write_text(tempfile.mkdtemp(prefix="asyncgrpo-webhook-forgotten-"))
"""


def test_a_run_removes_its_ray_and_vllm_folders_and_ci_fails_on_a_folder_left_in_tmp(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, LEAVES, LEFTOVERS_OPTION, plugin="tests.leftovers")
    left = Path((tmp_path / "left.txt").read_text())
    try:
        assert result.returncode == 1, result.stdout
        assert str(left) in result.stdout.split("left in ")[1], result.stdout
        for name, prefix in (("ray_dir.txt", "asyncgrpo-ray-"), ("vllm_dir.txt", "asyncgrpo-vllm-")):
            run_dir = Path((tmp_path / name).read_text())
            assert run_dir.name.startswith(prefix) and not run_dir.exists()
            assert str(run_dir) not in result.stdout
    finally:
        left.rmdir()


def test_without_the_option_a_folder_left_in_tmp_is_listed_but_does_not_fail(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, LEAVES, plugin="tests.leftovers")
    left = Path((tmp_path / "left.txt").read_text())
    left.rmdir()
    assert result.returncode == 0 and str(left) in result.stdout, result.stdout


def test_under_a_tmpdir_too_long_for_rays_sockets_the_run_folders_go_to_tmp_and_are_removed(
    tmp_path: Path,
) -> None:
    long_tmp = tmp_path / ("t" * 60)
    long_tmp.mkdir()
    result = run_pytest(tmp_path, LEAVES, plugin="tests.leftovers", tmpdir=long_tmp)
    assert result.returncode == 0, result.stdout
    for name in ("ray_dir.txt", "vllm_dir.txt"):
        run_dir = Path((tmp_path / name).read_text())
        assert run_dir.parent == Path("/tmp") and not run_dir.exists(), run_dir
    assert Path((tmp_path / "left.txt").read_text()).parent == long_tmp  # the test's own temp stays


def test_a_run_folder_no_live_process_names_is_swept_and_one_in_use_is_kept(tmp_path: Path) -> None:
    stale, in_use = tmp_path / "asyncgrpo-ray-stale", tmp_path / "asyncgrpo-ray-inuse"
    stale_vllm = tmp_path / "asyncgrpo-vllm-stale"
    for folder in (stale, in_use, stale_vllm):
        (folder / "ray").mkdir(parents=True)
    user = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RAY_TMPDIR": str(in_use)}
    )
    try:
        assert sweep_unused_run_folders(tmp_path) == [stale, stale_vllm]
    finally:
        user.kill()
        user.wait()
    assert not stale.exists() and not stale_vllm.exists() and in_use.exists()


def test_a_run_folder_whose_pytest_lives_is_kept_though_no_process_names_it(tmp_path: Path) -> None:
    """The pytest that made a folder set its variable after it started, so its /proc environ does
    not name it; between two vLLM engines no child does either. Its pid in the folder keeps it."""
    owned, orphaned = tmp_path / "asyncgrpo-vllm-owned", tmp_path / "asyncgrpo-vllm-orphaned"
    for folder in (owned, orphaned):
        folder.mkdir()
    (owned / OWNER_FILE).write_text(str(os.getpid()))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (orphaned / OWNER_FILE).write_text(str(dead.pid))
    assert sweep_unused_run_folders(tmp_path) == [orphaned]
    assert owned.exists() and not orphaned.exists()


def test_the_two_halves_of_make_test_run_every_test_folder_once() -> None:
    """`make test` runs the suite as two pytest processes (tests/halves.py): every folder of tests
    is in exactly one of them, so none is run twice or left out."""
    commands = halves.commands(["-q"])
    operator, trainer = commands["operator"], commands["trainer"]
    folders = {f"tests/{p.name}" for p in (REPO / "tests").iterdir() if list(p.glob("test_*.py"))}
    in_operator = {a for a in operator if a.startswith("tests/")}
    ignored = {a.removeprefix("--ignore=") for a in trainer if a.startswith("--ignore=")}
    assert in_operator == ignored == set(halves.OPERATOR_HALF) <= folders
    assert "tests/trainer" in folders - in_operator  # the trainer's half runs what is left
    assert "tests" in trainer and trainer[-1] == operator[-1] == "-q"


MIXED = """
def test_that_fails():
    assert 1 == 2, "one is not two"

def test_that_passes():
    print("some output " * 3)
"""


def test_a_half_ends_the_log_on_its_failed_tests_and_its_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log of `make test` ends with each half's verdict (tests/halves.py): read from real
    pytest output, as CI runs it, it is the failed test's summary and the final counts, and not the
    traceback or the durations before them. With CI set, pytest writes each failure's whole message
    into the summary (here its second line, `assert 1 == 2`) instead of cutting it at the terminal's
    width; the verdict keeps it, since it says why the test failed."""
    monkeypatch.setenv("CI", "true")
    lines = run_pytest(tmp_path, MIXED, "-rfE", "--durations=5").stdout.splitlines()
    ending = halves.verdict(lines)
    assert "short test summary info" in ending[0], ending
    assert ending[1] == "FAILED test_sample.py::test_that_fails - AssertionError: one is not two"
    assert ending[2] == "assert 1 == 2", ending
    assert "1 failed, 1 passed" in ending[-1], ending
    assert len(ending) == 4, ending  # no traceback (`>` and `E` lines) nor durations before them


def test_a_green_half_ends_the_log_on_its_counts_alone(tmp_path: Path) -> None:
    lines = run_pytest(tmp_path, "def test_ok():\n    pass\n", "--durations=5").stdout.splitlines()
    assert [line.strip("= ").split(" in ")[0] for line in halves.verdict(lines)] == ["1 passed"]


BUDGETED = """
import time
import pytest

def test_quick():
    pass

def test_slow_unsaid():
    time.sleep(1.5)

@pytest.mark.budget(1, "the one proof of its claim")
def test_slow_said():
    time.sleep(1.5)
"""


def test_ci_fails_a_run_with_a_test_over_the_budget_that_does_not_say_why_and_names_it(
    tmp_path: Path,
) -> None:
    result = run_pytest(tmp_path, BUDGETED, "--test-budget=1", plugin="tests.budget")
    assert result.returncode == 1, result.stdout
    over = result.stdout.split("without a budget marker")[1].split("tests with a budget")[0]
    assert "test_slow_unsaid" in over and "test_slow_said" not in over and "test_quick" not in over
    said = result.stdout.split("tests with a budget of their own")[1]
    assert "OVER  test_sample.py::test_slow_said: the one proof of its claim" in said, said


def test_a_half_failed_by_the_budget_alone_ends_the_log_on_the_test_that_broke_it(tmp_path: Path) -> None:
    """A run can fail with every test passed (a test over the budget, an unexpected skip, a
    leftover); the half's verdict, the part of the log CI keeps, then says which test and why."""
    result = run_pytest(tmp_path, BUDGETED, "--test-budget=1", "--durations=5", plugin="tests.budget")
    ending = halves.verdict(result.stdout.splitlines())
    assert result.returncode == 1
    assert "without a budget marker: the run fails" in ending[0], ending
    assert "test_sample.py::test_slow_unsaid" in ending[1], ending
    assert "3 passed" in ending[-1] and len(ending) == 3, ending


def test_a_run_whose_slow_tests_all_say_why_passes_the_budget(tmp_path: Path) -> None:
    source = BUDGETED.replace("def test_slow_unsaid():\n    time.sleep(1.5)\n", "")
    result = run_pytest(tmp_path, source, "--test-budget=1", plugin="tests.budget")
    assert result.returncode == 0, result.stdout


def test_a_budget_marker_without_a_reason_is_refused_with_the_form_to_write(tmp_path: Path) -> None:
    source = "import pytest\n\n@pytest.mark.budget(10)\ndef test_x():\n    pass\n"
    result = run_pytest(tmp_path, source, "--test-budget=1", plugin="tests.budget")
    assert result.returncode != 0
    assert "@pytest.mark.budget(SECONDS, 'why it costs that')" in result.stdout + result.stderr


def test_the_runs_last_line_adds_both_halves_counts_with_errors_as_failures() -> None:
    finals = [
        "==== 2 failed, 970 passed, 1 error in 2400.12s (0:40:00) ====",
        "==== 653 passed, 8 skipped, 3 warnings in 2000.50s (0:33:20) ====",
    ]
    assert halves.counts(finals) == "tests: 1623 passed, 3 failed, 8 skipped"
