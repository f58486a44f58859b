"""CPU benchmark: the same task, model and samples in sync and in each async mode.

    python -m asyncgrpo_trainer.bench --steps 40 [--repeat 3] [--kl 0.01] [--markdown]

With --repeat R each mode runs R times and the run with the median wall time is reported (the
machine this was written on is shared, and single runs vary by tens of percent). Each mode runs
the shipped arithmetic task for the same number of steps (so the same number of
trained samples) in one embedded Ray cluster, after a warm-up run that pays the process start-up.
Reported per mode: the controller's wall time (setup excluded) and trained samples/s, the ratio to
sync, time per phase summed over the run (exposed generation = the trainer waiting for rollouts;
logprobs = reference log-probs, only with --kl; training = forward/backward/optimizer; refit =
weight sync incl. cache reset and abort/drain), the idle fraction of the policy and generation
workers (1 - busy / wall), mean staleness, generated samples that were never trained on, and
the final reward. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import tempfile
from typing import Any

import ray

from asyncgrpo_trainer import driver

P, N = 8, 8
MODES: dict[str, dict[str, Any]] = {
    "sync": {"maxStalenessVersions": 0, "overSampling": False, "maxBufferedRollouts": P},
    "async-in-order": {
        "maxStalenessVersions": 1,
        "overSampling": False,
        "forceInOrder": True,
        "maxBufferedRollouts": 2 * P,
    },
    "streaming-gated": {
        "maxStalenessVersions": 1,
        "overSampling": False,
        "forceInOrder": False,
        "maxBufferedRollouts": 2 * P,
        "minGroupsForStreamingTrain": P // 2,
    },
    "streaming-oversampled": {
        "maxStalenessVersions": 1,
        "overSampling": True,
        "forceInOrder": False,
        "maxBufferedRollouts": 3 * P,
        "minGroupsForStreamingTrain": P // 2,
    },
    # The same with at most P groups generating at once: fewer groups age out while generating.
    "streaming-oversampled-inflight-P": {
        "maxStalenessVersions": 1,
        "overSampling": True,
        "forceInOrder": False,
        "maxBufferedRollouts": 3 * P,
        "maxInflightPrompts": P,
        "minGroupsForStreamingTrain": P // 2,
    },
}


def job(mode: str, *, steps: int, kl: float, max_new_tokens: int, hidden: int, ckpt: str) -> dict[str, Any]:
    return {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": f"bench-{mode}"},
        "spec": {
            "image": "asyncgrpo/trainer:bench",
            "checkpoint": {"path": ckpt, "everySteps": 1_000_000},
            "cluster": {"policyWorkers": {"replicas": 1}, "generationWorkers": {"replicas": 1}},
            "trainer": {
                "model": {
                    "tiny": {"hiddenSize": hidden, "numLayers": 2, "numHeads": 4, "numKvHeads": 2},
                    "maxSequenceLength": 8 + max_new_tokens,
                },
                "grpo": {
                    "numPromptsPerStep": P,
                    "numGenerationsPerPrompt": N,
                    "maxNumSteps": steps,
                    "seed": 1,
                    "valAtEnd": False,
                },
                "asyncRL": MODES[mode],
                "loss": {"referencePolicyKlPenalty": kl},
                "policy": {"trainMicroBatchSize": 64, "learningRate": 2e-3},
                "generation": {"maxNewTokens": max_new_tokens},
                "data": {"maxPromptLength": 8},
            },
        },
    }


def measure(summary: dict[str, Any]) -> dict[str, Any]:
    steps = [r for r in summary["records"] if "reward_mean" in r]
    phases = summary["phases"]
    c = summary["counters"]
    generated = c.get("groups_committed", 0.0) * N
    return {
        "wall_s": summary["wall_seconds"],
        "samples_per_s": summary["samples_per_second"],
        "exposed_generation_s": phases.get("exposed_generation", 0.0),
        "generation_busy_s": summary["generation_busy_seconds"],
        "logprobs_s": phases.get("logprobs", 0.0),
        "training_s": phases.get("training", 0.0),
        "refit_s": phases.get("refit", 0.0),
        "policy_idle": summary["policy_idle_fraction"],
        "generation_idle": summary["generation_idle_fraction"],
        "mean_staleness": sum(r["mean_staleness"] for r in steps) / len(steps),
        "wasted_samples": generated - c.get("samples_trained", 0.0),
        "reward_first5": sum(r["reward_mean"] for r in steps[:5]) / 5,
        "reward_last10": sum(r["reward_mean"] for r in steps[-10:]) / 10,
    }


def markdown(results: dict[str, dict[str, Any]]) -> str:
    base = results["sync"]["wall_s"]
    head = (
        "| mode | wall (s), median [all runs] | samples/s | vs sync | exposed gen (s) | gen busy (s) | "
        "logprobs (s) | training (s) | refit (s) | policy idle | gen idle | staleness | wasted | "
        "reward first5 -> last10 |"
    )
    lines = [head, "|" + "---|" * 14]
    for mode, m in results.items():
        lines.append(
            f"| {mode} | {m['wall_s']:.2f} {m['wall_runs']} | {m['samples_per_s']:.0f} | "
            f"{base / m['wall_s']:.2f}x | "
            f"{m['exposed_generation_s']:.2f} | {m['generation_busy_s']:.2f} | {m['logprobs_s']:.2f} | "
            f"{m['training_s']:.2f} | {m['refit_s']:.2f} | "
            f"{m['policy_idle']:.0%} | {m['generation_idle']:.0%} | "
            f"{m['mean_staleness']:.2f} | {m['wasted_samples']:.0f} | "
            f"{m['reward_first5']:.3f} -> {m['reward_last10']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_trainer.bench")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--kl", type=float, default=0.0, help="KL penalty (adds the reference log-prob phase)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode; the median-wall run is shown")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    ns = parser.parse_args(argv)
    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        kw = {"kl": ns.kl, "max_new_tokens": ns.max_new_tokens, "hidden": ns.hidden}
        driver.execute(job("sync", steps=3, ckpt=f"{tmp}/warm", **kw))  # pays process start-up once
        for mode in ["sync", *[m for m in ns.modes if m != "sync"]]:
            runs = []
            for r in range(ns.repeat):
                runs.append(
                    measure(driver.execute(job(mode, steps=ns.steps, ckpt=f"{tmp}/{mode}-{r}", **kw)))
                )
                print(json.dumps({"mode": mode, "run": r, **runs[-1]}), file=sys.stderr, flush=True)
            runs.sort(key=lambda m: m["wall_s"])
            results[mode] = {**runs[len(runs) // 2], "wall_runs": [round(m["wall_s"], 2) for m in runs]}
    if ns.markdown:
        print(
            f"Measured {datetime.date.today()} with `python -m asyncgrpo_trainer.bench "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n"
        )
        print(markdown(results))
    else:
        print(json.dumps(results, indent=2))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
