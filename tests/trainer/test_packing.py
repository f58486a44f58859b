"""Packed micro-batches (policy.maxTokensPerMicroBatch): the plan checked by hand, a packed step's
loss and gradients equal to the padded step's for every loss variant on the tiny model and on a tiny
Qwen2 checkpoint made here (nothing downloaded), and a packed job that learns the reversal task
through `asyncgrpo run` as far as its plain counterpart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
import torch
import yaml

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import packing, policy
from asyncgrpo_trainer.backends.cuda_train import Recipe, ResponseLogprobs, filler_rows
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.network import CausalLM
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

# --- the plan -------------------------------------------------------------------------------------


def test_ranks_get_equal_tokens_where_equal_row_counts_would_not_and_keep_arrival_order() -> None:
    lengths = [100, *[10] * 10]  # consecutive halves: 150 tokens against 50
    shards = packing.balanced_shards(lengths, 2)
    assert sorted(i for s in shards for i in s) == list(range(11))
    assert [sum(lengths[i] for i in s) for s in shards] == [100, 100]
    assert all(s == sorted(s) for s in shards)


def test_micro_batches_stay_within_the_token_budget_and_hold_every_row_once() -> None:
    lengths = [7, 3, 9, 1, 5, 5, 2, 8]
    batches = packing.token_budget_batches(lengths, 10)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert all(sum(lengths[i] for i in b) <= 10 for b in batches)
    assert len(batches) == 4  # 40 tokens in 4 full micro-batches: no wasted room


def test_a_row_longer_than_the_budget_is_refused_naming_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"maxTokensPerMicroBatch = 8 is below a row of 9 tokens") as err:
        packing.token_budget_batches([3, 9, 2], 8)
    assert "spec.trainer.policy." in str(err.value) and "maxPromptLength + generation.maxNewTokens" in str(
        err.value
    )


def test_without_a_budget_micro_batches_are_consecutive_runs_of_rows() -> None:
    assert packing.micro_batches([5] * 7, rows_per_batch=3, token_budget=None) == [[0, 1, 2], [3, 4, 5], [6]]


# --- packed equals padded ---------------------------------------------------------------------------

TOK = CharTokenizer("0123456789+=")
LOSSES = {
    "token-mean": losses.LossConfig(),
    "sequence-mean": losses.LossConfig(token_level_loss=False),
    "dr-grpo": losses.LossConfig(constant_normalizer=16),
    "gspo": losses.LossConfig(sequence_level_importance_ratios=True, token_level_loss=False),
    "kl-k3": losses.LossConfig(reference_policy_kl_penalty=0.1),
}
BUDGET = 40
"""Tokens per packed micro-batch: the rows below (10-27 tokens) take 7 of them."""


def _tiny(position_embedding: Literal["rope", "learned"]) -> recipe.ModelBuild:
    return recipe.tiny_build(
        TOK,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=None,
        max_sequence_length=64,
        position_embedding=position_embedding,
        dtype="float32",
        seed=3,
    )


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, recipe.ModelBuild]:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("qwen2") / "qwen2", family="qwen2", seed=0)
    qwen2, _ = recipe.pretrained_build(
        str(path), max_sequence_length=64, dtype="float32", seed=0, chat_template=None, system_prompt=None
    )
    return {"tiny-rope": _tiny("rope"), "tiny-learned": _tiny("learned"), "qwen2": qwen2}


def _rows(vocab: int) -> list[policy.TrainRow]:
    """Rows of varied prompt and response lengths, with reference log-probs for the KL variant."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, (p, r) in enumerate([(4, 6), (9, 1), (3, 16), (11, 12), (5, 5), (7, 20), (2, 8), (6, 3), (8, 14)]):
        ids = torch.randint(3, vocab, (p + r,), generator=g).tolist()
        rows.append(
            policy.TrainRow(
                ids[:p],
                ids[p:],
                (-torch.rand(r, generator=g) * 3).tolist(),
                advantage=float(torch.randn(1, generator=g)) + (i % 3) - 1,
                reference_logprobs=(-torch.rand(r, generator=g) * 3).tolist(),
            )
        )
    return rows


def _loss_and_gradients(
    model: CausalLM,
    rows: list[policy.TrainRow],
    cfg: losses.LossConfig,
    logprobs: ResponseLogprobs,
    batches: list[list[int]],
) -> tuple[float, dict[str, torch.Tensor]]:
    """The step's loss and gradient from `rows` fed as `batches`, normalized once, as the worker does."""
    model.zero_grad(set_to_none=True)
    step = policy.StepAccumulator(cfg, torch.device("cpu"))
    for batch in batches:
        part = [rows[i] for i in batch]
        logp, mask = logprobs(model, [(r.prompt_ids, r.response_ids) for r in part], torch.device("cpu"))
        step.backward(part, logp, mask)
    params = dict(model.named_parameters())
    totals = step.reduce(list(params.values()), None)
    grads = {name: p.grad.clone() for name, p in params.items() if p.grad is not None}
    return totals.sums["loss_sum"] / totals.count, grads


