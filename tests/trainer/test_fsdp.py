"""FSDP2 sharding and activation checkpointing in the torch policy, on CPU: two gloo ranks as Ray
actors, real torch.distributed, a tiny random Qwen2 checkpoint with tied embeddings.

One scenario (`trained`, once per module) runs a sharded group (policy.sharding fsdp, activation
checkpointing on) next to an unsharded data-parallel group on the same rows: KL on (the reference
model is sharded too), PPO mini-batches and a top-p filter (every kind of forward pass), and chunks
that leave a rank without rows (it must still join every collective). It checks that

- after each of 3 steps the sharded weights are the unsharded ones (within 1e-5) and so are the
  step's metrics;
- a refit, by broadcast and by the object store, lands the unsharded policy's weights in the
  engines (the shards gathered under the engines' names);
- the sharded group's checkpoint is the unsharded format (policy.pt, optimizer state numbered the
  same), exports to a Hugging Face directory transformers loads, and resumes either group: the step
  after loading it is the step taken from the state it saved.

Also: activation checkpointing gives the same gradients while keeping fewer tensors for the
backward pass, and a job with a sharded policy runs to the end through the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import ray
import torch

from asyncgrpo_trainer import checkpoint, cluster, driver, export, workers
from asyncgrpo_trainer import weights as weight_sync
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from asyncgrpo_trainer.models import recipe
from tests.trainer import jobs
from tests.trainer.test_grpo_math import BUILD

OPTIM = policy.OptimConfig(
    learning_rate=1e-3,
    weight_decay=0.01,
    max_grad_norm=0.5,
    warmup_steps=0,
    micro_batch_size=2,
    logprob_batch_size=3,
    temperature=0.7,
    top_p=0.9,
    minibatches=2,
)
LOSS = losses.LossConfig(reference_policy_kl_penalty=0.05)
Result = TypeVar("Result")
CHUNKS = ((0, 7), (7, 8), (8, 11))
"""A step's chunks of its 11 rows; the 1-row chunk leaves rank 1 without rows."""
CLOSE = 1e-5
"""Sharded against unsharded, in float32: the gradients are summed in another order."""
DEADLINE = 300.0
"""Seconds for one call of the groups: a rank left out of a collective fails the test, not the run."""


def _rows(build: recipe.ModelBuild, seed: int) -> list[policy.TrainRow]:
    """11 rows of random ids, prompts 2-5 and responses 1-4 tokens."""
    g = torch.Generator().manual_seed(seed)
    vocab = build.config.vocab_size
    rows = []
    for i in range(CHUNKS[-1][1]):
        prompt = torch.randint(0, vocab, (2 + i % 4,), generator=g).tolist()
        length = 1 + (i * 3) % 4
        response = torch.randint(0, vocab, (length,), generator=g).tolist()
        generated = (-torch.rand(length, generator=g) * 3).tolist()
        rows.append(policy.TrainRow(prompt, response, generated, float(torch.randn(1, generator=g))))
    return rows


async def _step(group: workers.PolicyGroup, rows: list[policy.TrainRow]) -> dict[str, float | None]:
    """One RL step as the controller runs it: per chunk, reference log-probs, then training."""
    for start, end in CHUNKS:
        chunk = rows[start:end]
        reference = await group.reference_logprobs([(r.prompt_ids, r.response_ids) for r in chunk])
        await group.train_chunk(
            [dataclasses.replace(r, reference_logprobs=lp) for r, lp in zip(chunk, reference, strict=True)]
        )
    return await group.finish_step()


def _run(call: Coroutine[Any, Any, Result]) -> Result:
    return asyncio.run(asyncio.wait_for(call, DEADLINE))


def _weights(group: workers.PolicyGroup) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = ray.get(group.weights_ref(), timeout=DEADLINE)
    return weights


def _assert_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    worst = max((got[k].float() - expected[k].float()).abs().max().item() for k in expected)
    assert worst <= CLOSE, worst


def _engine_weights(engine: Any) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = ray.get(engine.__ray_call__.remote(lambda self: self.model.state_dict()))
    return state


