"""static_decode against the model's own forward (CPU, float32, a tiny model).

The fast decoder re-implements the forward with packed weights and a static cache; these tests
pin it to `CausalLM.forward` (greedy tokens equal, log-probs within float32 rounding), to the
padding rules (each left-padded row decodes as if it were alone), and to the sampling semantics
of `sampling.filtered_logprobs` (the recorded log-prob of a sampled token is what the policy
recomputes by teacher forcing).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder, filtered_logprobs
from asyncgrpo_trainer.models.config import tiny_config
from asyncgrpo_trainer.models.network import CausalLM

CFG = tiny_config(
    vocab_size=97,
    hidden_size=64,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    max_positions=64,
    position_embedding="rope",
)


def _model(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(CFG).eval()
    model.init_random()
    # Larger weights than the init so logits are far apart and argmax has no near-ties.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model


def _reference_greedy(model: CausalLM, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Plain forward decode with the model's own KV cache (what generation.py does), greedy."""
    with torch.no_grad():
        logits, cache = model(torch.tensor([prompt]), None)
        last = logits[:, -1]
        toks: list[int] = []
        lps: list[float] = []
        for _ in range(n):
            logp = F.log_softmax(last.float(), dim=-1)
            tok = int(logp.argmax(-1))
            toks.append(tok)
            lps.append(float(logp[0, tok]))
            logits, cache = model(torch.tensor([[tok]]), cache)
            last = logits[:, -1]
    return toks, lps


def test_greedy_matches_plain_forward() -> None:
    model = _model()
    torch.manual_seed(1)
    prompts = torch.randint(1, CFG.vocab_size, (3, 9)).tolist()
    dec = StaticDecoder(
        model,
        max_batch=4,
        max_prompt_len=16,
        max_new_tokens=12,
        params=DecodeParams(temperature=0.0),
        eos_ids=(),
    )
    out = dec.generate(prompts)
    toks, lps, fin = out.to_lists()
    for i, p in enumerate(prompts):
        ref_t, ref_lp = _reference_greedy(model, p, 12)
        assert toks[i] == ref_t
        assert lps[i] == pytest.approx(ref_lp, abs=1e-4)
    assert fin == [False, False, False]
    # The model's parameters require grad; nothing the decoder keeps may join an autograd graph.
    st = dec._state(3)
    dec._prefill(st, torch.tensor(prompts), st.pad.zero_())
    assert not (dec.k_cache.requires_grad or st.logits.requires_grad)


def test_left_padded_rows_decode_as_if_alone() -> None:
    model = _model(2)
    torch.manual_seed(3)
    prompts = [torch.randint(1, CFG.vocab_size, (n,)).tolist() for n in (5, 11, 1, 8)]
    dec = StaticDecoder(
        model,
        max_batch=4,
        max_prompt_len=12,
        max_new_tokens=10,
        params=DecodeParams(temperature=0.0),
        eos_ids=(),
    )
    toks, lps, _ = dec.generate(prompts).to_lists()
    for i, p in enumerate(prompts):
        ref_t, ref_lp = _reference_greedy(model, p, 10)
        assert toks[i] == ref_t, f"row {i}"
        assert lps[i] == pytest.approx(ref_lp, abs=1e-4)


def test_eos_stops_rows_and_lengths_count_it() -> None:
    model = _model(4)
    torch.manual_seed(5)
    prompts = torch.randint(1, CFG.vocab_size, (2, 6)).tolist()
    ref_t, _ = _reference_greedy(model, prompts[0], 8)
    eos = ref_t[3]  # row 0 ends at its 4th token (or earlier if that token repeats)
    dec = StaticDecoder(
        model,
        max_batch=2,
        max_prompt_len=6,
        max_new_tokens=8,
        params=DecodeParams(temperature=0.0),
        eos_ids=(eos,),
        pad_id=0,
        sync_every=2,
    )
    out = dec.generate(prompts)
    toks, _, fin = out.to_lists()
    cut = ref_t.index(eos) + 1
    assert toks[0] == ref_t[:cut]
    assert fin[0]
    assert all(t == 0 for t in out.tokens[0, cut:].tolist())
    assert float(out.logprobs[0, cut:].abs().sum()) == 0.0


@pytest.mark.parametrize(
    "params",
    [DecodeParams(1.0), DecodeParams(0.7, top_p=0.9), DecodeParams(1.3, top_k=5), DecodeParams(0.8, 0.8, 7)],
)
def test_sampled_logprobs_match_teacher_forcing(params: DecodeParams) -> None:
    model = _model(6)
    torch.manual_seed(7)
    prompts = torch.randint(1, CFG.vocab_size, (4, 7)).tolist()
    dec = StaticDecoder(model, max_batch=4, max_prompt_len=7, max_new_tokens=9, params=params, eos_ids=())
    out = dec.generate(prompts, seed=11)
    toks, lps, _ = out.to_lists()
    with torch.no_grad():
        for i, p in enumerate(prompts):
            full = torch.tensor([p + toks[i]])
            logits, _ = model(full, None)
            logp = filtered_logprobs(logits[0, len(p) - 1 : -1], params)
            ref = logp.gather(-1, torch.tensor(toks[i]).unsqueeze(-1)).squeeze(-1)
            assert torch.isfinite(ref).all(), "a sampled token lies outside the filtered support"
            assert lps[i] == pytest.approx(ref.tolist(), abs=1e-4)
    # Same seed, same samples.
    again = dec.generate(prompts, seed=11)
    assert torch.equal(again.tokens, out.tokens)


def test_filtered_logprobs_matches_sampling_module() -> None:
    sampling = pytest.importorskip("asyncgrpo_trainer.backends.sampling")
    torch.manual_seed(8)
    logits = torch.randn(5, 50) * 3
    for t, p, k in [(1.0, 1.0, None), (0.7, 0.9, None), (1.2, 1.0, 10), (0.5, 0.6, 4), (0.0, 1.0, None)]:
        ours = filtered_logprobs(logits, DecodeParams(t, p, k))
        theirs = sampling.filtered_logprobs(logits, sampling.SamplingParams(8, t, p, k))
        assert torch.allclose(ours, theirs, equal_nan=True)


def test_refresh_weights_follows_a_refit() -> None:
    model = _model(9)
    other = _model(10)
    prompts = torch.randint(1, CFG.vocab_size, (2, 5)).tolist()
    dec = StaticDecoder(
        model,
        max_batch=2,
        max_prompt_len=5,
        max_new_tokens=6,
        params=DecodeParams(temperature=0.0),
        eos_ids=(),
    )
    dec.generate(prompts)
    model.load_state_dict(other.state_dict())
    dec.refresh_weights()
    toks, _, _ = dec.generate(prompts).to_lists()
    assert toks[0] == _reference_greedy(other, prompts[0], 6)[0]
