"""Trainer benchmark: the same task, model and samples in sync and in each async mode.

    python -m asyncgrpo_trainer.bench --steps 40 [--repeat 3] [--kl 0.01] [--markdown]
    python -m asyncgrpo_trainer.bench --gpus 1 --layers 24 --hidden 896 ...   (see bench/gpu/trainer.sh)

With --repeat R each mode runs R times and the run with the median wall time is reported (the
machine this was written on is shared, and single runs vary by tens of percent). The runs go in R
rounds of every mode (and the floor), not one mode's R runs after another, so a busy spell of the
machine falls on all of them alike; with --floor each run's samples/s is also given against the
floor of its own round (`vs_floor_runs`). Each mode runs
the shipped digit-reversal task for the same number of steps (so the same number of trained samples)
in one embedded Ray cluster, after a warm-up run that pays the process start-up. With --ignore-eos
every response is --max-new-tokens long (generation.ignoreEos): the GPU workload, since the task's
own answers are a few tokens and would leave GPUs idle.

Reported per mode: the controller's wall time (setup and checkpoint writes excluded: the last
step always checkpoints) and trained samples/s, the ratio to sync, time per phase summed over the
run (exposed generation = the trainer waiting for rollouts; logprobs = reference log-probs, only
with --kl; training = forward/backward/optimizer; refit = weight sync incl. cache reset and
abort/drain), the idle fraction of the policy and generation workers (1 - busy / wall), mean
staleness, generated samples that were never trained on, and the final reward. With --gpus G,
the policy and the generation worker get G GPUs each (one pool each, not colocated), the GPUs'
utilization is sampled with nvidia-smi while each mode runs, and the refit is reported per step
against the link bound (policy bytes in the engines' dtype / the broadcast bandwidth given by
--link-bytes-per-s, measured by bench/gpu/refit.py). --out is rewritten after every mode. Run by
tests/trainer/test_trainer_bench_tiny.py in its smallest form.

Learning against the floor (--val-period K --floor): every mode validates every K steps on
--validation-prompts held-out prompts, and the floor (`floor`: GRPO as a plain single-process torch
loop with the same model, seed, task, P x N, learning rate and temperature) runs the same steps in
the same process after each round's modes; the second table gives each one's samples/s (periodic validation
included for all) against the floor's, and the steps to --target held-out greedy accuracy. With
--keep DIR the runs' checkpoint paths (and the floor's curves) stay in DIR for `asyncgrpo plot`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_trainer import driver, envs, floor, learning_curves, specmap, tracking
from asyncgrpo_trainer.models import directory
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

P, N = 8, 8


def modes(p: int) -> dict[str, dict[str, Any]]:
    """The asyncRL settings of each mode for p prompts per step."""
    return {
        "sync": {"maxStalenessVersions": 0, "overSampling": False, "maxBufferedRollouts": p},
        "async-in-order": {
            "maxStalenessVersions": 1,
            "overSampling": False,
            "forceInOrder": True,
            "maxBufferedRollouts": 2 * p,
        },
        "streaming-gated": {
            "maxStalenessVersions": 1,
            "overSampling": False,
            "forceInOrder": False,
            "maxBufferedRollouts": 2 * p,
            "minGroupsForStreamingTrain": p // 2,
        },
        "streaming-oversampled": {
            "maxStalenessVersions": 1,
            "overSampling": True,
            "forceInOrder": False,
            "maxBufferedRollouts": 3 * p,
            "minGroupsForStreamingTrain": p // 2,
        },
        # The same with at most P groups generating at once: fewer groups age out while generating.
        "streaming-oversampled-inflight-P": {
            "maxStalenessVersions": 1,
            "overSampling": True,
            "forceInOrder": False,
            "maxBufferedRollouts": 3 * p,
            "maxInflightPrompts": p,
            "minGroupsForStreamingTrain": p // 2,
        },
        # async-in-order without its default drain before each refit (issue 46's reproducible
        # schedule): what the exact schedule costs in throughput.
        "async-in-order-undrained": {
            "maxStalenessVersions": 1,
            "overSampling": False,
            "forceInOrder": True,
            "maxBufferedRollouts": 2 * p,
            "drainBeforeRefit": False,
        },
    }


MODES = modes(P)


@dataclass(frozen=True)
class Shape:
    """What stays the same across the modes of one benchmark: model, batch, devices."""

    prompts: int = P
    generations: int = N
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None
    max_new_tokens: int = 5
    ignore_eos: bool = False
    max_prompt_length: int = 8
    micro_batch: int = 64
    learning_rate: float = 2e-3
    temperature: float = 1.0
    val_period: int = 0
    validation_prompts: int = 0
    dtype: str = "float32"
    gpus: int = 0
    transport: str = "auto"
    policy_backend: str = "torch"
    model_path: str | None = None
    """A Hugging Face checkpoint (model.source pretrained) instead of the tiny model."""
    generation_backend: str = "torch"
    colocated: bool = False
    """Generation on the policy's GPU (one pool) instead of a pool of its own."""
    sharding: str = "none"
    """policy.sharding.strategy (none, fsdp)."""
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    sleep_while_training: bool = False
    """generation.sleepWhileTraining (sync mode only)."""
    torch_decode: str = "auto"
    """generation.torchDecode (auto, batched, per-group)."""
    seed: int = 1
    """grpo.seed: the tiny model's initial weights, the prompt order and the samples (the floor's too)."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts * self.generations

    def report(self) -> dict[str, Any]:
        """The shape as the results file records it: with a checkpoint, its config.json's sizes
        replace the tiny model's fields, which that run never used."""
        fields = asdict(self)
        if self.model_path is None:
            return fields
        for unused in TINY_FIELDS:
            del fields[unused]
        config = directory.read_json(Path(self.model_path) / directory.CONFIG)
        fields["checkpoint"] = {key: config.get(key) for key in CHECKPOINT_FIELDS}
        return fields


