"""Sample efficiency of every mode over seeds: held-out accuracy against samples trained.

Whether async learns as well as sync cannot be read off runs that all ended at 1.0; this runs each
case below in each mode for several seeds, over steps short enough that the curves are still
rising at the end, and compares the modes on how soon they learn (learning_curves.py: steps to
held-out 0.5 and 0.8, the area under held-out accuracy against samples trained; mean, spread and
worst seed). Every mode trains the same P x N samples a step, so the curves line up sample for
sample. The cases:

- toy: the char-level model from random weights (docs/examples/train-reverse-cpu.yaml, the recipe
  of tests/trainer/test_modes_learn.py) over 100 steps where the test runs 150;
- real: the real-model path (a tiny Qwen2 checkpoint, BPE tokenizer, chat template) of
  tests/trainer/learning_job.yaml from the warm start of its fixture (`tiny-qwen2`: 600 supervised
  steps on 3- and 5-digit reversal), over 30 steps where the test runs 80. The checkpoint's greedy
  answers to 4-digit prompts already have all four digits right and a fifth too many: RL mostly
  teaches it to stop;
- low-start: the same job over 40 steps from the same warm start stopped after 80 of its 600 steps
  (`tiny-qwen2-low-start`): its answers have the first three digits right, the fourth right on
  about two prompts in three and a fifth too many, so RL has to teach it the fourth digit as well
  as the stop (tests/trainer/test_low_start_learning.py);
- calculator: the multi-turn tool job of docs/guides/environments.md over its 20 steps, from the
  guide's warm start (`tiny-calc`, `--warm-start calculator`): the model rarely calls the tool and
  cannot multiply, so RL has to teach it to call and copy the reply (a task where stale samples'
  importance weights helped on one seed, where on `real` they hurt: issue 46).

Each run is one `asyncgrpo run` with its own Ray (learning_seeds.run_seed), `--parallel` at once.
It prints one JSON line per run as it finishes and, once a case's runs are done, its table (every
mode: final held-out, steps to 0.5 and 0.8, area; mean and worst seed) with a verdict per async
mode against sync, and the mean and worst seed's curves; the header gives the date, load average
and command, for docs/benchmarks.md. `--report` makes the tables of several sweeps' outputs at
once (one sweep of some modes, another of the rest). The checkpoints are made beforehand (the warm
start sets its 2 threads itself):

    asyncgrpo make-tiny-checkpoint DIR/tiny-qwen2 --hidden-size 128 --heads 4 --intermediate-size 512 \\
        --warm-start
    asyncgrpo make-tiny-checkpoint DIR/tiny-qwen2-low-start --hidden-size 128 --heads 4 \\
        --intermediate-size 512 --warm-start --warm-start-steps 80
    asyncgrpo make-tiny-checkpoint DIR/tiny-calc --family qwen2 --hidden-size 128 --heads 4 \\
        --intermediate-size 512 --warm-start calculator
    PYTHONPATH=trainer:operator python bench/models/sample_efficiency.py --models DIR --seeds 1-5 \\
        --parallel 8 --modes sync async-in-order > A.txt
    PYTHONPATH=trainer:operator python bench/models/sample_efficiency.py --models DIR --seeds 1-5 \\
        --parallel 8 --modes streaming-gated streaming-oversampled > B.txt
    PYTHONPATH=trainer:operator python bench/models/sample_efficiency.py --report A.txt B.txt
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import learning_seeds
import yaml

from asyncgrpo_trainer import bench, learning_curves
from asyncgrpo_trainer.learning_curves import Reached, Spread

REPO = Path(__file__).resolve().parents[2]
MODES = ("sync", "async-in-order", "streaming-gated", "streaming-oversampled")
"""The four modes of the knob table (docs/guides/async-modes.md), as the CPU benchmark runs them."""
THRESHOLDS = (0.5, 0.8)


@dataclass(frozen=True)
class Case:
    """A job every mode learns: its file, the `--set`s on its trainer section and its steps. A guide
    (a Markdown file) holds its jobs in YAML blocks: `document` names the one (metadata.name)."""

    job: Path
    steps: int
    overrides: tuple[str, ...] = ()
    document: str | None = None

    def load(self) -> dict[str, Any]:
        if self.document is None:
            return yaml.safe_load(self.job.read_text())  # type: ignore[no-any-return]
        blocks = re.findall(r"```yaml\n(.*?)```", self.job.read_text(), flags=re.DOTALL)
        (job,) = [j for j in map(yaml.safe_load, blocks) if j["metadata"]["name"] == self.document]
        return job  # type: ignore[no-any-return]


CASES = {
    "toy": Case(REPO / "docs" / "examples" / "train-reverse-cpu.yaml", 100, ("grpo.valPeriod=10",)),
    "real": Case(REPO / "tests" / "trainer" / "learning_job.yaml", 30, ("grpo.valPeriod=5",)),
    "low-start": Case(
        REPO / "tests" / "trainer" / "learning_job.yaml",
        40,
        ("grpo.valPeriod=5", "model.path=/models/tiny-qwen2-low-start"),
    ),
    "calculator": Case(
        REPO / "docs" / "guides" / "environments.md", 20, ("grpo.valPeriod=5",), document="calculator-cpu"
    ),
}


def job_of(case: Case, mode: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The case's job file with its overrides, then `extra` (`--set`), and `mode`'s asyncRL settings."""
    job = case.load()
    trainer = job["spec"]["trainer"]
    for assignment in (*case.overrides, *extra):
        learning_seeds.apply_override(trainer, assignment)
    trainer["asyncRL"] = bench.modes(trainer["grpo"]["numPromptsPerStep"])[mode]
    return job


