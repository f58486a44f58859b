"""The calculator tool learned: a tiny checkpoint that rarely calls the tool, and cannot multiply,
learns by GRPO to call it and answer with what it said.

The checkpoint is made by the guide's command (docs/guides/environments.md, "Multi-turn: the
calculator tool": `make-tiny-checkpoint --warm-start calculator`), run as written in a folder
outside the clone. Its check must say what the test's claim rests on, on held-out pairs: without
the tool it answers nearly none right, it calls the tool in a few of its samples and never
greedily, and after the right call it copies the tool's reply. The guide's job then trains it
through `asyncgrpo run` (the real driver, Ray, the engine, the sandboxed tool): held-out accuracy
(greedy, 200 pairs never trained on) must start below 0.1 and reach 0.8 by the last step, and the
trained checkpoint must answer by calling the tool (the warm start's check of it: greedy calls on
>= 90% of held-out prompts). A failure prints the run's story per step.

The job runs on the torch engine, as the guide writes it. vLLM's part of the same claim is proven
by cheaper tests (issue 45): a multi-turn conversation on vLLM samples, turn after turn, the
log-probs the policy recomputes (test_vllm_engine.py), and vLLM's CPU build as a job's engine takes
the real-model path's learning job to the bar (test_pretrained_learning.py[vllm]). Until
2026-12-07 this test ran the job on vLLM too: the suite's slowest test (230 s alone, 793 s in a
loaded CI run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import warm_start
from tests.trainer import pretrained_doc
from tests.trainer.learning_runs import held_out, run_job, why

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.fixture(scope="module")
def calculator_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder mounted at /models: the guide's warm-start command run as written (minutes)."""
    where = pretrained_doc.place(tmp_path_factory.mktemp("calculator"))
    command = pretrained_doc.documented_commands(*pretrained_doc.CALCULATOR)[0]
    assert "--warm-start calculator" in command, command
    out = pretrained_doc.run(where, command)
    check = json.loads(out.stdout.strip().splitlines()[-1])["warm_start"]["held_out"]
    assert check["answers_without_tool"] < 0.1, check  # the task needs the tool
    assert check["calls_greedy"] == 0 and 0.01 <= check["calls_sampled"] <= 0.15, check  # rare calls
    assert check["copies_reply"] >= 0.9, check  # a call pays off once sampled
    return where.work / "models"


def _guide_job() -> dict[str, Any]:
    """The guide's calculator job, as written."""
    blocks = re.findall(r"```yaml\n(.*?)```", pretrained_doc.CALCULATOR[0].read_text(), flags=re.DOTALL)
    (job,) = [j for j in map(yaml.safe_load, blocks) if j["metadata"]["name"] == "calculator-cpu"]
    return job  # type: ignore[no-any-return]


@pytest.mark.budget(900, "the guide's warm start and job as written: the one proof that a tool is learned")
def test_a_model_that_rarely_calls_the_calculator_learns_to_use_it(
    calculator_models: Path, tmp_path: Path
) -> None:
    job = _guide_job()
    records = run_job(tmp_path, job, calculator_models, timeout=1800)
    accuracy = held_out(records)
    last_step = job["spec"]["trainer"]["grpo"]["maxNumSteps"]
    assert accuracy[0][0] == 0 and accuracy[0][1] < 0.1, why(records)  # before the first step
    assert accuracy[-1][0] == last_step and accuracy[-1][1] >= 0.8, why(records)
    trained = warm_start.check(Path(records[-1]["hf_checkpoint"]), "calculator")["held_out"]
    assert trained["calls_greedy"] >= 0.9 and trained["answers_without_tool"] < 0.1, trained  # by the tool