TINY_FIELDS = ("hidden", "layers", "heads", "kv_heads", "intermediate")
CHECKPOINT_FIELDS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)


def job(mode: str, shape: Shape, *, steps: int, kl: float, ckpt: str) -> dict[str, Any]:
    tiny: dict[str, Any] = {
        "hiddenSize": shape.hidden,
        "numLayers": shape.layers,
        "numHeads": shape.heads,
        "numKvHeads": shape.kv_heads,
    }
    if shape.intermediate is not None:
        tiny["intermediateSize"] = shape.intermediate
    pool = {"replicas": 1, "gpusPerReplica": shape.gpus}
    generation_pool = {"replicas": 0, "gpusPerReplica": 0} if shape.colocated else pool
    model: dict[str, Any] = (
        {"source": "pretrained", "path": shape.model_path} if shape.model_path else {"tiny": tiny}
    )
    return {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": f"bench-{mode}"},
        "spec": {
            "image": "asyncgrpo/trainer:bench",
            "checkpoint": {"path": ckpt, "everySteps": 1_000_000},
            "cluster": {"policyWorkers": pool, "generationWorkers": generation_pool},
            "trainer": {
                "model": {
                    **model,
                    "maxSequenceLength": shape.max_prompt_length + shape.max_new_tokens,
                    "dtype": shape.dtype,
                },
                "grpo": {
                    "numPromptsPerStep": shape.prompts,
                    "numGenerationsPerPrompt": shape.generations,
                    "maxNumSteps": steps,
                    "seed": shape.seed,
                    "valPeriod": shape.val_period,
                    "valAtEnd": shape.val_period > 0,
                },
                "asyncRL": modes(shape.prompts)[mode],
                "loss": {"referencePolicyKlPenalty": kl},
                "policy": {
                    "backend": shape.policy_backend,
                    "trainMicroBatchSize": shape.micro_batch,
                    "learningRate": shape.learning_rate,
                    "sharding": {"strategy": shape.sharding, "cpuOffload": shape.cpu_offload},
                    "activationCheckpointing": shape.activation_checkpointing,
                },
                "generation": {
                    "backend": shape.generation_backend,
                    **({"torchDecode": shape.torch_decode} if shape.generation_backend == "torch" else {}),
                    "colocated": shape.colocated,
                    "maxNewTokens": shape.max_new_tokens,
                    "ignoreEos": shape.ignore_eos,
                    "temperature": shape.temperature,
                    "sleepWhileTraining": shape.sleep_while_training,
                    # vLLM's share of the GPU (colocated: leave the other half to the policy); the
                    # torch engine sizes its cache from the job's shape, and admission warns of the
                    # field there as ignored.
                    **(
                        {"gpuMemoryUtilization": 0.4 if shape.colocated else 0.8}
                        if shape.generation_backend == "vllm"
                        else {}
                    ),
                },
                "weightSync": {"transport": shape.transport},
                "data": {
                    "maxPromptLength": shape.max_prompt_length,
                    "numValidationPrompts": shape.validation_prompts,
                },
            },
        },
    }


