"""The Megatron-core policy backend against transformers and the torch worker, on CPU (gloo).

Models: the tiny model with RoPE and with learned positions (its default), and tiny random
Hugging Face checkpoints of every supported family (`make_tiny_checkpoint`): Qwen2 (q/k/v
biases), Qwen3 (per-head q/k norms), Llama 3 (llama3-scaled rope), each tied and untied, plus a
Llama with o_proj and MLP biases and a Qwen2 with yarn rope (scaled frequencies and attention).

- the name/layout mapping Megatron <-> CausalLM is a lossless round trip for every part a model
  can have, and so is the tensor-parallel split of every parameter (pure torch);
- a TP=1 GPTModel of each checkpoint gives transformers' per-token log-probs (1e-4, fp32) and
  hands back the checkpoint's weights under the network's names;
- one training step (KL on, temperature != 1, several micro-batches) gives TorchPolicyWorker's
  loss, grad norm, metrics, reference log-probs and updated weights, for every model;
- a pretrained model's checkpoint holds a Hugging Face directory, and `asyncgrpo export` of the
  Megatron shards writes one; transformers loads both and gives the policy's log-probs;
- two gloo processes, once as TP=2 over every model (the tiny model's odd vocabulary padded and
  sharded, Qwen3's q/k norm gradients summed over the ranks, one kv head shared by both ranks) and
  once as DP=2, give the same log-probs, step metrics and updated weights as transformers and one
  torch process; the TP=2 checkpoints export to transformers with the policy's log-probs;
- a rank's checkpoint file round-trips (a shard of another TP layout, or a missing one, names the file
  and the field), and what this backend does not run is rejected with its field.

The two-process cases run this file as a script (one process per rank), so no forked process
inherits torch's threads. Checkpoints are made once per module (`checkpoints`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import checkpoint, export
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import megatron_mapping as mapping
from asyncgrpo_trainer.backends import policy, sampling
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.network import CausalLM
from tests.trainer.test_grpo_math import BUILD, TOK

ROOT = Path(__file__).resolve().parents[2]
OPTIM = policy.OptimConfig(
    learning_rate=1e-3,
    weight_decay=0.01,
    max_grad_norm=0.02,
    warmup_steps=0,
    micro_batch_size=3,
    logprob_batch_size=4,
    temperature=0.7,
)
LOSS = losses.LossConfig(reference_policy_kl_penalty=0.05)
ROWS = 8
PARITY = 1e-4
"""Log-probs against transformers' in fp32 (the issue's bound)."""

LEARNED = recipe.tiny_build(
    TOK,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=None,
    max_sequence_length=24,
    position_embedding="learned",
    dtype="float32",
    seed=3,
)
TINY = {"tiny-rope": BUILD, "tiny-learned": LEARNED}

CHECKPOINTS: dict[str, dict[str, Any]] = {
    "qwen2": {"family": "qwen2", "tie_word_embeddings": False},
    "qwen2-tied": {"family": "qwen2"},
    "qwen3": {"family": "qwen3", "tie_word_embeddings": False, "num_kv_heads": 2},
    "qwen3-tied": {"family": "qwen3"},
    "llama": {"family": "llama", "tie_word_embeddings": False},
    "llama-tied": {"family": "llama"},
}
"""make_tiny_checkpoint arguments (2 heads; one kv head unless said, so at TP=2 both ranks share it)."""
EDITED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "rope_theta": 1_000_000.0,
            }
        },
    ),
}
"""A checkpoint above with config.json changed (tensors the change adds are random)."""
PRETRAINED = [*CHECKPOINTS, *EDITED]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every pretrained case's checkpoint directory, made once for the module."""
    from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint  # noqa: PLC0415

    root = tmp_path_factory.mktemp("checkpoints")
    made = {name: make_tiny_checkpoint(root / name, **kwargs) for name, kwargs in CHECKPOINTS.items()}
    for name, (base, changes) in EDITED.items():
        made[name] = _edited(made[base], root / name, changes)
    return made


