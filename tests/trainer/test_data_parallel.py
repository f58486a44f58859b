"""The torch policy backend over two data-parallel Ray actors (gloo) gives the gradient of the
whole batch: its grad_norm equals a direct single-process computation, and both ranks hold the
same weights after the step, with rows split by count or packed and balanced by tokens
(policy.maxTokensPerMicroBatch). Also: the colocated placement trains, and the drain gate leaves no
rollout straddling a weight update."""

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