class GpuUtilization:
    """Samples each GPU's utilization and memory in use with `nvidia-smi -lms` while the block runs
    (no-op without it).

    nvidia-smi's utilization.gpu is the fraction of the sample period in which any kernel ran: an
    upper bound on how busy the SMs were, but the right measure of "the GPU sat idle". memory.used
    counts every process on the GPU (the policy and a colocated engine together).
    """

    def __init__(self, period_ms: int = 200) -> None:
        self.period_ms = period_ms
        self.samples: dict[int, list[tuple[float, float, float]]] = {}  # gpu -> (time, busy %, MiB)

    @contextmanager
    def sampling(self) -> Iterator[GpuUtilization]:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            yield self
            return
        proc = subprocess.Popen(
            [
                exe,
                "--query-gpu=index,utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                f"-lms={self.period_ms}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        reader.start()
        try:
            yield self
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            reader.join(timeout=10)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                index, busy, used = (float(field) for field in line.split(","))
            except ValueError:
                continue
            self.samples.setdefault(int(index), []).append((time.time(), busy, used))

    def mean(self, start: float, end: float) -> dict[str, float]:
        """Mean utilization (0-1) per GPU index over the samples taken in [start, end]."""
        out = {}
        for i, samples in sorted(self.samples.items()):
            inside = [busy for t, busy, _ in samples if start <= t <= end]
            if inside:
                out[f"gpu{i}"] = sum(inside) / len(inside) / 100
        return out

    def peak_gib(self, start: float, end: float) -> dict[str, float]:
        """The most memory in use (GiB) per GPU index over the samples taken in [start, end]."""
        out = {}
        for i, samples in sorted(self.samples.items()):
            inside = [used for t, _, used in samples if start <= t <= end]
            if inside:
                out[f"gpu{i}"] = max(inside) / 1024
        return out


def measure(summary: dict[str, Any], shape: Shape) -> dict[str, Any]:
    steps = [r for r in summary["records"] if "reward_mean" in r]
    phases = summary["phases"]
    c = summary["counters"]
    generated = c.get("groups_committed", 0.0) * shape.generations
    refits = sorted(r.get("refit", 0.0) for r in steps)
    transfers = sorted(r.get("refit_seconds", 0.0) for r in steps)
    pauses = sorted(r.get("generation_pause_seconds", 0.0) for r in steps)
    # The first step also pays one-time work inside the workers (CUDA: compilation, graph capture).
    steady = sum(r["step_seconds"] for r in steps[1:])
    # The last step always checkpoints; its write (GBs on a GPU model) is not what the modes differ in.
    wall = summary["wall_seconds"] - phases.get("checkpointing", 0.0)
    batches = summary.get("generation_batches", 0.0)
    return {
        "wall_s": wall,
        "samples_per_s": summary["samples"] / wall,
        "checkpointing_s": phases.get("checkpointing", 0.0),
        "steady_samples_per_s": (len(steps) - 1) * shape.samples_per_step / steady if steady else 0.0,
        "first_step_s": steps[0]["step_seconds"],
        "response_tokens_per_sample": sum(r["tokens"] for r in steps) / (len(steps) * shape.samples_per_step),
        "generated_tokens_per_s": c.get("tokens_generated", 0.0)
        / max(summary["generation_busy_seconds"], 1e-9),
        "exposed_generation_s": phases.get("exposed_generation", 0.0),
        "generation_busy_s": summary["generation_busy_seconds"],
        "logprobs_s": phases.get("logprobs", 0.0),
        "training_s": phases.get("training", 0.0),
        "refit_s": phases.get("refit", 0.0),
        "refit_median_s": refits[len(refits) // 2] if refits else 0.0,
        # The weight transfer alone (no drain, aborts or cache reset), and how long it stopped
        # generation: the figures a refit's speed is judged by.
        "weight_transfer_median_s": transfers[len(transfers) // 2] if transfers else 0.0,
        "generation_pause_median_s": pauses[len(pauses) // 2] if pauses else 0.0,
        "generation_batches": batches,
        "rows_per_batch": generated / batches if batches else 0.0,
        "policy_idle": max(0.0, 1 - summary["policy_busy_seconds"] / wall),
        "generation_idle": max(0.0, 1 - summary["generation_busy_seconds"] / wall),
        "mean_staleness": sum(r["mean_staleness"] for r in steps) / len(steps),
        # mean(policy log-prob - engine log-prob) of the trained tokens: ~0 in sync mode (dtype
        # noise), so a refit that delivered wrong or late weights would show here.
        "gen_kl_error_sync_steps": [r["gen_kl_error"] for r in steps if r["mean_staleness"] == 0][:5],
        "wasted_samples": generated - c.get("samples_trained", 0.0),
        "reward_first5": sum(r["reward_mean"] for r in steps[:5]) / len(steps[:5]),
        "reward_last10": sum(r["reward_mean"] for r in steps[-10:]) / len(steps[-10:]),
        "validation_accuracy": {
            r["step"]: r["validation_accuracy"] for r in summary["records"] if r.get("event") == "validation"
        },
    }


def run_floor(shape: Shape, steps: int, keep: str | None) -> dict[str, Any]:
    """The floor on the benchmark's shape; its records also go to TensorBoard under keep/floor."""
    t = AsyncGRPOJob.model_validate(job("sync", shape, steps=steps, kl=0.0, ckpt="/unused")).spec.trainer
    model = specmap.tiny_recipe(t, CharTokenizer(envs.build(t.env.name).alphabet))
    cfg = floor.FloorConfig(
        prompts=shape.prompts,
        generations=shape.generations,
        max_new_tokens=shape.max_new_tokens,
        learning_rate=shape.learning_rate,
        temperature=shape.temperature,
        seed=t.grpo.seed,
    )
    torch.set_num_threads(1)  # as each trainer worker
    start = time.perf_counter()
    out = floor.run(
        model,
        cfg,
        steps=steps,
        validate_every=shape.val_period,
        num_validation=shape.validation_prompts or 200,
    )
    wall = time.perf_counter() - start
    if keep:
        curves = tracking.open_curves(f"{keep}/floor", job_name="floor", config={}, resumed_step=None)
        for record in out["records"]:
            curves.write(record)
        curves.close()
    curve = {r["step"]: r["validation_accuracy"] for r in out["records"] if "validation_accuracy" in r}
    return {
        "wall_s": wall,
        "samples_per_s": steps * shape.samples_per_step / wall,
        "validation_accuracy": curve,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time, with every run's wall time."""
    ordered = sorted(runs, key=lambda m: m["wall_s"])
    return {**ordered[len(ordered) // 2], "wall_runs": [round(m["wall_s"], 2) for m in ordered]}


def learning_markdown(results: dict[str, dict[str, Any]], target: float) -> str:
    """Samples/s against the floor's, and the steps to `target` held-out accuracy."""
    base = results["floor"]["samples_per_s"]
    lines = [
        f"| run | samples/s (validation included) | vs floor | steps to held-out {target:g} "
        "| final held-out |",
        "|---|---|---|---|---|",
    ]
    for name, m in results.items():
        curve = {int(k): v for k, v in m["validation_accuracy"].items()}
        reached = learning_curves.steps_to(curve, target)
        final = curve[max(curve)] if curve else float("nan")
        lines.append(
            f"| {name} | {m['samples_per_s']:.0f} | {m['samples_per_s'] / base:.2f}x | "
            f"{reached if reached is not None else 'not reached'} | {final:.3f} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, dict[str, Any]]) -> str:
    base = results["sync"]["wall_s"]
    gpu = any(m.get("gpu_utilization") for m in results.values())
    head = (
        "| mode | wall (s), median [all runs] | samples/s | vs sync | exposed gen (s) | gen busy (s) | "
        "logprobs (s) | training (s) | refit (s) | policy idle | gen idle | staleness | wasted | "
        "reward first5 -> last10 | steady samples/s (steps 2..) | steady vs sync | first step (s) |"
    )
    if gpu:
        head += (
            " GPU util (policy, gen) | refit median (ms) | weight transfer median (ms) |"
            " generation pause median (ms) | gen tokens/s | gen batches (rows each) | GPU peak memory (GiB) |"
        )
    lines = [head, "|" + "---|" * (24 if gpu else 17)]
    steady_base = results["sync"]["steady_samples_per_s"]
    for mode, m in results.items():
        line = (
            f"| {mode} | {m['wall_s']:.2f} {m['wall_runs']} | {m['samples_per_s']:.0f} | "
            f"{base / m['wall_s']:.2f}x | "
            f"{m['exposed_generation_s']:.2f} | {m['generation_busy_s']:.2f} | {m['logprobs_s']:.2f} | "
            f"{m['training_s']:.2f} | {m['refit_s']:.2f} | "
            f"{m['policy_idle']:.0%} | {m['generation_idle']:.0%} | "
            f"{m['mean_staleness']:.2f} | {m['wasted_samples']:.0f} | "
            f"{m['reward_first5']:.3f} -> {m['reward_last10']:.3f} | "
            f"{m['steady_samples_per_s']:.0f} | {m['steady_samples_per_s'] / max(steady_base, 1e-9):.2f}x | "
            f"{m['first_step_s']:.1f} |"
        )
        if gpu:
            util = ", ".join(f"{v:.0%}" for v in m.get("gpu_utilization", {}).values())
            line += f" {util} | {m['refit_median_s'] * 1e3:.1f} | {m['weight_transfer_median_s'] * 1e3:.1f} |"
            line += f" {m['generation_pause_median_s'] * 1e3:.1f} | {m['generated_tokens_per_s']:,.0f} |"
            line += f" {m['generation_batches']:.0f} ({m['rows_per_batch']:.0f}) |"
            line += f" {', '.join(f'{v:.1f}' for v in m.get('gpu_peak_memory_gib', {}).values())} |"
        lines.append(line)
    return "\n".join(lines)


def policy_bytes(manifest: dict[str, Any]) -> int:
    """Bytes of the job's policy weights in the engines' dtype (what one refit moves)."""
    job = AsyncGRPOJob.model_validate(manifest)
    recipe, _ = driver.model_of(job, envs.build(job.spec.trainer.env.name))
    return sum(p.numel() * recipe.torch_dtype.itemsize for p in recipe.skeleton().parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_trainer.bench")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--kl", type=float, default=0.0, help="KL penalty (adds the reference log-prob phase)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generation.ignoreEos: every response is --max-new-tokens long (a throughput workload)",
    )
    parser.add_argument("--max-prompt-length", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=P, help="prompts per step")
    parser.add_argument("--generations", type=int, default=N, help="samples per prompt")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--temperature", type=float, default=1.0, help="generation.temperature")
    parser.add_argument("--val-period", type=int, default=0, help="grpo.valPeriod (0: no validation)")
    parser.add_argument("--validation-prompts", type=int, default=200, help="held-out prompts per validation")
    parser.add_argument("--floor", action="store_true", help="also run the floor (see the module docstring)")
    parser.add_argument("--target", type=float, default=0.8, help="held-out accuracy for 'steps to'")
    parser.add_argument("--keep", default=None, help="keep the runs' checkpoint paths (curves) in this dir")
    parser.add_argument("--dtype", default="float32", help="model dtype (float32, bfloat16)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per worker pool (policy, generation)")
    parser.add_argument("--transport", default="auto", help="weightSync.transport")
    parser.add_argument(
        "--model-path", default=None, help="a Hugging Face checkpoint instead of the tiny model"
    )
    parser.add_argument("--generation-backend", default="torch", help="generation.backend (torch, vllm)")
    parser.add_argument("--colocated", action="store_true", help="generation on the policy's GPU")
    parser.add_argument("--policy-backend", default="torch", help="policy.backend (torch, megatron)")
    parser.add_argument("--sharding", default="none", help="policy.sharding.strategy (none, fsdp)")
    parser.add_argument("--cpu-offload", action="store_true", help="policy.sharding.cpuOffload")
    parser.add_argument(
        "--activation-checkpointing", action="store_true", help="policy.activationCheckpointing"
    )
    parser.add_argument(
        "--sleep-while-training", action="store_true", help="generation.sleepWhileTraining (sync only)"
    )
    parser.add_argument("--link-bytes-per-s", type=float, default=None, help="for the refit bound")
    parser.add_argument(
        "--torch-decode",
        default="auto",
        choices=["auto", "batched", "per-group"],
        help="generation.torchDecode",
    )
    parser.add_argument("--seed", type=int, default=1, help="grpo.seed of every run and the floor")
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode; the median-wall run is shown")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps of the untimed first run")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    ns = parser.parse_args(argv)
    shape = Shape(
        prompts=ns.prompts,
        generations=ns.generations,
        hidden=ns.hidden,
        layers=ns.layers,
        heads=ns.heads,
        kv_heads=ns.kv_heads,
        intermediate=ns.intermediate,
        max_new_tokens=ns.max_new_tokens,
        ignore_eos=ns.ignore_eos,
        max_prompt_length=ns.max_prompt_length,
        micro_batch=ns.micro_batch,
        learning_rate=ns.learning_rate,
        temperature=ns.temperature,
        val_period=ns.val_period,
        validation_prompts=ns.validation_prompts if ns.val_period else 0,
        dtype=ns.dtype,
        gpus=ns.gpus,
        transport=ns.transport,
        policy_backend=ns.policy_backend,
        model_path=ns.model_path,
        generation_backend=ns.generation_backend,
        colocated=ns.colocated,
        sharding=ns.sharding,
        cpu_offload=ns.cpu_offload,
        activation_checkpointing=ns.activation_checkpointing,
        sleep_while_training=ns.sleep_while_training,
        seed=ns.seed,
        torch_decode=ns.torch_decode,
    )
    refit_bound = None
    if ns.link_bytes_per_s:
        moved = policy_bytes(job("sync", shape, steps=1, kl=0.0, ckpt="/unused"))
        refit_bound = {"policy_bytes": moved, "bound_s": moved / ns.link_bytes_per_s}
    results: dict[str, dict[str, Any]] = {}

    def write_out() -> None:  # after every mode: a run cut off by a time limit keeps what it measured
        if ns.out:
            with open(ns.out, "w") as f:
                report = {"shape": shape.report(), "steps": ns.steps, "refit_bound": refit_bound}
                json.dump({**report, "modes": results}, f, indent=2)

    own_ray = not ray.is_initialized()  # else run in the caller's cluster (the test suite's)
    if own_ray:
        gpus = ns.gpus if ns.colocated else 2 * ns.gpus
        ray.init(num_cpus=4, num_gpus=gpus, include_dashboard=False, logging_level=logging.WARNING)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = ns.keep or scratch
        # Pays process start-up (and on CUDA compilation and graph capture) once, untimed.
        if ns.warmup_steps:  # 0: no warm-up run (a vLLM engine start costs minutes each run)
            driver.execute(job("sync", shape, steps=ns.warmup_steps, kl=ns.kl, ckpt=f"{tmp}/warm"))
        modes = ["sync", *[m for m in ns.modes if m != "sync"]]
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        floors: list[dict[str, Any]] = []
        for r in range(ns.repeat):  # rounds of every mode and the floor, so a slow spell hits all alike
            for mode in modes:
                util = GpuUtilization()
                with util.sampling():
                    summary = driver.execute(
                        job(mode, shape, steps=ns.steps, kl=ns.kl, ckpt=f"{tmp}/{mode}-{r}")
                    )
                m = measure(summary, shape)
                # The controller's run without its final checkpoint: the window the wall covers.
                window = (summary["started_at"], summary["started_at"] + m["wall_s"])
                runs[mode].append(
                    {
                        **m,
                        "gpu_utilization": util.mean(*window),
                        "gpu_peak_memory_gib": util.peak_gib(*window),
                    }
                )
                print(json.dumps({"mode": mode, "run": r, **runs[mode][-1]}), file=sys.stderr, flush=True)
                results[mode] = median_run(runs[mode])
                write_out()
            if ns.floor:
                floors.append(run_floor(shape, ns.steps, ns.keep if r == 0 else None))
                print(json.dumps({"mode": "floor", "run": r, **floors[-1]}), file=sys.stderr, flush=True)
                results["floor"] = median_run(floors)
                for mode in modes:  # each run against the floor of its own round
                    results[mode]["vs_floor_runs"] = [
                        round(m["samples_per_s"] / f["samples_per_s"], 3)
                        for m, f in zip(runs[mode], floors, strict=False)
                    ]
                write_out()
    if own_ray:
        ray.shutdown()
    if ns.markdown:
        print(
            f"Measured {datetime.date.today()} with `python -m asyncgrpo_trainer.bench "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n"
        )
        by_mode = {k: v for k, v in results.items() if k != "floor"}
        print(markdown(by_mode))
        if "floor" in results:
            print(f"\n{learning_markdown({'floor': results['floor'], **by_mode}, ns.target)}")
        if refit_bound is not None:
            moved_mb, bound_ms = refit_bound["policy_bytes"] / 1e6, refit_bound["bound_s"] * 1e3
            print(f"\nrefit bound: {moved_mb:.0f} MB / link = {bound_ms:.2f} ms")
    else:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