def _edited(source: Path, out: Path, changes: dict[str, Any]) -> Path:
    """A copy of `source` with `changes` in config.json; every bias random (std 0.02), so a bias
    path that the Megatron model dropped would show."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **changes}))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(std=0.02)
    model.save_pretrained(out)
    return out


def _pretrained(directory: Path) -> recipe.ModelBuild:
    build, _ = recipe.pretrained_build(
        str(directory),
        max_sequence_length=32,
        dtype="float32",
        seed=0,
        chat_template=None,
        system_prompt=None,
    )
    return build


def _build(name: str, checkpoints: dict[str, Path]) -> recipe.ModelBuild:
    return TINY[name] if name in TINY else _pretrained(checkpoints[name])


def _rows(build: recipe.ModelBuild) -> list[policy.TrainRow]:
    """ROWS rows of random ids over the whole vocabulary, prompts 2-5 and responses 1-4 tokens."""
    g = torch.Generator().manual_seed(0)
    vocab = build.config.vocab_size
    rows = []
    for i in range(ROWS):
        prompt = torch.randint(0, vocab, (2 + i % 4,), generator=g).tolist()
        length = 1 + (i * 3) % 4
        resp = torch.randint(0, vocab, (length,), generator=g).tolist()
        gen = (-torch.rand(length, generator=g) * 3).tolist()
        rows.append(policy.TrainRow(prompt, resp, gen, float(torch.randn(1, generator=g))))
    return rows


def _pairs(rows: list[policy.TrainRow]) -> list[tuple[list[int], list[int]]]:
    return [(r.prompt_ids, r.response_ids) for r in rows]


def _training_rows(build: recipe.ModelBuild) -> list[policy.TrainRow]:
    """Rows with reference log-probs (the KL term is on), from the torch reference model."""
    rows = _rows(build)
    ref = _torch_worker(build).reference_logprobs(_pairs(rows))
    return [
        policy.TrainRow(r.prompt_ids, r.response_ids, r.generation_logprobs, r.advantage, lp)
        for r, lp in zip(rows, ref, strict=True)
    ]


def _torch_worker(build: recipe.ModelBuild) -> policy.TorchPolicyWorker:
    return policy.TorchPolicyWorker(build, OPTIM, LOSS, rank=0, world_size=1, device="cpu")


def _torch_step(
    build: recipe.ModelBuild, rows: list[policy.TrainRow]
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    worker = _torch_worker(build)
    worker.train_chunk(rows[:5])
    worker.train_chunk(rows[5:])
    return worker.finish_step(), worker.weights()


def _transformers_logprobs(directory: Path, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """log softmax(logits / temperature) of each response token, from transformers' own model."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, response in pairs:
            logits = model(torch.tensor([prompt + response])).logits[0].float() / OPTIM.temperature
            logp = logits.log_softmax(-1)
            out.append([float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(response)])
    return out


def _assert_logprobs(ours: list[list[float]], theirs: list[list[float]], abs_tol: float = PARITY) -> None:
    assert [len(x) for x in ours] == [len(x) for x in theirs]
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine == pytest.approx(expected, abs=abs_tol)


def _assert_step(
    metrics: dict[str, float],
    weights: dict[str, torch.Tensor],
    expected_metrics: dict[str, float],
    expected_weights: dict[str, torch.Tensor],
    initial: dict[str, torch.Tensor],
) -> None:
    """The step's metrics (the loss, the global gradient norm, ...) to 1e-4, and its updated weights.

    AdamW's first update is lr * g / (|g| + 1e-8) (plus the weight decay): lr times the sign of
    the gradient wherever |g| >> 1e-8, which must agree to 1e-5. Where a gradient is itself near
    1e-8 (a k_proj bias has none in exact arithmetic: softmax ignores it) the fraction of lr is
    decided by float summation order, which differs between the two models; those weights (and
    the ones without a gradient, which only decay) are only bounded by the step."""
    assert metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert metrics["grad_norm"] > OPTIM.max_grad_norm  # the clip path ran
    assert weights.keys() == expected_weights.keys()
    lr = OPTIM.learning_rate
    for key, value in expected_weights.items():
        adam = value - initial[key] * (1 - lr * OPTIM.weight_decay)
        settled = adam.abs() > lr / 2
        torch.testing.assert_close(weights[key][settled], value[settled], rtol=1e-4, atol=1e-5, msg=key)
        assert (weights[key] - value).abs().max() <= 2 * lr, key