@pytest.mark.parametrize("variant", list(LOSSES))
@pytest.mark.parametrize("model_name", ["tiny-rope", "tiny-learned", "qwen2"])
def test_packed_micro_batches_give_the_loss_and_gradients_of_one_padded_batch(
    builds: dict[str, recipe.ModelBuild], model_name: str, variant: str
) -> None:
    build = builds[model_name]
    model = build.instantiate().train()
    rows = _rows(min(build.config.vocab_size, 300))
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    padded = ResponseLogprobs(Recipe(), pad_id=build.pad_id, temperature=0.7)
    packed = ResponseLogprobs(Recipe(), pad_id=build.pad_id, temperature=0.7, token_budget=BUDGET)
    batches = packing.token_budget_batches(lengths, BUDGET)
    assert len(batches) > 1
    want_loss, want = _loss_and_gradients(model, rows, LOSSES[variant], padded, [list(range(len(rows)))])
    got_loss, got = _loss_and_gradients(model, rows, LOSSES[variant], packed, batches)
    assert got_loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name


def test_a_compiled_packed_micro_batch_far_under_a_budget_longer_than_the_model_scores_its_rows() -> None:
    """The compiled recipe fills a micro-batch to its budget with pad rows (one static shape). Here
    the rows take 131 of 256 tokens, and the 125 left are more than the model's 64 positions: one
    pad row of them all was refused as too long (an H100 run at 1.5B's shape, budget 8192)."""
    build = _tiny("rope")
    model = build.instantiate().eval()
    rows = [(r.prompt_ids, r.response_ids) for r in _rows(TOK.vocab_size)]
    assert sum(len(p) + len(r) - 1 for p, r in rows) == 131
    compiled = ResponseLogprobs(Recipe(compile=True), pad_id=build.pad_id, temperature=0.7, token_budget=256)
    eager = ResponseLogprobs(Recipe(), pad_id=build.pad_id, temperature=0.7)
    with torch.no_grad():
        got, got_mask = compiled(model, rows, torch.device("cpu"))
        want, want_mask = eager(model, rows, torch.device("cpu"))
    assert torch.equal(got_mask, want_mask)
    assert torch.allclose(got, want, atol=1e-5)


def test_pad_rows_fill_a_budget_in_pieces_no_longer_than_the_models_positions() -> None:
    assert filler_rows(125, 64) == [64, 61]
    assert filler_rows(128, 64) == [64, 64]
    assert filler_rows(5, 64) == [5]


def test_a_packed_worker_step_reports_the_loss_and_gradient_norm_of_the_padded_one(
    builds: dict[str, recipe.ModelBuild],
) -> None:
    """Through the worker: streamed chunks, PPO mini-batches (pi_old from a packed log-prob pass)."""
    build = builds["qwen2"]
    rows = _rows(300)  # their reference log-probs are unused: the KL penalty is off

    def step(budget: int | None) -> dict[str, float | None]:
        optim = policy.OptimConfig(
            learning_rate=1e-3,
            weight_decay=0.0,
            max_grad_norm=None,
            warmup_steps=0,
            micro_batch_size=3,
            logprob_batch_size=2,
            temperature=1.0,
            minibatches=2,
            max_tokens_per_micro_batch=budget,
        )
        worker = policy.TorchPolicyWorker(
            build, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu"
        )
        worker.train_chunk(rows[:4])
        worker.train_chunk(rows[4:])
        return worker.finish_step()

    plain, packed = step(None), step(BUDGET)
    for key in ("loss", "grad_norm", "train_tokens", "clip_fraction"):
        assert packed[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-7), key


# --- a packed job learns ----------------------------------------------------------------------------

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "async-exact.yaml"
STEPS = 100
"""The example's job learns reversal to 1.0 held out from step 80-110 (docs/benchmarks.md)."""


def _held_out_accuracy(tmp_path: Path, name: str, policy_spec: dict[str, int]) -> float:
    """`asyncgrpo run` of the example with `policy_spec` merged in: its last held-out accuracy."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["trainer"]["policy"].update(policy_spec)
    manifest, lines = tmp_path / f"{name}.yaml", tmp_path / f"{name}.jsonl"
    manifest.write_text(yaml.safe_dump(job))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        str(Path(sys.executable).parent / "asyncgrpo"),
        "run",
        str(manifest),
        "--max-steps",
        str(STEPS),
    ]
    out = subprocess.run(
        [*command, "--jsonl", str(lines)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    return float([r for r in records if r.get("validation_accuracy") is not None][-1]["validation_accuracy"])


@pytest.mark.trainer
@pytest.mark.budget(300, "a packed job trained to the bar its padded counterpart reaches")
def test_a_packed_job_learns_reversal_to_the_padded_jobs_bar(tmp_path: Path) -> None:
    """The example's job, packed at 512 tokens a micro-batch, learns reversal to the bar the padded
    job reaches (0.8 held out by step 100; 1.0 from step 80-110, docs/benchmarks.md). That a packed
    step is the padded step (loss, gradient norm, tokens and clip fraction to 1e-4, through the
    worker) is the test above; that the field reaches the worker, tests/trainer/test_no_inert_fields.py.
    Until 2026-12-07 the padded job ran here too, side by side (155 s for both)."""
    packed = _held_out_accuracy(tmp_path, "packed", {"maxTokensPerMicroBatch": 512})
    assert packed >= 0.8, packed
