"""The driver's log and step records as files on the checkpoint volume (asyncgrpo_trainer.runlog);
tests/trainer/test_driver_exit.py checks them after a real run killed and resumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from asyncgrpo_trainer import runlog

REPO = Path(__file__).resolve().parents[2]

TEE_SCRIPT = """
import logging, os, subprocess, sys
from pathlib import Path
from asyncgrpo_trainer import runlog
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
stop = runlog.tee_output(Path(sys.argv[1]))
print("a print")
logging.getLogger("x").info("a log record")
os.write(2, b"raw bytes on fd 2\\n")
subprocess.run(["echo", "a child process"], check=True)
stop()
print("after the tee stopped")
"""


def test_tee_copies_everything_the_process_and_its_children_write_and_passes_it_on(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "driver-attempt-0.log"
    proc = subprocess.run(
        [sys.executable, "-c", TEE_SCRIPT, str(log)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'trainer'}", "PATH": "/usr/bin:/bin"},
    )
    copied = log.read_text()
    for text in ("a print", "a log record", "raw bytes on fd 2", "a child process"):
        assert text in copied, text
        assert text in proc.stdout + proc.stderr, text  # the container log still gets it
    assert "a print" in proc.stdout and "a log record" in proc.stderr  # the streams stay apart
    assert "after the tee stopped" not in copied and "after the tee stopped" in proc.stdout


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resumed_attempt_drops_the_steps_it_trains_again_and_a_fresh_start_begins_empty(
    tmp_path: Path,
) -> None:
    path = tmp_path / "logs" / "steps.jsonl"
    first = runlog.StepsFile(path, resumed_step=None, attempt=0)
    for step in range(1, 7):
        first.write({"step": step, "loss": 0.1})
    first.write({"event": "validation", "step": 6, "validation_accuracy": 0.5})
    first.close()
    second = runlog.StepsFile(path, resumed_step=4, attempt=1)  # checkpointed at 4, trains 5.. again
    for step in range(5, 8):
        second.write({"step": step, "loss": 0.2})
    second.close()
    records = _lines(path)
    assert [(r["step"], r["attempt"]) for r in records] == [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 1),
        (6, 1),
        (7, 1),
    ]
    assert {r["event"] for r in records} == {"step"}
    runlog.StepsFile(path, resumed_step=None, attempt=0).close()  # a new run on the same path
    assert path.read_text() == ""
