"""How often the real-model CPU example learns: its job run once per seed, held-out accuracy per seed.

One run proves little about an RL recipe: the same job can learn with one seed and stall with
another (a policy that sharpens onto a partly right answer before it samples the right one gets
zero advantages from then on). This runs docs/examples/pretrained-cpu.yaml through `asyncgrpo run`
for each seed, with `--set` overrides of its trainer section, and prints one JSON line per seed
(held-out accuracy at each validation, the shaped reward every 10 steps) and a summary: how many
seeds ended below `--bar`. `--job` runs another job file instead (the learning test's job,
`tests/trainer/learning_job.yaml`), and `--parallel N` runs N seeds at once (on a machine with the
cores for it: each run is a whole `asyncgrpo run` with its own Ray). The command below sweeps the
example's settings before 2026-12-02 (normalized advantages at 5e-4). The checkpoint is the
example's own, made beforehand:

    asyncgrpo make-tiny-checkpoint /tmp/models/tiny-qwen2 --hidden-size 128 --heads 4 \
        --intermediate-size 512 --warm-start
    PYTHONPATH=trainer:operator python bench/models/learning_seeds.py --models /tmp/models \
        --seeds 1-12 --steps 70 --set grpo.normalizeRewards=true --set policy.learningRate=5e-4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "pretrained-cpu.yaml"


def parse_seeds(text: str) -> list[int]:
    """`1-4,42` -> [1, 2, 3, 4, 42]."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def apply_override(trainer: dict[str, Any], assignment: str) -> None:
    """`grpo.normalizeRewards=false` sets trainer.grpo.normalizeRewards to the YAML value false."""
    path, sep, value = assignment.partition("=")
    if not sep or not path:
        raise SystemExit(f"--set {assignment!r}: expected SECTION.FIELD=VALUE, e.g. policy.learningRate=7e-4")
    *sections, field = path.split(".")
    node = trainer
    for section in sections:
        node = node.setdefault(section, {})
    node[field] = yaml.safe_load(value)


class RunFailedError(RuntimeError):
    """An `asyncgrpo run` that exited non-zero or ran past its time: a sweep records it and goes on."""


def run_seed(
    template: dict[str, Any], models: Path, seed: int, steps: int, timeout: float | None = None
) -> dict[str, Any]:
    """One `asyncgrpo run` of `template` with grpo.seed = seed; its held-out curve (and the samples
    trained at each validation) and rewards."""
    job = json.loads(json.dumps(template))
    job["spec"]["trainer"]["grpo"].update(seed=seed, maxNumSteps=steps)
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-seeds-") as tmp:
        path, records = Path(tmp) / "job.yaml", Path(tmp) / "steps.jsonl"
        path.write_text(yaml.safe_dump(job))
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "asyncgrpo_cli.main", "run", str(path), "--mount", f"/models={models}",
                 "--mount", f"/data={REPO / 'docs' / 'examples' / 'data'}",
                 "--checkpoint-dir", str(Path(tmp) / "checkpoints"), "--jsonl", str(records)],
                capture_output=True, text=True, check=False, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise RunFailedError(f"seed {seed}: asyncgrpo run still running after {timeout:.0f} s") from exc
        if done.returncode != 0:
            raise RunFailedError(f"seed {seed}: asyncgrpo run failed:\n{done.stderr[-3000:]}")
        lines = [json.loads(line) for line in records.read_text().splitlines()]
    step_lines = [r for r in lines if r.get("event") == "step"]
    validations = [r for r in lines if r.get("event") == "validation"]
    return {
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "held_out": [[r["step"], r["validation_accuracy"]] for r in validations],
        "samples_at_validation": [r["samples_trained"] for r in validations],
        "seconds_at_validation": [r.get("run_seconds") for r in validations],
        "reward_every_10": [round(r["reward_mean"], 2) for r in step_lines[::10]],
        "zero_advantage_every_10": [round(r["zero_advantage_groups"], 2) for r in step_lines[::10]],
        **{f"step_mean_{key}": _mean(step_lines, key) for key in OFF_POLICY_FIGURES},
    }


OFF_POLICY_FIGURES = ("behaviour_kl", "is_out_of_bounds", "mean_staleness", "mean_oldest_staleness")
"""How far off-policy a run's training data was, per step (issue 46): KL(pi_generation || pi_old)
over the trained tokens, the share of tokens whose importance weight was truncated, and the data's
age in versions by the dispatch stamp and by the oldest weights that shaped it."""


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return round(sum(values) / len(values), 4) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=Path, required=True, help="directory holding tiny-qwen2/")
    parser.add_argument("--seeds", default="1-12", help="e.g. 1-12 or 4,9,42")
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--bar", type=float, default=0.8, help="held-out accuracy a run must end at")
    parser.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE of spec.trainer")
    parser.add_argument("--job", type=Path, default=EXAMPLE, help="the job file (default: the example)")
    parser.add_argument("--parallel", type=int, default=1, help="seeds run at once")
    ns = parser.parse_args()
    job = yaml.safe_load(ns.job.read_text())
    for assignment in ns.set:
        apply_override(job["spec"]["trainer"], assignment)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=ns.parallel) as pool:
        runs = [pool.submit(run_seed, job, ns.models, seed, ns.steps) for seed in parse_seeds(ns.seeds)]
        for run in concurrent.futures.as_completed(runs):
            try:
                results.append(run.result())
            except RunFailedError as exc:
                raise SystemExit(str(exc)) from exc
            print(json.dumps(results[-1]), flush=True)
    finals = [r["held_out"][-1][1] for r in results]
    below = [r["seed"] for r in results if r["held_out"][-1][1] < ns.bar]
    print(json.dumps({"seeds": len(results), "below_bar": below, "lowest": min(finals), "overrides": ns.set}))


if __name__ == "__main__":
    main()
