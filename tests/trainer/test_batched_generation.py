"""The torch generation worker's batched engine (StaticDecoder) on CPU, against the model itself.

Concurrent `generate` calls share one decode batch; each caller gets its own rows back. The
references are the plain model: `CausalLM.forward` with its own KV cache for greedy tokens,
`sampling.token_logprobs` / `sampling.filtered_logprobs` by teacher forcing for the recorded
log-probs. Weights are scaled up (as in test_static_decode) so logits are far apart and greedy
argmax has no near-ties that float rounding could flip. `engine="batched"` runs the path CUDA
workers take by default (eagerly: no CUDA graph on CPU).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import torch

from asyncgrpo_trainer.backends import generation, sampling, static_decode
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.network import CausalLM, KVCache
from asyncgrpo_trainer.models.recipe import ModelBuild
from tests.skip_policy import requires_cuda

CFG = tiny_config(
    vocab_size=61,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    max_positions=40,
    position_embedding="rope",
)
EOS = 60
BUILD = ModelBuild(CFG, seed=3, dtype="float32", pad_id=0, eos_ids=(EOS,))
GREEDY = sampling.SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPTS = [[5, 9, 2], [7, 1, 8, 3, 3, 4, 11], [13], [2, 4, 6, 8, 10]]


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=requires_cuda()),
]
"""On CUDA the batched engine replays CUDA graphs and queues chunks without waiting (the GPU run)."""


def _worker(
    engine: generation.Engine = "batched", device: str = "cpu", **kw: Any
) -> generation.TorchGenerationWorker:
    return generation.TorchGenerationWorker(
        BUILD, device=device, engine=engine, collect_seconds=0.0, sync_every=2, **kw
    )


def _scaled(model: CausalLM, seed: int) -> None:
    """Different, larger weights in place (far-apart logits)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.25)