@pytest.fixture(scope="module")
def trained(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The scenario of the module docstring; what each test checks. Its actors and placement
    groups are gone before the tests run, so the job below finds the CPUs free."""
    from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint  # noqa: PLC0415

    root = tmp_path_factory.mktemp("fsdp")
    build, _ = recipe.pretrained_build(
        str(make_tiny_checkpoint(root / "qwen2-tied")),
        max_sequence_length=32,
        dtype="float32",
        seed=0,
        chat_template=None,
        system_prompt=None,
    )
    sharded_pools = cluster.build_pools(
        policy_ranks=2, policy_gpus=0, generation_ranks=2, generation_gpus=0, colocated=False, name="fsdp"
    )
    plain_pools = cluster.build_pools(
        policy_ranks=2, policy_gpus=0, generation_ranks=1, generation_gpus=0, colocated=False, name="dp"
    )
    sharded, sharded_ready = workers.start_policy_group(
        sharded_pools[0], build, OPTIM, LOSS, 0, sharding=policy.Sharding(), activation_checkpointing=True
    )
    plain, plain_ready = workers.start_policy_group(plain_pools[0], build, OPTIM, LOSS, 0)
    engines, engines_ready = workers.start_generation_group(sharded_pools[1], workers.EngineSpec(build, 0))
    out: dict[str, Any] = {"build": build, "steps": []}
    try:
        ray.get(sharded_ready + plain_ready + engines_ready)
        for seed in range(3):
            rows = _rows(build, seed)
            metrics = [_run(_step(g, rows)) for g in (sharded, plain)]
            out["steps"].append((metrics, _weights(sharded), _weights(plain)))
        # The refit of the step's weights, by each transport, into an engine of its own.
        broadcast = weight_sync.BroadcastSynchronizer(
            sharded, workers.GenerationGroup(engines.actors[:1]), bucket_bytes=4096, timeout_seconds=120
        )
        _run(broadcast.sync(1))
        store = weight_sync.ObjectStoreSynchronizer(sharded, workers.GenerationGroup(engines.actors[1:]), 120)
        _run(store.sync(1))
        out["engines"] = [_engine_weights(e) for e in engines.actors]
        # The sharded group's checkpoint, then a 4th step, then that step again from the checkpoint.
        tmp = checkpoint.begin(root / "checkpoints", 3)
        _run(sharded.save(str(tmp)))
        out["checkpoint"] = checkpoint.commit(tmp, 3, {}, keep_last=1, meta={"model": build.to_json()})
        out["plain_state"] = ray.get(plain.actors[0].state.remote(), timeout=DEADLINE)
        fourth = _rows(build, 3)
        for g in (sharded, plain):
            _run(_step(g, fourth))
        out["fourth"] = _weights(plain)
        out["resumed"] = {}
        for name, g in (("sharded", sharded), ("plain", plain)):
            _run(g.load(str(out["checkpoint"])))
            _run(_step(g, fourth))
            out["resumed"][name] = _weights(g)
    finally:
        groups = (sharded, plain)
        with contextlib.suppress(ray.exceptions.GetTimeoutError):  # a rank stuck in a collective
            ray.get([a.shutdown.remote() for g in groups for a in g.actors], timeout=60)
        workers.kill(*groups, engines)
        cluster.release(*sharded_pools, *plain_pools)
    return out


@pytest.mark.trainer
def test_a_sharded_step_gives_the_unsharded_steps_weights_and_metrics(trained: dict[str, Any]) -> None:
    for (sharded_metrics, plain_metrics), sharded_weights, plain_weights in trained["steps"]:
        _assert_close(sharded_weights, plain_weights)
        for key in ("loss", "grad_norm", "kl", "clip_fraction", "is_weight_mean"):
            assert sharded_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-4, abs=1e-6), key
        assert sharded_metrics["train_tokens"] == plain_metrics["train_tokens"]
    first, last = trained["steps"][0][2], trained["steps"][-1][2]
    assert max((first[k] - last[k]).abs().max().item() for k in first) > 100 * CLOSE  # it trained


@pytest.mark.trainer
def test_the_refit_gathers_the_shards_into_the_engines(trained: dict[str, Any]) -> None:
    _, _, plain_weights = trained["steps"][-1]
    for engine_weights in trained["engines"]:  # broadcast, object store
        _assert_close(engine_weights, plain_weights)


@pytest.mark.trainer
def test_a_sharded_checkpoint_is_the_unsharded_format_and_resumes_with_or_without_sharding(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    step: Path = trained["checkpoint"]
    assert sorted(p.name for p in step.iterdir()) == ["hf", "meta.json", "policy.pt", "state.pt"]
    written = checkpoint.read(step / policy.POLICY_FILE, fix="")
    plain = trained["plain_state"]
    _assert_close(written["model"], plain["model"])
    _assert_close(written["reference"], plain["reference"])
    assert written["steps_taken"] == plain["steps_taken"] == 6  # 3 RL steps x 2 mini-batches
    ours, theirs = written["optimizer"], plain["optimizer"]
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for i, moments in theirs["state"].items():
        _assert_close(ours["state"][i], moments)
    # asyncgrpo export, loaded by transformers, holds the trained weights (the tied head included).
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    exported = AutoModelForCausalLM.from_pretrained(export.export(step, tmp_path / "hf"), dtype=torch.float32)
    hf_state = exported.state_dict()
    _assert_close({k: hf_state[k] for k in plain["model"]}, plain["model"])
    # Loading it and taking the 4th step again gives the 4th step taken from the saved state.
    for resumed in trained["resumed"].values():
        _assert_close(resumed, trained["fourth"])


def test_activation_checkpointing_keeps_fewer_tensors_for_the_backward_and_gives_the_same_gradients() -> None:
    rows = [dataclasses.replace(r, reference_logprobs=None) for r in _rows(BUILD, 0)]
    optim = dataclasses.replace(OPTIM, micro_batch_size=len(rows), top_p=1.0, minibatches=1)

    def gradients_and_saved_bytes(recompute: bool) -> tuple[dict[str, torch.Tensor], int]:
        worker = policy.TorchPolicyWorker(
            BUILD,
            optim,
            losses.LossConfig(),
            rank=0,
            world_size=1,
            device="cpu",
            activation_checkpointing=recompute,
        )
        saved = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            worker.train_chunk(rows)
        grads = {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}
        return grads, sum(saved)

    plain, plain_bytes = gradients_and_saved_bytes(False)
    recomputed, recomputed_bytes = gradients_and_saved_bytes(True)
    assert recomputed.keys() == plain.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=0, atol=1e-7)
    assert recomputed_bytes < 0.5 * plain_bytes, (recomputed_bytes, plain_bytes)


@pytest.mark.trainer
def test_a_job_with_a_sharded_policy_runs_to_the_end(ray_address: str, tmp_path: Path) -> None:
    job = jobs.manifest(
        "async-in-order",
        steps=2,
        checkpoint_dir=str(tmp_path),
        name="fsdp-job",
        policy={"trainMicroBatchSize": 32, "sharding": {"strategy": "fsdp"}, "activationCheckpointing": True},
    )
    job["spec"]["cluster"]["policyWorkers"]["replicas"] = 2
    summary = driver.execute(job)
    assert len([r for r in summary["records"] if "reward_mean" in r]) == 2
    assert (checkpoint.step_dir(tmp_path, 2) / policy.POLICY_FILE).is_file()