def _logprob_lists(worker: Any, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """The policy model's (not the reference's) log-probs of each response, as lists."""
    with torch.no_grad():
        lp, _ = worker.token_logprobs(worker.model, pairs, grad=False)
    return [lp[i, : len(r)].tolist() for i, (_, r) in enumerate(pairs)]


# --- the mapping (no megatron-core needed) ----------------------------------------------------------


MAPPED_PARTS = {
    "tiny": {},
    "learned positions": {"position_embedding": "learned", "rope_inv_freq": ()},
    "tied, q/k norms, no q/k/v bias": {"tie_word_embeddings": True, "qk_norm": True, "qkv_bias": False},
    "o_proj and MLP biases": {"o_bias": True, "mlp_bias": True},
}


@pytest.mark.parametrize("parts", MAPPED_PARTS.values(), ids=MAPPED_PARTS.keys())
def test_mapping_round_trips_every_part_of_the_network(parts: dict[str, Any]) -> None:
    cfg = dataclasses.replace(BUILD.config, **parts)
    torch.manual_seed(0)
    model = CausalLM(cfg)
    for p in model.parameters():  # random norms and biases too, so no two tensors coincide
        torch.nn.init.normal_(p)
    state = model.state_dict()
    padded = mapping.padded_vocab_size(cfg.vocab_size, 4)
    full = mapping.from_network(state, cfg, padded_vocab=padded)
    assert full["embedding.word_embeddings.weight"].shape[0] == padded == 16
    assert ("output_layer.weight" in full) is not cfg.tie_word_embeddings
    back = mapping.to_network(full, cfg)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    for name, tensor in full.items():
        shards = [mapping.shard(name, tensor, rank=r, size=2) for r in range(2)]
        assert torch.equal(mapping.unshard(name, shards), tensor), name


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


def test_tensor_parallel_shards_keep_gate_and_up_apart() -> None:
    cfg = dataclasses.replace(BUILD.config, o_bias=True, mlp_bias=True)
    full = mapping.from_network(CausalLM(cfg).state_dict(), cfg, padded_vocab=16)
    inter = cfg.intermediate_size
    for kind in ("weight", "bias"):
        name = f"decoder.layers.0.mlp.linear_fc1.{kind}"
        fc1 = full[name]
        piece = mapping.shard(name, fc1, rank=1, size=2)
        assert torch.equal(piece[: inter // 2], fc1[inter // 2 : inter])  # rank 1's half of gate
        assert torch.equal(piece[inter // 2 :], fc1[inter + inter // 2 :])  # and of up
    assert not mapping.is_split("decoder.layers.0.self_attention.linear_proj.bias")  # added after the reduce


# --- the backend on CPU, one process -------------------------------------------------------------------


@pytest.fixture
def megatron() -> Iterator[Callable[[recipe.ModelBuild], Any]]:
    """Makes one-process TP=1 MegatronPolicyWorkers (Megatron's parallel state is per process, so
    one at a time) and shuts the last one down."""
    pytest.importorskip("megatron.core")
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    made: list[Any] = []

    def make(build: recipe.ModelBuild) -> Any:
        if made:
            made.pop().shutdown()
        made.append(
            megatron_policy.MegatronPolicyWorker(build, OPTIM, LOSS, rank=0, world_size=1, device="cpu")
        )
        return made[-1]

    yield make
    if made:
        made.pop().shutdown()


@pytest.mark.parametrize("name", PRETRAINED)
def test_each_family_gives_transformers_logprobs_and_its_own_weights_back(
    name: str, checkpoints: dict[str, Path], megatron: Callable[[recipe.ModelBuild], Any]
) -> None:
    build = _pretrained(checkpoints[name])
    worker = megatron(build)
    pairs = _pairs(_rows(build))
    _assert_logprobs(_logprob_lists(worker, pairs), _transformers_logprobs(checkpoints[name], pairs))
    expected = build.instantiate().state_dict()  # the checkpoint, under the network's names
    weights = worker.weights()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], v) for k, v in expected.items())
    if build.config.tie_word_embeddings:
        assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]


def test_the_tiny_model_gives_the_networks_logits(megatron: Callable[[recipe.ModelBuild], Any]) -> None:
    for build in (BUILD, LEARNED):
        worker = megatron(build)
        ids = torch.tensor([p + r for p, r in _pairs(_rows(build))[:1]])
        with torch.no_grad():
            expected, _ = build.instantiate()(ids)
            got = worker.forward_logits(worker.model, ids)
        torch.testing.assert_close(got[..., : build.config.vocab_size], expected, rtol=1e-5, atol=1e-5)


def test_a_bfloat16_model_runs_in_bfloat16_with_the_networks_logprobs(
    checkpoints: dict[str, Path], megatron: Callable[[recipe.ModelBuild], Any]
) -> None:
    """The whole GPTModel in the recipe's dtype (norms included, as the engines hold it)."""
    build = dataclasses.replace(_pretrained(checkpoints["qwen3-tied"]), dtype="bfloat16")
    worker = megatron(build)
    assert {p.dtype for p in worker.model.parameters()} == {torch.bfloat16}
    network = build.instantiate()
    weights = worker.weights()
    assert all(torch.equal(weights[k], v) for k, v in network.state_dict().items())
    pairs = _pairs(_rows(build))
    theirs, _ = sampling.token_logprobs(
        network, pairs, pad_id=build.pad_id, temperature=OPTIM.temperature, device=torch.device("cpu")
    )
    expected = [theirs[i, : len(r)].tolist() for i, (_, r) in enumerate(pairs)]
    _assert_logprobs(_logprob_lists(worker, pairs), expected, 2e-2)  # bf16: 8 bits of mantissa


@pytest.mark.parametrize("name", [*TINY, *PRETRAINED])
def test_one_step_matches_the_torch_worker(
    name: str, checkpoints: dict[str, Path], megatron: Callable[[recipe.ModelBuild], Any]
) -> None:
    build = _build(name, checkpoints)
    rows = _training_rows(build)
    expected_metrics, expected_weights = _torch_step(build, rows)
    worker = megatron(build)
    _assert_logprobs(
        worker.reference_logprobs(_pairs(rows)), [r.reference_logprobs or [] for r in rows], 1e-5
    )
    worker.train_chunk(rows[:5])
    worker.train_chunk(rows[5:])
    _assert_step(
        worker.finish_step(),
        worker.weights(),
        expected_metrics,
        expected_weights,
        build.instantiate().state_dict(),
    )


@pytest.mark.parametrize("name", ["qwen3-tied", "llama-biases"])
def test_a_pretrained_checkpoint_holds_a_transformers_directory_and_exports_one(
    name: str, checkpoints: dict[str, Path], megatron: Callable[[recipe.ModelBuild], Any], tmp_path: Path
) -> None:
    build = _pretrained(checkpoints[name])
    worker = megatron(build)
    rows = _training_rows(build)
    worker.train_chunk(rows)
    worker.finish_step()
    tmp = checkpoint.begin(tmp_path / "ckpt", 1)
    assert worker.save(str(tmp)) == {}
    step = checkpoint.commit(tmp, 1, {}, keep_last=1, meta={"model": build.to_json()})
    assert sorted(p.name for p in step.iterdir()) == ["hf", "meta.json", "policy-tp0.pt", "state.pt"]
    pairs = _pairs(rows)
    trained = _logprob_lists(worker, pairs)
    _assert_logprobs(_transformers_logprobs(step / checkpoint.HF_DIR, pairs), trained)
    out = export.export(step.parent, tmp_path / "exported")
    _assert_logprobs(_transformers_logprobs(out, pairs), trained)


def test_a_checkpoint_round_trips_and_a_changed_layout_names_the_file_and_field(
    megatron: Callable[[recipe.ModelBuild], Any], tmp_path: Path
) -> None:
    worker = megatron(BUILD)
    rows = _training_rows(BUILD)
    worker.train_chunk(rows)
    worker.finish_step()
    worker.save(str(tmp_path))
    shard = tmp_path / "policy-tp0.pt"
    assert [p.name for p in tmp_path.iterdir()] == [shard.name]  # the tiny model has no hf/
    saved = torch.load(shard, weights_only=True)
    before = worker.weights()
    worker.train_chunk(rows)
    worker.finish_step()
    worker.load(str(tmp_path))
    after = worker.weights()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert worker.steps_taken == 1
    torch.save({**saved, "tensor_parallel": (0, 2)}, shard)  # written by a TP=2 job
    with pytest.raises(ValueError, match=r"policy-tp0\.pt .*tensorParallelSize"):
        worker.load(str(tmp_path))
    shard.unlink()  # e.g. a TP rank the writing job did not have
    with pytest.raises(FileNotFoundError, match=r"has no policy-tp0\.pt: .*tensorParallelSize"):
        worker.load(str(tmp_path))


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


def test_what_only_the_checkpoint_shows_is_an_invalid_model_naming_the_backend() -> None:
    """An o_proj bias without an MLP bias (or the reverse) is one switch in Megatron; a checkpoint's
    heads that the TP size does not split evenly. Both together or neither bias runs."""
    from asyncgrpo_trainer.backends.megatron_policy import MegatronLayout  # noqa: PLC0415

    def with_config(**changes: Any) -> recipe.ModelBuild:
        return dataclasses.replace(
            BUILD, config=dataclasses.replace(BUILD.config, **changes), checkpoint="/ckpt"
        )

    for o_bias, mlp_bias in ((True, False), (False, True)):
        with pytest.raises(InvalidModelError, match=r"spec.trainer.policy.backend megatron .*attention_bias"):
            MegatronLayout().check(with_config(o_bias=o_bias, mlp_bias=mlp_bias), world_size=1)
    MegatronLayout().check(with_config(o_bias=True, mlp_bias=True), world_size=1)
    with pytest.raises(
        InvalidModelError, match=r"spec.trainer.policy.megatron.tensorParallelSize 4 .*4 attention"
    ):
        MegatronLayout(tensor_parallel_size=4).check(with_config(num_kv_heads=3), world_size=4)


# --- two processes -------------------------------------------------------------------------------------


def _rank_main(rank: int, tp: int, address: str, out: str, cases: list[list[str | None]]) -> None:
    """One rank of a two-process run, for each case (name, checkpoint dir, checkpoint step dir to
    write into): reference log-probs, one step, weights, the trained log-probs and a checkpoint;
    rank 0 writes the results to `out`."""
    from asyncgrpo_trainer.backends import megatron_policy  # noqa: PLC0415

    layout = megatron_policy.MegatronLayout(tensor_parallel_size=tp)
    results = {}
    worker = None
    for name, directory, save_to in cases:
        assert name is not None
        if worker is not None:  # the next model on the same process group
            worker.core.parallel_state.destroy_model_parallel()
        build = TINY[name] if directory is None else _pretrained(Path(directory))
        worker = megatron_policy.MegatronPolicyWorker(
            build, OPTIM, LOSS, rank=rank, world_size=2, device="cpu", rendezvous=address, layout=layout
        )
        rows = _training_rows(build)
        dp_rank, dp_size = rank // tp, 2 // tp
        mine = rows[dp_rank::dp_size]
        logprobs = worker.reference_logprobs(_pairs(mine))
        worker.train_chunk(mine)
        metrics = worker.finish_step()
        weights = worker.weights()
        trained = _logprob_lists(worker, _pairs(mine))
        if save_to is not None:
            worker.save(save_to)
        results[name] = {"logprobs": logprobs, "metrics": metrics, "weights": weights, "trained": trained}
    assert worker is not None
    worker.shutdown()
    if rank == 0:
        torch.save(results, out)


def _free_address() -> str:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _run_ranks(tp: int, out: Path, cases: list[list[str | None]]) -> dict[str, Any]:
    address = _free_address()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "trainer")])}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, json.dumps([rank, tp, address, str(out), cases])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    results: dict[str, Any] = torch.load(out)
    return results