def _run(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(make())


def _greedy_ref(models: list[CausalLM], switch_after: int, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from the plain forward, models[0] for the first `switch_after` forwards
    (prefill included) and models[-1] after, on the KV cache the earlier forwards left."""
    toks: list[int] = []
    cache: KVCache | None = None
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for i in range(n):
            model = models[0] if i < switch_after else models[-1]
            logits, cache = model(ids, cache)
            tok = int(logits[0, -1].argmax())
            toks.append(tok)
            if tok == EOS:
                break
            ids = torch.tensor([[tok]])
    return toks


def test_concurrent_groups_share_one_batch_and_each_gets_its_own_rows() -> None:
    worker = _worker()
    _scaled(worker.model, 1)
    params = sampling.SamplingParams(max_new_tokens=9, temperature=0.8, top_k=20, top_p=0.9)
    ns = [3, 1, 4, 2]

    async def scenario() -> list[generation.Generated]:
        await worker.adopt_weights(0)
        return list(
            await asyncio.gather(
                *(
                    worker.generate(p, n, params, seed=i)
                    for i, (p, n) in enumerate(zip(PROMPTS, ns, strict=True))
                )
            )
        )

    outs = _run(scenario)
    stats = _run(worker.stats)
    assert stats["batches"] == 1  # all four groups decoded together
    assert stats["tokens_generated"] == sum(len(r) for o in outs for r in o.response_ids)
    # The batch's busy time is split by rows: the same per row for every group.
    per_row = [o.busy_seconds / n for o, n in zip(outs, ns, strict=True)]
    assert per_row == pytest.approx([per_row[0]] * 4) and per_row[0] > 0
    assert stats["busy_seconds"] >= sum(o.busy_seconds for o in outs)
    for out, prompt, n in zip(outs, PROMPTS, ns, strict=True):
        assert len(out.response_ids) == len(out.logprobs) == len(out.finished) == n
        assert (out.first_version, out.last_version) == (0, 0)
        for toks, lps, fin in zip(out.response_ids, out.logprobs, out.finished, strict=True):
            assert 1 <= len(toks) == len(lps) <= 9
            assert fin == (toks[-1] == EOS) and EOS not in toks[:-1]
            # Recorded log-probs are those of the filtered distribution given THIS group's prompt.
            with torch.no_grad():
                logits, _ = worker.model(torch.tensor([prompt + toks]), None)
            logp = sampling.filtered_logprobs(logits[0, len(prompt) - 1 : -1], params)
            ref = logp.gather(-1, torch.tensor(toks).unsqueeze(-1)).squeeze(-1)
            assert lps == pytest.approx(ref.tolist(), abs=1e-4)


def test_logprobs_equal_what_the_policy_recomputes_for_the_sampled_tokens() -> None:
    worker = _worker()
    _scaled(worker.model, 2)
    params = sampling.SamplingParams(max_new_tokens=10, temperature=0.7)

    async def scenario() -> list[generation.Generated]:
        await worker.adopt_weights(0)
        return list(await asyncio.gather(*(worker.generate(p, 3, params, seed=5) for p in PROMPTS)))

    outs = _run(scenario)
    rows = [(p, r) for p, o in zip(PROMPTS, outs, strict=True) for r in o.response_ids]
    ref, mask = sampling.token_logprobs(
        worker._forward, rows, pad_id=0, temperature=0.7, device=torch.device("cpu")
    )
    got = [lp for o in outs for lp in o.logprobs]
    for i, lps in enumerate(got):
        assert int(mask[i].sum()) == len(lps)
        assert lps == pytest.approx(ref[i, : len(lps)].tolist(), abs=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_greedy_equals_the_per_group_loop(device: str) -> None:
    batched, loop = _worker("batched", device), _worker("per-group", device)
    for w in (batched, loop):
        _scaled(w.model, 3)

    async def scenario(w: generation.TorchGenerationWorker) -> list[generation.Generated]:
        await w.adopt_weights(4)
        return list(await asyncio.gather(*(w.generate(p, 2, GREEDY, seed=i) for i, p in enumerate(PROMPTS))))

    fast, slow = _run(lambda: scenario(batched)), _run(lambda: scenario(loop))
    assert _run(batched.stats)["batches"] == 1 and _run(loop.stats)["batches"] == 0
    for f, s in zip(fast, slow, strict=True):
        assert f.response_ids == s.response_ids
        assert f.finished == s.finished
        for a, b in zip(f.logprobs, s.logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_weight_update_lands_between_chunks_and_later_tokens_follow_it(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    worker = _worker(device=device)
    _scaled(worker.model, 4)
    old = BUILD.instantiate()
    old.load_state_dict({k: v.cpu() for k, v in worker.model.state_dict().items()})
    new = BUILD.instantiate()
    _scaled(new, 5)
    chunk_done = asyncio.Event()
    collect = static_decode.Decoding.collect

    def collect_and_signal(self: static_decode.Decoding) -> bool:
        finished = collect(self)
        chunk_done.set()
        return finished

    monkeypatch.setattr(static_decode.Decoding, "collect", collect_and_signal)

    async def scenario() -> list[generation.Generated]:
        await worker.adopt_weights(0)
        groups = [asyncio.create_task(worker.generate(p, 1, GREEDY, seed=0)) for p in PROMPTS]
        await chunk_done.wait()  # the first chunk (2 decode steps) has run
        await worker.load_weights(new.state_dict(), 1)
        return list(await asyncio.gather(*groups))

    outs = _run(scenario)
    changed = 0
    for out, prompt in zip(outs, PROMPTS, strict=True):
        assert (out.first_version, out.last_version) == (0, 1)
        # Prefill + 2 decode forwards ran on the old weights; every forward after on the new ones.
        expect = _greedy_ref([old, new], 3, prompt, GREEDY.max_new_tokens)
        assert out.response_ids[0] == expect
        changed += expect != _greedy_ref([old], 0, prompt, GREEDY.max_new_tokens)
    assert changed  # the update made a difference the test can see


def test_adopt_weights_after_an_in_place_write_is_seen_by_the_decoder() -> None:
    worker = _worker()
    _scaled(worker.model, 6)
    target = BUILD.instantiate()
    _scaled(target, 7)

    async def scenario() -> tuple[generation.Generated, generation.Generated]:
        await worker.adopt_weights(0)
        before = await worker.generate(PROMPTS[1], 1, GREEDY, seed=0)  # builds the decoder
        with torch.no_grad():  # what an NCCL receive does: write into the live parameters
            for p, q in zip(worker.model.parameters(), target.parameters(), strict=True):
                p.copy_(q)
        await worker.adopt_weights(7)
        return before, await worker.generate(PROMPTS[1], 1, GREEDY, seed=0)

    before, after = _run(scenario)
    assert (after.first_version, after.last_version) == (7, 7)
    expect = _greedy_ref([target], 0, PROMPTS[1], GREEDY.max_new_tokens)
    assert after.response_ids[0] == expect
    assert before.response_ids[0] != expect


def test_a_group_larger_than_the_row_limit_is_split_over_batches_and_resets_count() -> None:
    worker = _worker(max_batch_rows=4)
    _scaled(worker.model, 8)

    async def scenario() -> list[generation.Generated]:
        await worker.adopt_weights(2)
        outs = list(await asyncio.gather(*(worker.generate(p, 3, GREEDY, seed=0) for p in PROMPTS[:3])))
        await worker.reset_cache()
        return outs

    outs = _run(scenario)
    stats = _run(worker.stats)
    assert stats["batches"] == 3 and stats["cache_resets"] == 1  # 9 rows, at most 4 a batch
    for out, prompt in zip(outs, PROMPTS[:3], strict=True):
        expect = _greedy_ref([worker.model], 0, prompt, GREEDY.max_new_tokens)
        assert out.response_ids == [expect] * 3


@pytest.mark.parametrize("engine", ["batched", "per-group"])
def test_ignore_eos_keeps_sampling_to_max_new_tokens_and_no_row_finishes(engine: generation.Engine) -> None:
    w = _worker(engine)
    _scaled(w.model, 3)
    ignoring = sampling.SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)

    async def scenario(params: sampling.SamplingParams) -> list[generation.Generated]:
        await w.adopt_weights(1)  # the batched decoders pick up the edited weights
        return list(await asyncio.gather(*(w.generate(p, 2, params, seed=i) for i, p in enumerate(PROMPTS))))

    # EOS takes over the logit row of a token greedy decoding picks, so the default run stops there.
    picked = _run(lambda: scenario(GREEDY))[0].response_ids[0][3]
    with torch.no_grad():
        w.model.lm_head.weight[EOS] = 1.5 * w.model.lm_head.weight[picked]
    stopping, ignored = _run(lambda: scenario(GREEDY)), _run(lambda: scenario(ignoring))
    stopped = [r for g in stopping for r, done in zip(g.response_ids, g.finished, strict=True) if done]
    assert stopped and all(r[-1] == EOS and len(r) < 12 for r in stopped)  # the default run did stop
    for stop, full in zip(stopping, ignored, strict=True):
        assert full.finished == [False, False]
        for short, long, logprobs in zip(stop.response_ids, full.response_ids, full.logprobs, strict=True):
            assert len(long) == len(logprobs) == 12
            assert long[: len(short)] == short  # same greedy tokens up to the stop, then more


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["batched", "per-group"])
def test_an_engine_that_slept_frees_its_caches_and_samples_exactly_as_before(
    engine: generation.Engine, device: str
) -> None:
    """generation.sleepWhileTraining on the torch engine: the prefix cache's KV and the batched
    decoders (their KV caches, and on CUDA their graphs) are gone while it sleeps; after waking it
    samples the same tokens and log-probs for the same seeds, as if it had never slept."""
    w = _worker(engine, device)
    _scaled(w.model, 5)
    params = sampling.SamplingParams(max_new_tokens=12, temperature=1.0)

    async def scenario() -> tuple[list[generation.Generated], list[generation.Generated]]:
        await w.adopt_weights(1)
        before = [await w.generate(p, 3, params, seed=i) for i, p in enumerate(PROMPTS)]
        await w.sleep()
        assert not w._prefix and not w._decoders  # nothing of the caches is left
        await w.wake()
        return before, [await w.generate(p, 3, params, seed=i) for i, p in enumerate(PROMPTS)]

    before, after = _run(scenario)
    for b, a in zip(before, after, strict=True):
        assert a.response_ids == b.response_ids
        for row_after, row_before in zip(a.logprobs, b.logprobs, strict=True):
            assert row_after == pytest.approx(row_before, abs=1e-5)
    assert _run(w.stats)["sleeps"] == 1
