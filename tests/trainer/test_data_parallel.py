"""The torch policy backend over two data-parallel Ray actors (gloo) gives the gradient of the
whole batch: its grad_norm equals a direct single-process computation, and both ranks hold the
same weights after the step, with rows split by count or packed and balanced by tokens
(policy.maxTokensPerMicroBatch). Also: the colocated placement trains, the drain gate leaves no
rollout straddling a weight update, and a colocated engine sleeps while the policy trains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import ray
import torch

from asyncgrpo_trainer import cluster, driver, workers
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import policy
from tests.trainer import jobs
from tests.trainer.test_grpo_math import BUILD, _direct_grad_norm, _rows


@pytest.mark.trainer
@pytest.mark.parametrize("token_budget", [None, 16], ids=["rows", "packed-and-token-balanced"])
def test_two_data_parallel_ranks_produce_the_global_gradient(
    ray_address: str, token_budget: int | None
) -> None:
    pools = cluster.build_pools(
        policy_ranks=2, policy_gpus=0, generation_ranks=1, generation_gpus=0, colocated=False, name="dp-test"
    )
    optim = policy.OptimConfig(
        learning_rate=1e-3,
        weight_decay=0.0,
        max_grad_norm=0.5,
        warmup_steps=0,
        micro_batch_size=3,
        logprob_batch_size=3,
        temperature=1.0,
        max_tokens_per_micro_batch=token_budget,
    )
    group, ready = workers.start_policy_group(pools[0], BUILD, optim, losses.LossConfig(), gpus=0)
    try:
        ray.get(ready)
        rows = _rows(11)  # uneven: 6 rows on rank 0, 5 on rank 1 (packed: by tokens)
        for chunk in (rows[:7], rows[7:]):
            asyncio.run(group.train_chunk(chunk))
        results = ray.get([a.finish_step.remote() for a in group.actors])
        expected = _direct_grad_norm(rows)
        assert results[0]["grad_norm"] == pytest.approx(expected, rel=1e-4)
        assert results[1]["grad_norm"] == pytest.approx(expected, rel=1e-4)
        assert results[0]["train_tokens"] == sum(len(r.response_ids) for r in rows)
        w0, w1 = ray.get([a.weights.remote() for a in group.actors])
        assert all(torch.equal(w0[k], w1[k]) for k in w0)
    finally:
        ray.get([a.shutdown.remote() for a in group.actors])
        workers.kill(group)
        cluster.release(*pools)


@pytest.mark.trainer
def test_colocated_pools_with_a_drain_gate_train_and_no_rollout_straddles_a_refit(
    ray_address: str, tmp_path: Path
) -> None:
    job = jobs.manifest("streaming-oversampled", steps=8, checkpoint_dir=str(tmp_path), name="drain")
    job["spec"]["trainer"]["asyncRL"]["drainBeforeRefit"] = True
    job["spec"]["trainer"]["generation"]["colocated"] = True
    job["spec"]["cluster"]["generationWorkers"]["replicas"] = 0
    summary = driver.execute(job)
    steps = [r for r in summary["records"] if "reward_mean" in r]
    assert len(steps) == 8
    assert summary["counters"].get("groups_straddling_refit", 0) == 0
    assert summary["phases"].get("drain_wait", 0.0) > 0


@pytest.mark.trainer
def test_a_colocated_sync_job_whose_engine_sleeps_while_training_trains_every_step_on_its_samples(
    ray_address: str, tmp_path: Path
) -> None:
    """generation.sleepWhileTraining with the torch engine and real Ray actors: every step's engine
    sleeps before the policy trains and wakes for the refit, and the job trains on the samples it
    generated (the first step's engine and policy log-probs agree, so the woken engine holds the
    policy's weights: the gate's mean ratio is 1)."""
    job = jobs.manifest("sync", steps=4, checkpoint_dir=str(tmp_path), name="sleep")
    generation = job["spec"]["trainer"]["generation"]
    generation.update(colocated=True, sleepWhileTraining=True)
    job["spec"]["cluster"]["generationWorkers"]["replicas"] = 0
    summary = driver.execute(job)
    steps = [r for r in summary["records"] if "reward_mean" in r]
    assert len(steps) == 4
    assert summary["counters"]["generation_sleeps"] == 4
    assert all(r["generation_sleep"] > 0 and r["generation_wake"] > 0 for r in steps)
    assert all(r["max_staleness"] == 0 for r in steps)
    assert steps[0]["gen_logprob_error"] == pytest.approx(1.0, abs=1e-4)  # exp(engine - policy)
