"""The vLLM engine (vLLM's CPU build) behind the generation contract, against the torch side.

One engine serves the whole module (it takes minutes to start on 2 cores): a tiny random Qwen2
checkpoint made locally, whose recipe ends a response at one extra token chosen so that a known
prompt stops early. What is checked is what the controller relies on: N samples per prompt with
the log-probs the policy recomputes (the gate: mean exp|logp_vllm - logp_policy| <= 1.05 in
float32), greedy tokens equal to the torch engine's, stopping at the recipe's EOS ids, aborting
a cancelled request, weight versions across an in-flight refit, and refits by the object store
and by the gloo broadcast that land exactly the policy's weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import torch

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import generation, nccl_sync, policy, sampling
from asyncgrpo_trainer.backends.vllm_engine import VLLMGenerationWorker, VLLMOptions
from asyncgrpo_trainer.conversation import Budget, Conversation, converse
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer
from tests.trainer.custom_envs import TURNS, EchoEnvironment

pytestmark = pytest.mark.vllm

T = TypeVar("T")
PROMPT = [5, 17, 9, 23, 40]
GREEDY = sampling.SamplingParams(max_new_tokens=12, temperature=0.0)


class Engine:
    """The module's engine and the event loop it lives on (AsyncLLM binds to one loop). A Runner,
    not a bare loop: closing it cancels the engine's leftover tasks, which a closed loop would leave
    to print `Task was destroyed but it is pending!` at exit."""

    def __init__(self, build: recipe.ModelBuild, stop_token: int, tokenizer: CheckpointTokenizer) -> None:
        self.runner = asyncio.Runner()
        self.build, self.stop_token, self.tokenizer = build, stop_token, tokenizer
        self.worker = self.run(self._start())

    async def _start(self) -> VLLMGenerationWorker:
        return VLLMGenerationWorker(
            self.build, device="cpu", max_prefix_age=1, options=VLLMOptions(max_num_seqs=16)
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)


def _greedy_reference(build: recipe.ModelBuild, n: int) -> list[int]:
    worker = generation.TorchGenerationWorker(build, device="cpu", engine="per-group")
    params = dataclasses.replace(GREEDY, max_new_tokens=n, ignore_eos=True)
    return asyncio.run(worker.generate(PROMPT, 1, params, seed=0)).response_ids[0]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    # Untied: a random tied head favours repeating the input, and the greedy path needs variety.
    path = make_tiny_checkpoint(
        tmp_path_factory.mktemp("vllm") / "qwen2", family="qwen2", tie_word_embeddings=False, seed=3
    )
    base, tokenizer = recipe.pretrained_build(
        str(path), max_sequence_length=512, dtype="float32", seed=0, chat_template=None, system_prompt=None
    )
    tokens = _greedy_reference(base, 12)
    stop = max(set(tokens), key=tokens.index)  # the token greedy decoding reaches last
    assert tokens.index(stop) > 0, tokens
    build = dataclasses.replace(base, eos_ids=(*base.eos_ids, stop))
    eng = Engine(build, stop, tokenizer)
    yield eng
    eng.run(eng.worker.shutdown())
    eng.runner.close()


def _policy(build: recipe.ModelBuild) -> policy.TorchPolicyWorker:
    optim = policy.OptimConfig(
        learning_rate=5e-2,
        weight_decay=0.0,
        max_grad_norm=None,
        warmup_steps=0,
        micro_batch_size=8,
        logprob_batch_size=8,
        temperature=1.0,
    )
    return policy.TorchPolicyWorker(build, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu")


def _gate(worker: policy.TorchPolicyWorker, out: generation.Generated) -> float:
    """NeMo-RL's token_mult_prob_error: mean over tokens of exp(|logp_engine - logp_policy|)."""
    rows = [(PROMPT, r) for r in out.response_ids]
    with torch.no_grad():
        lp, mask = worker.logprobs(worker.model, rows, worker.device)
    engine_lp = torch.zeros_like(lp)
    for i, row in enumerate(out.logprobs):
        engine_lp[i, : len(row)] = torch.tensor(row)
    return float(((lp - engine_lp).abs().exp() * mask).sum() / mask.sum())


