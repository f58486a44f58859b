"""Multi-turn environments: the conversation rollout, its loss mask, and the log-probs of policy
tokens across turns, on the torch engine with tiny local models (`conversation`, `envs.multiturn`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_trainer import envs
from asyncgrpo_trainer.algorithms.losses import LossConfig
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.backends.policy import StepAccumulator, TrainRow
from asyncgrpo_trainer.conversation import Budget, converse
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.recipe import ModelBuild
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CharTokenizer, CheckpointTokenizer
from asyncgrpo_trainer.rollout import Conversations, RolloutManager
from tests.trainer.custom_envs import TURNS, EchoEnvironment

ENV = EchoEnvironment()
TOK = CharTokenizer(ENV.alphabet)
BUILD = ModelBuild(
    tiny_config(
        vocab_size=TOK.vocab_size,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        max_positions=256,
        position_embedding="rope",
    ),
    seed=3,
    dtype="float32",
    pad_id=TOK.pad_id,
    eos_ids=TOK.eos_ids,
)
PARAMS = sampling.SamplingParams(max_new_tokens=60, temperature=0.7)
BUDGET = Budget(max_turns=4, tokens_per_turn=60, max_new_tokens=200)


def _run(make: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(make)


def _engine(engine: generation.Engine = "per-group") -> generation.TorchGenerationWorker:
    worker = generation.TorchGenerationWorker(BUILD, device="cpu", engine=engine, collect_seconds=0.0)
    _run(worker.adopt_weights(0))
    return worker


class ScriptedEngine:
    """An engine that speaks given turns (token ids, each ending in EOS unless cut), one per call,
    and records the prompt of each call: to pin what the loop sends and does with the budgets."""

    def __init__(self, turns: list[list[int]], *, version: int = 0) -> None:
        self.turns, self.prompts, self.version = list(turns), [], version
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> generation.Generated:
        self.prompts.append(list(prompt_ids))
        turn = self.turns.pop(0)[: params.max_new_tokens]
        done = bool(turn) and turn[-1] == TOK.eos_id
        return generation.Generated(
            [turn], [[-0.5] * len(turn)], [done], [self.version], self.version, self.version, 0.0
        )


def _said(text: str) -> list[int]:
    return [*TOK.encode(text, add_bos=False), TOK.eos_id]


def test_a_conversation_alternates_policy_and_environment_turns_and_masks_the_environments_tokens() -> None:
    example = Example("12=", "12")
    engine = ScriptedEngine([_said("3"), _said("45"), _said("12")])
    conv = _run(
        converse(engine, tokenizer=TOK, env=ENV, example=example, params=PARAMS, budget=BUDGET, seed=1)
    )
    reply1, reply2 = TOK.encode(">1", add_bos=False), TOK.encode(">2", add_bos=False)
    assert conv.response_ids == [*_said("3"), *reply1, *_said("45"), *reply2, *_said("12")]
    assert conv.loss_mask == [1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    assert [lp for lp, m in zip(conv.logprobs, conv.loss_mask, strict=True) if not m] == [0.0] * 4
    assert conv.turns == ["3", "45", "12"] and conv.answer == "12" and conv.finished
    # Each turn's prompt is the prompt plus the conversation so far, as ids (never re-tokenized).
    prompt = TOK.encode_prompt("12=")
    assert engine.prompts == [prompt, prompt + conv.response_ids[:4], prompt + conv.response_ids[:9]]


def test_the_engines_logprobs_of_every_policy_token_equal_what_the_policy_recomputes_across_turns() -> None:
    worker = _engine()
    examples = ENV.builtin_examples(split="train", count=6, seed=0)

    async def scenario() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    converse(worker, tokenizer=TOK, env=ENV, example=e, params=PARAMS, budget=BUDGET, seed=i)
                    for i, e in enumerate(examples)
                )
            )
        )

    convs = _run(scenario())
    assert max(len(c.turns) for c in convs) >= 2, "no conversation got past its first turn"
    rows = [(TOK.encode_prompt(e.prompt), c.response_ids) for e, c in zip(examples, convs, strict=True)]
    ref, _ = sampling.token_logprobs(
        worker._forward, rows, pad_id=0, temperature=0.7, device=torch.device("cpu")
    )
    for i, c in enumerate(convs):
        policy = [j for j, m in enumerate(c.loss_mask) if m]
        assert [c.logprobs[j] for j in policy] == pytest.approx([float(ref[i, j]) for j in policy], abs=1e-4)
        # The environment's tokens are exactly its replies, encoded per turn.
        env_tokens = [t for t, m in zip(c.response_ids, c.loss_mask, strict=True) if not m]
        replies = [TOK.encode(f">{k}", add_bos=False) for k in range(1, len(c.turns))]
        assert env_tokens == [t for r in replies[: len(env_tokens) // 2] for t in r]


def test_a_turn_cut_by_its_token_budget_ends_the_conversation_unfinished() -> None:
    engine = ScriptedEngine([_said("1234")])
    budget = Budget(max_turns=4, tokens_per_turn=3, max_new_tokens=200)
    conv = _run(
        converse(
            engine, tokenizer=TOK, env=ENV, example=Example("12=", "12"), params=PARAMS, budget=budget, seed=0
        )
    )
    assert (
        not conv.finished and conv.turns == ["123"] and conv.response_ids == TOK.encode("123", add_bos=False)
    )


def test_max_turns_ends_a_conversation_the_environment_did_not_end_and_it_is_unfinished() -> None:
    engine = ScriptedEngine([_said("1"), _said("2"), _said("3")])
    budget = Budget(max_turns=TURNS - 1, tokens_per_turn=8, max_new_tokens=200)
    conv = _run(
        converse(
            engine, tokenizer=TOK, env=ENV, example=Example("12=", "12"), params=PARAMS, budget=budget, seed=0
        )
    )
    assert not conv.finished and conv.turns == ["1", "2"]


def test_the_conversation_budget_counts_the_environments_tokens_and_cuts_the_last_turn() -> None:
    # 2 + 2 (reply) + 3 = 7 tokens fit; the second turn's 4th token does not.
    engine = ScriptedEngine([_said("1"), _said("234")])
    budget = Budget(max_turns=4, tokens_per_turn=8, max_new_tokens=7)
    conv = _run(
        converse(
            engine, tokenizer=TOK, env=ENV, example=Example("12=", "12"), params=PARAMS, budget=budget, seed=0
        )
    )
    assert len(conv.response_ids) == 7 and not conv.finished and conv.turns == ["1", "234"]
    assert conv.response_ids[-1] != TOK.eos_id


def test_only_policy_tokens_are_trained_environment_tokens_add_no_gradient_and_no_count() -> None:
    acc = StepAccumulator(LossConfig(), torch.device("cpu"))
    logprobs = torch.full((1, 6), -1.0, requires_grad=True)
    row = TrainRow([1], [5, 6, 7, 8, 9, 2], [-1.2] * 6, advantage=1.0, loss_mask=[1, 1, 0, 0, 1, 1])
    acc.backward([row], logprobs, torch.ones(1, 6))
    assert logprobs.grad is not None
    grad = logprobs.grad[0].tolist()
    assert grad[2] == grad[3] == 0.0 and all(g != 0.0 for g in grad[:2] + grad[4:])
    assert float(acc._sums["tokens"]) == 4.0


class ConstantRewards:
    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        return [
            Score(1.0 if r == example.answer and f else 0.0, r == example.answer)
            for r, f in zip(responses, finished, strict=True)
        ]


def test_a_multi_turn_group_records_masks_versions_and_scores_each_conversations_last_turn() -> None:
    class Versions(ScriptedEngine):
        async def generate(
            self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
        ) -> generation.Generated:
            out = await super().generate(prompt_ids, n, params, seed)
            self.version += 1  # a refit after every turn: each turn is one version newer
            return out

    engine = Versions([_said("7"), _said("8"), _said("12")])
    manager = RolloutManager(
        engine,  # type: ignore[arg-type]
        ConstantRewards(),  # type: ignore[arg-type]
        TOK,
        PARAMS,
        num_generations=1,
        timeout_seconds=None,
        max_attempts=1,
        seed=0,
        conversations=Conversations(ENV, BUDGET),
    )
    record = _run(manager.run_group(Example("12=", "12"), 0, lambda _: None))
    assert record.rewards == [1.0] and record.correct == [True] and record.finished == [True]
    assert record.loss_masks == [[1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1]]
    assert record.token_versions == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]]
    assert (record.first_version, record.last_version) == (0, 2)


def test_env_class_names_an_environment_of_the_users_own() -> None:
    env = envs.build("reverse", "tests.trainer.custom_envs:EchoEnvironment")
    assert isinstance(env, EchoEnvironment)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (
            "tests.trainer.custom_envs:NotAnEnvironment",
            "is not a subclass of asyncgrpo_trainer.envs.Environment",
        ),
        ("tests.trainer.custom_envs:Missing", "does not exist"),
        ("tests.trainer.no_such_module:Env", "cannot import 'tests.trainer.no_such_module'"),
    ],
)
def test_an_env_class_that_cannot_be_used_fails_naming_env_class(path: str, why: str) -> None:
    with pytest.raises(InvalidDataError, match=r"env\.class") as info:
        envs.build("reverse", path)
    assert why in str(info.value)


def test_a_checkpoints_conversation_is_token_for_token_its_chat_template_rendering(tmp_path: Path) -> None:
    directory = make_tiny_checkpoint(tmp_path / "qwen2")
    tok = CheckpointTokenizer(str(directory))
    end = tok.encode_response("<|im_end|>")
    ids = [
        *tok.encode_prompt("37*58="),
        *tok.encode_response("?37*58"),
        *end,
        *tok.encode_turn("tool", ">2146"),
        *tok.encode_response("2146"),
        *end,
    ]
    messages = [
        {"role": "user", "content": "37*58="},
        {"role": "assistant", "content": "?37*58"},
        {"role": "tool", "content": ">2146"},
        {"role": "assistant", "content": "2146"},
    ]
    rendered = tok._tok.apply_chat_template(messages, tokenize=False)
    assert ids == tok._tok(rendered.removesuffix("\n"), add_special_tokens=False)["input_ids"]
