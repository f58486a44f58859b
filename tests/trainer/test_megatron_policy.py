"""The Megatron-core policy backend against the torch one, on CPU (gloo).

- the name/layout mapping Megatron <-> CausalLM is a lossless round trip, and so is the
  tensor-parallel split of every parameter (pure torch, runs without megatron-core);
- a TP=1 GPTModel built from a recipe computes CausalLM's logits and hands back its weights;
- one training step (KL on, temperature != 1, several micro-batches) gives TorchPolicyWorker's
  loss, grad norm, metrics, reference log-probs and updated weights;
- two gloo processes, once as TP=2 (the odd vocabulary is padded and sharded) and once as DP=2,
  give the same log-probs, step metrics and updated weights as one process;
- a rank's checkpoint file round-trips (a shard of another TP layout, or a missing one, names the file
  and the field), and the layouts this backend does not run are rejected with their field.

The two-process cases run this file as a script (one process per rank), so no forked process
inherits torch's threads.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import megatron_mapping as mapping
from asyncgrpo_trainer.backends import policy, sampling
from tests.trainer.test_grpo_math import BUILD, _rows

ROOT = Path(__file__).resolve().parents[2]
OPTIM = policy.OptimConfig(
    learning_rate=1e-3,
    weight_decay=0.01,
    max_grad_norm=0.5,
    warmup_steps=0,
    micro_batch_size=3,
    logprob_batch_size=4,
    temperature=0.7,
)
LOSS = losses.LossConfig(reference_policy_kl_penalty=0.05)
ROWS = 8


def _training_rows() -> list[policy.TrainRow]:
    """Rows with reference log-probs (the KL term is on), from the torch reference model."""
    rows = _rows(ROWS)
    ref = _torch_worker().reference_logprobs([(r.prompt_ids, r.response_ids) for r in rows])
    return [
        policy.TrainRow(r.prompt_ids, r.response_ids, r.generation_logprobs, r.advantage, lp)
        for r, lp in zip(rows, ref, strict=True)
    ]


def _torch_worker() -> policy.TorchPolicyWorker:
    return policy.TorchPolicyWorker(BUILD, OPTIM, LOSS, rank=0, world_size=1, device="cpu")


def _torch_step(rows: list[policy.TrainRow]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    worker = _torch_worker()
    worker.train_chunk(rows[:5])
    worker.train_chunk(rows[5:])
    return worker.finish_step(), worker.weights()


# --- the mapping (no megatron-core needed) ----------------------------------------------------------


def test_mapping_round_trips_tinycausallm_weights() -> None:
    tiny = BUILD.instantiate().state_dict()
    padded = mapping.padded_vocab_size(BUILD.config.vocab_size, 4)
    full = mapping.tiny_to_megatron(tiny, BUILD.config, padded_vocab=padded)
    assert full["output_layer.weight"].shape[0] == padded == 16
    back = mapping.megatron_to_tiny(full, BUILD.config)
    assert back.keys() == tiny.keys()
    assert all(torch.equal(back[k], tiny[k]) for k in tiny)


def test_fused_qkv_is_grouped_per_kv_head() -> None:
    """Rows of group g: its query heads, then k_g, then v_g (Megatron's layout)."""
    cfg = BUILD.config  # 4 heads, 2 kv heads, head width 8
    d = cfg.hidden_size // cfg.num_heads
    q = torch.arange(cfg.num_heads).repeat_interleave(d).float()
    k = 10 + torch.arange(cfg.num_kv_heads).repeat_interleave(d).float()
    v = 20 + torch.arange(cfg.num_kv_heads).repeat_interleave(d).float()
    fused = mapping._fuse_qkv(q, k, v, cfg)
    assert fused[::d].tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert all(torch.equal(a, b) for a, b in zip(mapping._split_qkv(fused, cfg), (q, k, v), strict=True))


def test_tensor_parallel_shards_round_trip_and_keep_gate_and_up_apart() -> None:
    full = mapping.tiny_to_megatron(BUILD.instantiate().state_dict(), BUILD.config, padded_vocab=16)
    for name, tensor in full.items():
        shards = [mapping.shard(name, tensor, rank=r, size=2) for r in range(2)]
        assert torch.equal(mapping.unshard(name, shards), tensor), name
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
    inter = BUILD.config.intermediate_size
    piece = mapping.shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, rank=1, size=2)
    assert torch.equal(piece[: inter // 2], fc1[inter // 2 : inter])  # rank 1's half of gate
    assert torch.equal(piece[inter // 2 :], fc1[inter + inter // 2 :])  # and of up


# --- the backend on CPU -------------------------------------------------------------------------------


@pytest.fixture
def megatron_worker() -> Iterator[Any]:
    """A one-process TP=1 MegatronPolicyWorker (Megatron's parallel state is per process)."""
    pytest.importorskip("megatron.core")
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    worker = megatron_policy.MegatronPolicyWorker(BUILD, OPTIM, LOSS, rank=0, world_size=1, device="cpu")
    try:
        yield worker
    finally:
        worker.shutdown()


def test_gptmodel_computes_tinycausallm_logits_and_weights(megatron_worker: Any) -> None:
    tiny = BUILD.instantiate()
    rows = [(r.prompt_ids, r.response_ids) for r in _rows(ROWS)]
    ids = torch.tensor([p + r for p, r in rows[:1]])
    with torch.no_grad():
        expected, _ = tiny(ids)
        got = megatron_worker.forward_logits(megatron_worker.model, ids)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    ours, mask = megatron_worker.token_logprobs(megatron_worker.model, rows, grad=False)
    theirs, their_mask = sampling.token_logprobs(
        tiny, rows, pad_id=BUILD.pad_id, temperature=OPTIM.temperature, device=torch.device("cpu")
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert torch.equal(mask, their_mask)
    weights = megatron_worker.weights()
    assert weights.keys() == tiny.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in tiny.state_dict().items())


def test_one_step_matches_the_torch_worker(megatron_worker: Any) -> None:
    rows = _training_rows()
    expected_metrics, expected_weights = _torch_step(rows)
    pairs = [(r.prompt_ids, r.response_ids) for r in rows]
    ref = megatron_worker.reference_logprobs(pairs)
    for ours, theirs in zip(ref, [r.reference_logprobs for r in rows], strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)
    megatron_worker.train_chunk(rows[:5])
    megatron_worker.train_chunk(rows[5:])
    metrics = megatron_worker.finish_step()
    assert metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert metrics["grad_norm"] > OPTIM.max_grad_norm  # the clip path ran
    weights = megatron_worker.weights()
    for key, value in expected_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_round_trips_and_a_changed_layout_names_the_file_and_field(
    megatron_worker: Any, tmp_path: Path
) -> None:
    rows = _training_rows()
    megatron_worker.train_chunk(rows)
    megatron_worker.finish_step()
    megatron_worker.save(str(tmp_path))
    shard = tmp_path / "policy-tp0.pt"
    assert [p.name for p in tmp_path.iterdir()] == [shard.name]
    saved = torch.load(shard, weights_only=True)
    before = megatron_worker.weights()
    megatron_worker.train_chunk(rows)
    megatron_worker.finish_step()
    megatron_worker.load(str(tmp_path))
    after = megatron_worker.weights()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert megatron_worker.steps_taken == 1
    torch.save({**saved, "tensor_parallel": (0, 2)}, shard)  # written by a TP=2 job
    with pytest.raises(ValueError, match=r"policy-tp0\.pt .*tensorParallelSize"):
        megatron_worker.load(str(tmp_path))
    shard.unlink()  # e.g. a TP rank the writing job did not have
    with pytest.raises(FileNotFoundError, match=r"has no policy-tp0\.pt: .*tensorParallelSize"):
        megatron_worker.load(str(tmp_path))


@pytest.mark.parametrize(
    ("field", "layout"),
    [
        ("pipelineParallelSize", {"pipeline_parallel_size": 2}),
        ("contextParallelSize", {"context_parallel_size": 2}),
        ("tensorParallelSize", {"tensor_parallel_size": 3}),
    ],
)
def test_unsupported_layouts_name_their_field(field: str, layout: dict[str, int]) -> None:
    from asyncgrpo_trainer.backends.megatron_policy import MegatronLayout  # noqa: PLC0415

    with pytest.raises(ValueError, match=f"spec.trainer.policy.megatron.{field}"):
        MegatronLayout(**layout).check(BUILD, world_size=6)


# --- two processes -------------------------------------------------------------------------------------


def _rank_main(rank: int, world: int, tp: int, address: str, out: str) -> None:
    """One rank of a two-process run: log-probs, one step, weights; rank 0 writes them to `out`."""
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    layout = megatron_policy.MegatronLayout(tensor_parallel_size=tp)
    worker = megatron_policy.MegatronPolicyWorker(
        BUILD, OPTIM, LOSS, rank=rank, world_size=world, device="cpu", rendezvous=address, layout=layout
    )
    rows = _training_rows()
    dp_rank, dp_size = rank // tp, world // tp
    mine = rows[dp_rank::dp_size]
    logprobs = worker.reference_logprobs([(r.prompt_ids, r.response_ids) for r in mine])
    worker.train_chunk(mine)
    metrics = worker.finish_step()
    weights = worker.weights()
    worker.shutdown()
    if rank == 0:
        torch.save({"logprobs": logprobs, "metrics": metrics, "weights": weights}, out)


def _free_address() -> str:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "dp2"])
def test_two_processes_match_one(tp: int, tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    out, address = tmp_path / "rank0.pt", _free_address()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "trainer")])}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, json.dumps([rank, 2, tp, address, str(out)])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = torch.load(out)
    rows = _training_rows()
    expected_metrics, expected_weights = _torch_step(rows)
    expected_ref = [r.reference_logprobs for r in (rows if tp == 2 else rows[0::2])]
    for ours, theirs in zip(got["logprobs"], expected_ref, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)
    for key, value in expected_metrics.items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert got["weights"].keys() == expected_weights.keys()
    for key, value in expected_weights.items():
        torch.testing.assert_close(got["weights"][key], value, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    _rank_main(*json.loads(sys.argv[1]))


@pytest.mark.trainer
def test_the_ray_group_runs_tensor_parallel_ranks_like_the_torch_worker(
    ray_address: str, tmp_path: Path
) -> None:
    """Two CPU actors as one TP=2 replica: the group hands both the same rows, returns log-probs
    once, gathers CausalLM weights from both, broadcasts them to an engine, and each TP rank
    writes and reads its own checkpoint file."""
    pytest.importorskip("megatron.core")
    import ray  # noqa: PLC0415

    from asyncgrpo_trainer import cluster, megatron_workers, workers  # noqa: PLC0415
    from asyncgrpo_trainer import weights as weight_sync  # noqa: PLC0415

    pools = cluster.build_pools(
        policy_ranks=2, policy_gpus=0, generation_ranks=1, generation_gpus=0, colocated=False, name="mg-test"
    )
    group, ready = megatron_workers.start_megatron_policy_group(
        pools[0], BUILD, OPTIM, LOSS, 0, tensor_parallel_size=2
    )
    engines, engines_ready = workers.start_generation_group(pools[1], BUILD, 0)
    try:
        ray.get(ready + engines_ready)
        assert group.world_size == 1
        rows = _training_rows()
        expected_metrics, expected_weights = _torch_step(rows)
        ref = asyncio.run(group.reference_logprobs([(r.prompt_ids, r.response_ids) for r in rows]))
        assert len(ref) == len(rows)
        for ours, theirs in zip(ref, [r.reference_logprobs for r in rows], strict=True):
            assert ours == pytest.approx(theirs, abs=1e-5)
        asyncio.run(group.save(str(tmp_path)))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["policy-tp0.pt", "policy-tp1.pt"]
        asyncio.run(group.train_chunk(rows[:5]))
        asyncio.run(group.train_chunk(rows[5:]))
        metrics = asyncio.run(group.finish_step())
        assert metrics["grad_norm"] == pytest.approx(expected_metrics["grad_norm"], rel=1e-4)
        weights = ray.get(group.weights_ref())
        for key, value in expected_weights.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5)
        # The broadcast refit (gloo here, NCCL on GPUs): both TP ranks gather, rank 0 sends.
        sync = weight_sync.BroadcastSynchronizer(group, engines, bucket_bytes=4096, timeout_seconds=120)
        asyncio.run(sync.sync(1))
        engine = ray.get(engines.actors[0].__ray_call__.remote(lambda self: self.model.state_dict()))
        assert engine.keys() == weights.keys()
        assert all(torch.equal(engine[k], weights[k]) for k in weights)
        asyncio.run(group.load(str(tmp_path)))
        initial = BUILD.instantiate().state_dict()
        restored = ray.get(group.weights_ref())
        assert all(torch.equal(restored[k], initial[k]) for k in initial)
    finally:
        ray.get([a.shutdown.remote() for a in group.actors])
        workers.kill(group, engines)
        cluster.release(*pools)