def curve(run: dict[str, Any]) -> dict[int, float]:
    return dict(run["held_out"])


def seconds_to(run: dict[str, Any], threshold: float) -> int | None:
    """Seconds from the run's start until the weights that first validated at `threshold` or above
    existed (the validation record's run_seconds); None when it never did."""
    step = learning_curves.steps_to(curve(run), threshold)
    seconds = dict(zip((s for s, _ in run["held_out"]), run.get("seconds_at_validation", []), strict=False))
    at = seconds.get(step) if step is not None else None
    return None if at is None else round(at)


def area(run: dict[str, Any]) -> float:
    """The run's area under held-out accuracy against the samples trained at each validation."""
    accuracies = [accuracy for _, accuracy in run["held_out"]]
    return learning_curves.area_under(list(zip(run["samples_at_validation"], accuracies, strict=True)))


def steps_text(r: Reached) -> str:
    """`40 (60)`: the mean over seeds and the slowest seed; `45 (2 never)` when two seeds never did."""
    if r.mean is None:
        return "never"
    worst = f"{r.worst}" if r.worst is not None else f"{r.missed} never"
    return f"{r.mean:.0f} ({worst})"


def spread_text(s: Spread) -> str:
    return f"{s.mean:.3f} ± {s.std:.3f} ({s.worst:.3f})"


