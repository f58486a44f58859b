"""Refit over the collective path (weights.BroadcastSynchronizer), on CPU where `weightSync.transport:
nccl` runs it over gloo (the same code NCCL runs on GPUs): `asyncgrpo run` of such a job trains and
reports gloo, and a whole run through it leaves every engine with exactly the policy's weights; the
bucket plan both sides derive from the recipe fits both models; fp32 master weights arrive cast to
the engines' bf16, in place. Which transport a job runs: tests/api/test_rules.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from asyncgrpo_trainer import controller, driver, weights
from asyncgrpo_trainer.backends.cuda_train import Recipe
from asyncgrpo_trainer.backends.nccl_sync import BucketPlan, RefitGroup, RefitSpec, refit_plan, serve_store
from asyncgrpo_trainer.models.network import CausalLM
from tests.trainer import jobs
from tests.trainer.test_grpo_math import BUILD, _rows
from tests.trainer.test_policy_recipe import _worker

BF16 = dataclasses.replace(BUILD, dtype="bfloat16")


def _engine_state(actor: Any) -> tuple[dict[str, torch.Tensor], Any]:
    return ray.get(  # type: ignore[no-any-return]
        actor.__ray_call__.remote(
            lambda self: ({k: v.detach().clone() for k, v in self.model.state_dict().items()}, self.build)
        )
    )


@pytest.mark.trainer
def test_asyncgrpo_run_of_a_cpu_job_with_nccl_refits_over_gloo(tmp_path: Path) -> None:
    job = jobs.manifest(
        "async-in-order", steps=3, checkpoint_dir=str(tmp_path / "ckpt"), weightSync={"transport": "nccl"}
    )
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", driver.USAGE_STATS_ENV)}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "asyncgrpo"), "run", "job.json", "--jsonl", "steps.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    steps = [e for e in lines if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    assert {e["refit_transport"] for e in steps} == {"gloo"}
    # Each refit's transfer and its pause of generation, reported apart: the torch engine receives
    # the broadcast in the background and stops generating only to swap the weights in.
    for e in steps:
        assert 0 < e["generation_pause_seconds"] < e["refit_seconds"] <= e["refit"], e


@pytest.mark.trainer
def test_a_run_refitting_by_broadcast_leaves_every_engine_with_exactly_the_policy_weights(
    ray_address: str, tmp_path: Path
) -> None:
    job = jobs.manifest(
        "async-in-order",
        steps=3,
        checkpoint_dir=str(tmp_path),
        name="bcast",
        weightSync={"transport": "nccl"},
    )
    job["spec"]["cluster"]["generationWorkers"]["replicas"] = 2
    built = driver.build(driver.parse_job(job))
    try:
        assert isinstance(built.args.weights, weights.BroadcastSynchronizer)  # nccl on CPU: over gloo
        # Buckets of 4 KiB, below what bucketSizeMB can ask for, so the tiny model takes several.
        built.args.weights = weights.BroadcastSynchronizer(
            built.args.policy, built.args.generation, bucket_bytes=4096, timeout_seconds=120
        )
        actor = controller.SingleControllerActor.remote(built.args)  # type: ignore[attr-defined]
        try:
            ray.get(built.ready)
            summary = driver.supervise(actor, None, stall_seconds=120)
        finally:
            ray.kill(actor, no_restart=True)
        steps = [r for r in summary["records"] if "reward_mean" in r]
        assert len(steps) == 3
        assert {r["refit_transport"] for r in steps} == {"gloo"}
        policy_weights = ray.get(built.args.policy.actors[0].weights.remote())
        for engine in built.args.generation.actors:
            got, build = _engine_state(engine)
            assert got.keys() == policy_weights.keys()
            assert all(torch.equal(got[k], policy_weights[k]) for k in got)
            initial = build.instantiate().state_dict()
            assert any(not torch.equal(got[k], initial[k]) for k in got)  # trained weights arrived
            assert ray.get(engine.stats.remote())["version"] == 3
    finally:
        driver._teardown(built)


def test_the_plan_from_the_recipe_fits_the_fp32_policy_and_the_bf16_engine() -> None:
    plan = refit_plan(BF16, bucket_bytes=4096)
    master = _worker(Recipe(master_fp32=True), build=BF16)
    engine = BF16.instantiate()
    assert plan == BucketPlan.for_tensors(engine.named_parameters(), bucket_bytes=4096)
    assert plan == BucketPlan.for_tensors(
        master.model.named_parameters(), dtype=torch.bfloat16, bucket_bytes=4096
    )
    assert plan.num_buckets > 1
    plan.check(master.model.named_parameters())
    other = CausalLM(dataclasses.replace(BF16.config, intermediate_size=64))
    with pytest.raises(ValueError, match="does not match the refit plan"):
        plan.check(other.named_parameters())


def test_fp32_master_weights_arrive_cast_to_the_engines_bf16_in_place() -> None:
    sender = _worker(Recipe(master_fp32=True), build=BF16)
    sender.train_chunk(_rows(6))
    sender.finish_step()  # fp32 masters that bf16 cannot hold exactly
    engine = BF16.instantiate()
    before = {n: p.data_ptr() for n, p in engine.named_parameters()}
    store = serve_store("127.0.0.1", 2, 30.0)
    spec = RefitSpec("127.0.0.1", store.port, 2, "gloo", bucket_bytes=4096, timeout_seconds=30.0)
    groups: dict[int, RefitGroup] = {}

    def join(rank: int, model: torch.nn.Module) -> None:  # gloo forms the group once both are in
        groups[rank] = RefitGroup(
            spec,
            rank=rank,
            build=BF16,
            named=model.named_parameters(),
            device=torch.device("cpu"),
            store=store if rank == 0 else None,
        )

    threads = [
        threading.Thread(target=join, args=(0, sender.model)),
        threading.Thread(target=join, args=(1, engine)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    send = threading.Thread(target=groups[0].broadcast.sync, args=(dict(sender.model.named_parameters()),))
    send.start()
    groups[1].broadcast.receive()
    send.join(60)
    masters = dict(sender.model.named_parameters())
    assert any(not torch.equal(p, p.to(torch.bfloat16).float()) for p in masters.values())
    groups[1].broadcast.unpack(dict(engine.named_parameters()))
    for name, p in engine.named_parameters():
        assert p.data_ptr() == before[name]  # written in place
        assert torch.equal(p.detach(), masters[name].detach().to(torch.bfloat16)), name