@pytest.mark.slow
def test_tensor_parallel_ranks_match_transformers_and_one_torch_process(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("megatron.core")
    steps = {name: checkpoint.begin(tmp_path / name, 1) for name in PRETRAINED}
    cases: list[list[str | None]] = [[name, None, None] for name in TINY]
    cases += [[name, str(checkpoints[name]), str(steps[name])] for name in PRETRAINED]
    got = _run_ranks(2, tmp_path / "rank0.pt", cases)
    for name, _, _ in cases:
        assert name is not None
        build = _build(name, checkpoints)
        rows = _training_rows(build)
        pairs = _pairs(rows)
        if name in TINY:
            _assert_logprobs(got[name]["logprobs"], [r.reference_logprobs or [] for r in rows], 1e-5)
        else:
            _assert_logprobs(got[name]["logprobs"], _transformers_logprobs(checkpoints[name], pairs))
        _assert_step(
            got[name]["metrics"],
            got[name]["weights"],
            *_torch_step(build, rows),
            build.instantiate().state_dict(),
        )
        if name in TINY:
            continue
        # The TP=2 checkpoint: its hf/ (TP rank 0's) and an export of its two shards.
        step = checkpoint.commit(steps[name], 1, {}, keep_last=1, meta={"model": build.to_json()})
        assert sorted(p.name for p in step.iterdir()) == [
            "hf",
            "meta.json",
            "policy-tp0.pt",
            "policy-tp1.pt",
            "state.pt",
        ]
        _assert_logprobs(_transformers_logprobs(step / checkpoint.HF_DIR, pairs), got[name]["trained"])
        exported = export.export(step, tmp_path / f"{name}-exported")
        _assert_logprobs(_transformers_logprobs(exported, pairs), got[name]["trained"])


def test_data_parallel_ranks_match_one_process(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    got = _run_ranks(1, tmp_path / "rank0.pt", [["tiny-rope", None, None]])["tiny-rope"]
    rows = _training_rows(BUILD)
    _assert_logprobs(got["logprobs"], [r.reference_logprobs or [] for r in rows[0::2]], 1e-5)
    _assert_step(got["metrics"], got["weights"], *_torch_step(BUILD, rows), BUILD.instantiate().state_dict())


if __name__ == "__main__":
    _rank_main(*json.loads(sys.argv[1]))


@pytest.mark.trainer
def test_the_ray_group_runs_tensor_parallel_ranks_like_the_torch_worker(
    ray_address: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """Two CPU actors as one TP=2 replica of a pretrained Qwen3 (tied): the group hands both the
    same rows, returns log-probs once, gathers CausalLM weights from both, broadcasts them to an
    engine, and each TP rank writes and reads its own checkpoint file, TP rank 0 the hf/ directory."""
    pytest.importorskip("megatron.core")
    import ray  # noqa: PLC0415

    from asyncgrpo_trainer import cluster, megatron_workers, workers  # noqa: PLC0415
    from asyncgrpo_trainer import weights as weight_sync  # noqa: PLC0415

    build = _pretrained(checkpoints["qwen3-tied"])
    pools = cluster.build_pools(
        policy_ranks=2, policy_gpus=0, generation_ranks=1, generation_gpus=0, colocated=False, name="mg-test"
    )
    group, ready = megatron_workers.start_megatron_policy_group(
        pools[0], build, OPTIM, LOSS, 0, tensor_parallel_size=2
    )
    engines, engines_ready = workers.start_generation_group(pools[1], workers.EngineSpec(build, 0))
    try:
        ray.get(ready + engines_ready)
        assert group.world_size == 1
        rows = _training_rows(build)
        expected_metrics, expected_weights = _torch_step(build, rows)
        ref = asyncio.run(group.reference_logprobs(_pairs(rows)))
        _assert_logprobs(ref, [r.reference_logprobs or [] for r in rows], 1e-5)
        asyncio.run(group.save(str(tmp_path)))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "policy-tp0.pt", "policy-tp1.pt"]
        asyncio.run(group.train_chunk(rows[:5]))
        asyncio.run(group.train_chunk(rows[5:]))
        metrics = asyncio.run(group.finish_step())
        weights = ray.get(group.weights_ref())
        _assert_step(metrics, weights, expected_metrics, expected_weights, build.instantiate().state_dict())
        # The broadcast refit (gloo here, NCCL on GPUs): both TP ranks gather, rank 0 sends.
        sync = weight_sync.BroadcastSynchronizer(group, engines, bucket_bytes=4096, timeout_seconds=120)
        asyncio.run(sync.sync(1))
        engine = ray.get(engines.actors[0].__ray_call__.remote(lambda self: self.model.state_dict()))
        assert engine.keys() == weights.keys()
        assert all(torch.equal(engine[k], weights[k]) for k in weights)
        asyncio.run(group.load(str(tmp_path)))
        initial = build.instantiate().state_dict()
        restored = ray.get(group.weights_ref())
        assert all(torch.equal(restored[k], initial[k]) for k in initial)
    finally:
        ray.get([a.shutdown.remote() for a in group.actors])
        workers.kill(group, engines)
        cluster.release(*pools)