def test_n_samples_come_with_the_log_probs_the_policy_recomputes(engine: Engine) -> None:
    params = sampling.SamplingParams(max_new_tokens=10, temperature=1.0)
    out = engine.run(engine.worker.generate(PROMPT, 6, params, seed=7))
    assert len(out.response_ids) == len(out.logprobs) == len(out.finished) == 6
    assert len({tuple(r) for r in out.response_ids}) > 1  # sampled, not six copies
    assert all(len(r) == len(lp) for r, lp in zip(out.response_ids, out.logprobs, strict=True))
    gate = _gate(_policy(engine.build), out)
    assert 1.0 <= gate <= 1.05, gate


def test_greedy_tokens_equal_the_torch_engine_and_stop_at_any_eos_id(engine: Engine) -> None:
    out = engine.run(engine.worker.generate(PROMPT, 1, GREEDY, seed=0))
    reference = _greedy_reference(engine.build, 12)
    stop_at = reference.index(engine.stop_token) + 1
    assert out.response_ids[0] == reference[:stop_at]  # the ending token is part of the response
    assert out.finished == [True]
    past = engine.run(engine.worker.generate(PROMPT, 1, dataclasses.replace(GREEDY, ignore_eos=True), seed=0))
    assert past.response_ids[0] == reference and past.finished == [False]  # ran to maxNewTokens


def test_a_cancelled_generation_is_aborted_in_the_engine(engine: Engine) -> None:
    long = sampling.SamplingParams(max_new_tokens=100, temperature=1.0, ignore_eos=True)

    async def cancel_midway() -> bool:
        processor = engine.worker.engine.output_processor
        task = asyncio.create_task(engine.worker.generate(PROMPT, 4, long, seed=1))
        while not processor.has_unfinished_requests():  # in the engine: cancel it mid-generation
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        return bool(processor.has_unfinished_requests())

    assert not engine.run(cancel_midway())


def _train_step(worker: policy.TorchPolicyWorker, g: torch.Generator) -> None:
    """One optimizer step on random rows: the policy's weights move away from where they were."""
    rows = [
        policy.TrainRow(PROMPT, torch.randint(3, 300, (4,), generator=g).tolist(), [-6.0] * 4, advantage=a)
        for a in (1.0, -1.0, 0.5, -0.5)
    ]
    worker.train_chunk(rows)
    worker.finish_step()


def _changed(build: recipe.ModelBuild, seed: int) -> tuple[policy.TorchPolicyWorker, dict[str, torch.Tensor]]:
    """A policy whose weights differ from the checkpoint's (one optimizer step on random rows)."""
    worker = _policy(build)
    _train_step(worker, torch.Generator().manual_seed(seed))
    return worker, worker.weights()


def test_an_object_store_refit_brings_the_policys_weights_and_the_gate_holds(engine: Engine) -> None:
    worker, weights = _changed(engine.build, seed=11)
    engine.run(engine.worker.load_weights(weights, version=1))
    params = sampling.SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
    out = engine.run(engine.worker.generate(PROMPT, 8, params, seed=3))
    assert (out.first_version, out.last_version) == (1, 1)
    gate = _gate(worker, out)
    assert gate <= 1.05, gate
    assert _gate(_policy(engine.build), out) > gate  # the old weights explain these samples worse


def test_a_gloo_broadcast_refit_lands_in_vllms_own_weights(engine: Engine) -> None:
    worker, _ = _changed(engine.build, seed=12)
    store = nccl_sync.serve_store("127.0.0.1", 2, 60.0)
    spec = nccl_sync.RefitSpec("127.0.0.1", store.port, 2, "gloo", 1 << 16, 60.0)
    named = dict(worker.model.named_parameters())
    sent: list[BaseException] = []

    def send() -> None:
        try:
            group = nccl_sync.RefitGroup(
                spec, rank=0, build=engine.build, named=named.items(), device=torch.device("cpu"), store=store
            )
            group.broadcast.sync(named)
        except BaseException as exc:  # surfaced below
            sent.append(exc)

    async def receive() -> generation.Generated:
        sender = threading.Thread(target=send)
        sender.start()
        await engine.worker.refit_join(spec, 1)
        await engine.worker.refit_receive(version=2)
        await asyncio.to_thread(sender.join)
        params = sampling.SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
        return await engine.worker.generate(PROMPT, 8, params, seed=4)

    out = engine.run(receive())
    assert not sent, sent
    assert out.first_version == 2
    assert _gate(worker, out) <= 1.05


