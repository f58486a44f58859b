"""Token sampling with a KV cache, and per-token log-probs of given sequences (pure torch).

Both backends use these: the generation worker samples with `sample_group`, the policy worker
scores training rows with `token_logprobs`. Keeping them together keeps the two sides' notion of
"log-prob of a token" identical (same temperature scaling, same masking), which is what makes the
importance weights pi_old / pi_gen equal 1 when the weights are equal. When the sampler filters
(top-k, top-p), the policy scores the rows once more under the same filter
(`token_logprobs(..., params=Filter(...))`): the engine recorded log-probs of the filtered,
renormalized distribution, and comparing them with the unfiltered one would bias every weight
below 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.models.network import KVCache

Forward = Callable[[torch.Tensor, KVCache | None], tuple[torch.Tensor, KVCache]]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    ignore_eos: bool = False
    """Keep sampling past end-of-sequence up to max_new_tokens (responses then never finish)."""


@dataclass(frozen=True)
class Filter:
    """A sampled distribution without the decoding budget: what the policy needs to score tokens
    the way the engine sampled them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p cut the distribution (else it is the plain temperature softmax)."""
        return self.top_p < 1.0 or self.top_k is not None


class Distribution(Protocol):
    """What shapes the sampled distribution; SamplingParams and static_decode.DecodeParams both are."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int | None: ...


def filtered_logprobs(logits: torch.Tensor, params: Distribution) -> torch.Tensor:
    """Log-probs (B, V) of the distribution actually sampled from: temperature, top-k, top-p."""
    temp = params.temperature if params.temperature > 0 else 1.0
    logits = logits.float() / temp
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = F.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return F.log_softmax(logits, dim=-1)


@dataclass(frozen=True)
class Sampled:
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]


def decode_step(
    forward: Forward,
    last_logits: torch.Tensor,
    cache: KVCache,
    state: DecodeState,
    *,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, KVCache]:
    """Sample one token for every live row; returns the next logits (B, V) and cache."""
    logp = filtered_logprobs(last_logits, params)
    if params.temperature == 0:
        tok = logp.argmax(-1)
    else:
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    chosen = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    state.record(tok, chosen)
    logits, cache = forward(tok.unsqueeze(-1), cache)
    return logits[:, -1], cache


class DecodeState:
    """Per-row tokens, log-probs and end-of-sequence flags of a batch being decoded.

    A row ends at any of `eos_ids`; with none (ignore_eos) no row ends early: every row runs the
    whole budget.
    """

    def __init__(self, batch: int, eos_ids: tuple[int, ...]) -> None:
        self.eos_ids = frozenset(eos_ids)
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.done = [False] * batch

    def record(self, tok: torch.Tensor, logp: torch.Tensor) -> None:
        for i, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist(), strict=True)):
            if self.done[i]:
                continue
            self.tokens[i].append(int(t))
            self.logprobs[i].append(float(lp))
            if t in self.eos_ids:
                self.done[i] = True

    @property
    def all_done(self) -> bool:
        return all(self.done)

    def result(self) -> Sampled:
        return Sampled(self.tokens, self.logprobs, list(self.done))


def expand_cache(cache: KVCache, n: int) -> KVCache:
    """Repeat a batch-1 cache n times along the batch (prefill once, decode N samples)."""
    return [(k.expand(n, -1, -1, -1).contiguous(), v.expand(n, -1, -1, -1).contiguous()) for k, v in cache]


def token_logprobs(
    forward: Forward,
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int,
    device: torch.device,
    temperature: float = 1.0,
    params: Distribution | None = None,
    grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (B, R) of each row's response tokens given its prompt, and the response mask (B, R).

    rows are (prompt_ids, response_ids); R is the longest response. Rows are right-padded, which a
    causal model never attends to from earlier positions, so no attention mask is needed. `params`
    (a sampler's temperature, top-k, top-p) replaces `temperature` with the filtered distribution.
    """
    dist = params if params is not None else Filter(temperature)
    with torch.set_grad_enabled(grad):
        return _token_logprobs(forward, rows, pad_id=pad_id, params=dist, device=device)


def _token_logprobs(
    forward: Forward,
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int,
    params: Distribution,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    full = [list(p) + list(r) for p, r in rows]
    length = max(len(x) for x in full)
    r_max = max(*(len(r) for _, r in rows), 1)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for i, seq in enumerate(full):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    ids = ids.to(device)
    logits, _ = forward(ids, None)
    logp_all = filtered_logprobs(logits, params)
    # Gather index positions: token at position t is predicted by logits at t-1.
    index = torch.zeros((len(rows), r_max), dtype=torch.long)
    mask = torch.zeros((len(rows), r_max))
    for i, (p, r) in enumerate(rows):
        n = len(r)
        if n:
            index[i, :n] = torch.arange(len(p) - 1, len(p) - 1 + n)
            mask[i, :n] = 1.0
    index, mask = index.to(device), mask.to(device)
    targets = torch.gather(ids, 1, (index + 1).clamp(max=length - 1))
    pos_logp = torch.gather(logp_all, 1, index.unsqueeze(-1).expand(-1, -1, logp_all.shape[-1]))
    out = pos_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # where, not a product: a filtered distribution gives -inf to tokens it cut, padding included.
    return torch.where(mask > 0, out, torch.zeros_like(out)), mask