def case_report(name: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The case's table (one row per mode that has runs) and each mode's mean and worst curves."""
    lines = [
        f"### {name}",
        "",
        "| mode | seeds | held-out at the end: mean ± std (worst) | steps to 0.5: mean (worst) "
        "| steps to 0.8: mean (worst) | seconds to 0.8: mean (worst) | area: mean ± std (worst) "
        "| against sync (area) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    areas = {mode: learning_curves.spread([area(r) for r in done]) for mode, done in runs.items() if done}
    curves: list[str] = []
    for mode, done in runs.items():
        if not done:
            continue
        finals = learning_curves.spread([r["held_out"][-1][1] for r in done])
        to = [
            learning_curves.reached([learning_curves.steps_to(curve(r), t) for r in done]) for t in THRESHOLDS
        ]
        against = (
            "—"
            if mode == "sync" or "sync" not in areas
            else learning_curves.verdict(areas[mode], areas["sync"])
        )
        timed = all("seconds_at_validation" in r for r in done)  # runs recorded before were not
        seconds = learning_curves.reached([seconds_to(r, THRESHOLDS[-1]) for r in done])
        seeds = ",".join(str(r["seed"]) for r in sorted(done, key=lambda r: r["seed"]))
        lines.append(
            f"| {mode} | {seeds} | {spread_text(finals)} | {steps_text(to[0])} | {steps_text(to[1])} "
            f"| {steps_text(seconds) if timed else '—'} | {spread_text(areas[mode])} | {against} |"
        )
        mean = learning_curves.mean_curve([curve(r) for r in done])
        worst = min(done, key=area)
        curves.append(f"- {mode}, mean: {' '.join(f'{a:.2f}' for a in mean.values())}")
        curves.append(
            f"- {mode}, worst seed ({worst['seed']}): {' '.join(f'{a:.2f}' for _, a in worst['held_out'])}"
        )
    first = next(r for done in runs.values() for r in done)
    steps = " ".join(str(step) for step, _ in first["held_out"])
    per_step = int(first["samples_at_validation"][-1]) // first["held_out"][-1][0]
    return [*lines, "", f"Held-out accuracy at steps {steps} ({per_step} samples a step):", "", *curves, ""]


def read_runs(paths: list[Path]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The runs that sweeps printed (their JSON lines), by case and mode: several sweeps, of other
    seeds or modes each, make one table."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {case: {mode: [] for mode in MODES} for case in CASES}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.startswith('{"case"'):
                run = json.loads(line)
                runs[run.pop("case")][run.pop("mode")].append(run)
    return runs


def sweep(ns: argparse.Namespace) -> None:
    """Every case x mode x seed, `ns.parallel` runs at once; each case's table once its runs are done."""
    seeds = learning_seeds.parse_seeds(ns.seeds)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        case: {mode: [] for mode in ns.modes} for case in ns.cases
    }
    left = {case: len(ns.modes) * len(seeds) for case in ns.cases}
    started, failed = time.monotonic(), 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=ns.parallel) as pool:
        futures = {
            pool.submit(
                learning_seeds.run_seed,
                job_of(CASES[case], mode, ns.set),
                ns.models,
                seed,
                CASES[case].steps,
                ns.timeout,
            ): (case, mode)
            for case in ns.cases
            for mode in ns.modes
            for seed in seeds
        }
        for future in concurrent.futures.as_completed(futures):
            case, mode = futures[future]
            try:
                run = future.result()
                runs[case][mode].append(run)
                print(json.dumps({"case": case, "mode": mode, **run}), flush=True)
            except learning_seeds.RunFailedError as exc:
                failed += 1
                print(f"FAILED: {case} {mode} {exc}", flush=True)
            left[case] -= 1
            if not left[case]:  # its table now, so a sweep cut short keeps the cases it finished
                load = os.getloadavg()
                print(
                    f"\n{case}: done after {time.monotonic() - started:.0f} s, 1-minute load {load[0]:.1f}, "
                    f"failed runs so far {failed}\n",
                    flush=True,
                )
                if any(runs[case].values()):
                    print("\n".join(case_report(case, runs[case])), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", type=Path, help="the cases' checkpoints: tiny-qwen2/, tiny-qwen2-low-start/, tiny-calc/"
    )
    parser.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 4,9,42")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a run may take before it fails")
    parser.add_argument(
        "--set", action="append", default=[], help="SECTION.FIELD=VALUE of spec.trainer, for every case"
    )
    parser.add_argument(
        "--report", type=Path, nargs="+", help="no runs: the tables of the runs in these sweeps' outputs"
    )
    ns = parser.parse_args()
    if ns.report:
        print(f"tables of the runs in {' '.join(map(str, ns.report))}\n")
        for case, runs in read_runs(ns.report).items():
            if any(runs.values()):
                print("\n".join(case_report(case, runs)))
        return
    if ns.models is None:
        parser.error("--models is needed to run a sweep")
    load = os.getloadavg()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}, {os.cpu_count()} cores, "
        f"1/5/15-minute load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n"
        f"command: PYTHONPATH=trainer:operator python {' '.join(sys.argv)}",
        flush=True,
    )
    sweep(ns)


if __name__ == "__main__":
    main()