def test_a_refit_during_a_generation_lands_between_engine_steps(engine: Engine) -> None:
    _, weights = _changed(engine.build, seed=13)
    long = sampling.SamplingParams(max_new_tokens=480, temperature=1.0, ignore_eos=True)

    async def refit_midway() -> generation.Generated:
        processor = engine.worker.engine.output_processor
        task = asyncio.create_task(engine.worker.generate(PROMPT, 2, long, seed=5))
        while not processor.has_unfinished_requests():  # in the engine: refit mid-generation
            await asyncio.sleep(0.001)
        await engine.worker.load_weights(weights, version=3)
        return await task

    out = engine.run(refit_midway())
    assert out.first_version < 3 and out.last_version == 3
    assert all(len(r) == 480 for r in out.response_ids)
    assert all(math.isfinite(x) for row in out.logprobs for x in row)


def test_every_refit_of_a_policy_that_keeps_training_lands_in_vllm(engine: Engine) -> None:
    """Not only the first refit: a policy trained step after step is refit after each step, and
    each time the engine samples exactly its distribution, while the weights one step older explain
    the same samples worse (issue 25 ruled out refits that stop reaching vLLM's CPU weights)."""
    worker, _ = _changed(engine.build, seed=21)
    g = torch.Generator().manual_seed(21)
    params = sampling.SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
    for version in range(10, 15):
        before = worker.weights()
        _train_step(worker, g)
        engine.run(engine.worker.load_weights(worker.weights(), version=version))
        out = engine.run(engine.worker.generate(PROMPT, 8, params, seed=version))
        assert out.first_version == out.last_version == version
        gate = _gate(worker, out)
        older = _policy(engine.build)
        older.model.load_state_dict(before)
        assert gate <= 1.05 and _gate(older, out) > gate, (version, gate)


def test_a_multi_turn_conversation_on_vllm_samples_what_the_policy_recomputes_turn_after_turn(
    engine: Engine,
) -> None:
    """The conversation loop (`conversation.converse`) on vLLM, as on the torch engine
    (tests/trainer/test_multiturn.py): each policy turn is one generate call on the conversation so
    far, the environment's replies are appended as the checkpoint's chat template encodes them, and
    every policy token's log-prob is the one the policy recomputes from the same prefix, on the
    later turns too (issue 31 item 1)."""
    env = EchoEnvironment()
    worker, weights = _changed(engine.build, seed=31)
    engine.run(engine.worker.load_weights(weights, version=100))
    examples = env.builtin_examples(split="train", count=16, seed=0)
    params = sampling.SamplingParams(max_new_tokens=64, temperature=1.0)
    budget = Budget(max_turns=TURNS, tokens_per_turn=64, max_new_tokens=240)

    async def conversations() -> list[Conversation]:
        return list(
            await asyncio.gather(
                *(
                    converse(
                        engine.worker,
                        tokenizer=engine.tokenizer,
                        env=env,
                        example=e,
                        params=params,
                        budget=budget,
                        seed=i,
                    )
                    for i, e in enumerate(examples)
                )
            )
        )

    convs = engine.run(conversations())
    later = [c for c in convs if len(c.turns) >= 2]
    assert later, "no conversation got past its first turn"
    for c in later:
        replies = [engine.tokenizer.encode_turn("user", f">{k}") for k in range(1, len(c.turns))]
        env_tokens = [t for t, m in zip(c.response_ids, c.loss_mask, strict=True) if not m]
        assert env_tokens == [t for r in replies for t in r]
    rows = [
        (engine.tokenizer.encode_prompt(e.model_prompt), c.response_ids)
        for e, c in zip(examples, convs, strict=True)
    ]
    with torch.no_grad():
        recomputed, _ = worker.logprobs(worker.model, rows, worker.device)
    errors = [
        math.exp(abs(float(recomputed[i, j]) - c.logprobs[j]))
        for i, c in enumerate(convs)
        for j, trained in enumerate(c.loss_mask)
        if trained and len(c.turns) >= 2 and j >= c.loss_mask.index(0)  # a later turn's tokens
    ]
    assert errors, "no policy token after an environment turn"
    assert sum(errors) / len(errors) <= 1.05, sum(errors) / len(errors)
