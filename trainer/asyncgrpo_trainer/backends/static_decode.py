"""Fast batched decoding for a `CausalLM`: static KV cache, one CUDA graph per decode step.

Why this exists: the plain loop (`sampling.decode_step` over `CausalLM.forward`) launches a few
thousand small kernels per token and copies every token to the host to check for end-of-sequence;
on an H200 a 24-layer model then spends ~65 ms per step waiting on the CPU (HF `generate()` is the
same, about 2% of the decode bound). Here every buffer is allocated once, so one whole decode step
(sample, record, end-of-sequence bookkeeping, forward of the new token through all layers) is
captured once in a CUDA graph and replayed; the host only looks at the device every `sync_every`
steps to stop early when every row has ended, and need not wait for it (`Decoding.launch`).

What is read from the model: its config and its parameters. The projections q/k/v and gate/up are
packed into one matrix each (one GEMM instead of three or two); those packed copies are the only
weights held twice, so after the model's weights change (a refit) call `refresh_weights()`, which
copies in place and keeps the addresses the graph captured. All other parameters are used directly.

Numerics follow the model (RMSNorm in fp32, RoPE tables in fp32 cast to the model dtype, scale
1/sqrt(D), softmax in fp32) and the sampled distribution follows `sampling.filtered_logprobs`
(temperature, then top-k, then top-p, then log-softmax), so the log-prob recorded for a token is
the one the policy side recomputes for it. Sampling uses the Gumbel-max form
argmax(logp - log E), E ~ Exp(1), which draws from softmax(logp) with no host round trip.

Prompts are left-padded to one length P: row b's tokens sit at cache slots [P - len_b, P), its
RoPE positions start at 0 at its first real token, and a per-row key mask hides its padding.
Decoded tokens go to slot P + step for every row, so one scalar slot index serves the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.backends.sampling import filtered_logprobs
from asyncgrpo_trainer.models.network import CausalLM, DecoderLayer


@dataclass(frozen=True)
class DecodeParams:
    """The sampled distribution: same meaning as `sampling.SamplingParams` (temperature 0 = greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None


@dataclass(frozen=True)
class DecodeOutput:
    """Tokens (B, max_new) and their log-probs, padded past each row's end; lengths count EOS."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor

    def to_lists(self) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Ragged per-row lists, the shape `sampling.Sampled` uses (one device->host copy)."""
        toks, lps = self.tokens.cpu(), self.logprobs.float().cpu()
        lens = self.lengths.cpu().tolist()
        fin = self.finished.cpu().tolist()
        return (
            [toks[i, :n].tolist() for i, n in enumerate(lens)],
            [lps[i, :n].tolist() for i, n in enumerate(lens)],
            [bool(f) for f in fin],
        )


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(var + eps)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    if cos is None or sin is None:  # learned absolute positions: nothing to rotate
        return x
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@dataclass
class _LayerWeights:
    """One layer's tensors as the decode step uses them; q/k/v and gate/up packed (see the module
    docstring), the rest the model's own parameters. Biases and q/k norms are None where the
    family has none."""

    ln1: torch.Tensor
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    ln2: torch.Tensor
    w_gu: torch.Tensor
    b_gu: torch.Tensor | None
    w_down: torch.Tensor
    b_down: torch.Tensor | None
    eps: float

    def post(self) -> dict[str, Any]:
        """The keyword arguments of `_post_attention`."""
        return {
            "w_o": self.w_o,
            "b_o": self.b_o,
            "ln2": self.ln2,
            "w_gu": self.w_gu,
            "b_gu": self.b_gu,
            "w_down": self.w_down,
            "b_down": self.b_down,
            "eps": self.eps,
        }


def _packed(layer: DecoderLayer) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor]]:
    """The tensors packed into w_qkv, b_qkv (None without biases) and w_gu, in packing order."""
    att, mlp = layer.self_attn, layer.mlp
    weights: list[torch.Tensor] = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
    biases: list[torch.Tensor] | None = None
    if att.q_proj.bias is not None and att.k_proj.bias is not None and att.v_proj.bias is not None:
        biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
    return weights, biases, [mlp.gate_proj.weight, mlp.up_proj.weight]


def _pre_attention(
    x: torch.Tensor,
    *,
    ln1: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Norm, packed q/k/v projection, q/k norm and RoPE for x (..., C) -> (..., H*, D)."""
    d = head_dim
    h = _rms(x, ln1, eps)
    qkv = F.linear(h, w_qkv, b_qkv)
    lead = qkv.shape[:-1]
    q = qkv[..., : heads * d].view(*lead, heads, d)
    k = qkv[..., heads * d : (heads + kv_heads) * d].view(*lead, kv_heads, d)
    v = qkv[..., (heads + kv_heads) * d :].view(*lead, kv_heads, d)
    if q_norm is not None and k_norm is not None:
        q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
    return _rope(q, cos, sin), _rope(k, cos, sin), v


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, key_bias: torch.Tensor
) -> torch.Tensor:
    """q (B, H, D) over caches (B, H_kv, S, D) with key_bias (B, 1, 1, S) -> (B, H*D).

    GQA without repeating the cache: query head g*rep + r reads kv head g (= repeat_interleave).
    """
    b, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    qg = q.view(b, kv_heads, heads // kv_heads, d)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * (1.0 / math.sqrt(d)) + key_bias
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v_cache).reshape(b, heads * d)


def _post_attention(
    x: torch.Tensor,
    attn: torch.Tensor,
    *,
    w_o: torch.Tensor,
    b_o: torch.Tensor | None,
    ln2: torch.Tensor,
    w_gu: torch.Tensor,
    b_gu: torch.Tensor | None,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Output projection, residual, norm and the SwiGLU MLP (packed gate/up)."""
    x = x + F.linear(attn, w_o, b_o)
    h = _rms(x, ln2, eps)
    gu = F.linear(h, w_gu, b_gu)
    inter = gu.shape[-1] // 2
    return x + F.linear(F.silu(gu[..., :inter]) * gu[..., inter:], w_down, b_down)


@dataclass
class _BatchState:
    """Static buffers of one batch size: what the captured graph reads and writes."""

    batch: int
    cur_tok: torch.Tensor  # (B,) long: the token fed to the next forward
    logits: torch.Tensor  # (B, V): logits of the next token
    pad: torch.Tensor  # (B,) long: left padding of each prompt
    slot: torch.Tensor  # (1,) long: cache slot the next forward writes
    step: torch.Tensor  # (1,) long: index of the next sampled token
    done: torch.Tensor  # (B,) bool
    lengths: torch.Tensor  # (B,) long
    out_tok: torch.Tensor  # (B, max_new) long
    out_lp: torch.Tensor  # (B, max_new) float32
    graph: Any = None  # torch.cuda.CUDAGraph once captured


class StaticDecoder:
    """Batched sampling with per-token log-probs from a `CausalLM`; see the module docstring.

    One decoder serves one set of `DecodeParams` (they are baked into the captured graph) and
    batches up to `max_batch` rows; a CUDA graph is captured lazily per batch size. On CPU (or with
    `use_cuda_graph=False`) the same step runs eagerly, which is what the CPU tests compare.
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        max_batch: int,
        max_prompt_len: int,
        max_new_tokens: int,
        params: DecodeParams,
        eos_ids: tuple[int, ...],
        pad_id: int = 0,
        use_cuda_graph: bool | None = None,
        compile_layer: bool = False,
        sync_every: int = 32,
    ) -> None:
        cfg = model.cfg
        if max_prompt_len + max_new_tokens > cfg.max_positions:
            raise ValueError(
                f"prompt {max_prompt_len} + new {max_new_tokens} exceeds max_positions {cfg.max_positions}"
            )
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.model = model
        self.cfg = cfg
        self.params = params
        self._eos = torch.tensor(eos_ids, dtype=torch.long) if eos_ids else None
        self.pad_id = pad_id
        self.max_batch = max_batch
        self.max_prompt_len = max_prompt_len
        self.max_new_tokens = max_new_tokens
        self.sync_every = max(1, sync_every)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.use_cuda_graph = self.device.type == "cuda" if use_cuda_graph is None else use_cuda_graph
        if self.use_cuda_graph and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.head_dim = cfg.head_dim
        if self._eos is not None:
            self._eos = self._eos.to(self.device)
        self.seq_len = max_prompt_len + max_new_tokens
        shape = (cfg.num_layers, max_batch, cfg.num_kv_heads, self.seq_len, self.head_dim)
        # Zero-filled so masked slots never hold NaN/inf (0 x NaN would leak through the softmax).
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._positions = torch.arange(self.seq_len, device=self.device)
        self._layers: list[_LayerWeights] = []
        self.refresh_weights()
        self._pre: Any = _pre_attention
        self._attend: Any = _attend
        self._post: Any = _post_attention
        if compile_layer:
            # One static graph per captured batch size (powers of two up to max_batch); past
            # dynamo's default of 8 entries a function would silently run eagerly.
            sizes = max_batch.bit_length() + 1
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, sizes)
            # Pure functions with the weights as arguments, so each compiles once for all layers
            # (same code, same shapes). The cache writes stay outside: a compiled in-place write
            # into a view of the cache could be lowered as a copy of the whole slice.
            self._pre = torch.compile(_pre_attention, dynamic=False, fullgraph=True)
            self._attend = torch.compile(_attend, dynamic=False, fullgraph=True)
            self._post = torch.compile(_post_attention, dynamic=False, fullgraph=True)
        self._states: dict[int, _BatchState] = {}
        self._pool: Any = None

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def refresh_weights(self) -> None:
        """(Re)pack q/k/v and gate/up from the model; in place, so captured graphs stay valid."""
        layers = [cast(DecoderLayer, layer) for layer in self.model.layers]
        if not self._layers:
            for layer in layers:
                att, mlp = layer.self_attn, layer.mlp
                qkv_w, qkv_b, gu_w = _packed(layer)
                gu_b: list[torch.Tensor] | None = None
                if mlp.gate_proj.bias is not None and mlp.up_proj.bias is not None:
                    gu_b = [mlp.gate_proj.bias, mlp.up_proj.bias]
                self._layers.append(
                    _LayerWeights(
                        ln1=layer.input_layernorm.weight,
                        w_qkv=torch.cat(qkv_w),
                        b_qkv=torch.cat(qkv_b) if qkv_b is not None else None,
                        q_norm=att.q_norm.weight if att.q_norm is not None else None,
                        k_norm=att.k_norm.weight if att.k_norm is not None else None,
                        w_o=att.o_proj.weight,
                        b_o=att.o_proj.bias,
                        ln2=layer.post_attention_layernorm.weight,
                        w_gu=torch.cat(gu_w),
                        b_gu=torch.cat(gu_b) if gu_b is not None else None,
                        w_down=mlp.down_proj.weight,
                        b_down=mlp.down_proj.bias,
                        eps=float(layer.input_layernorm.eps),
                    )
                )
            return
        for lw, layer in zip(self._layers, layers, strict=True):
            mlp = layer.mlp
            qkv_w, qkv_b, gu_w = _packed(layer)
            torch.cat(qkv_w, out=lw.w_qkv)
            if qkv_b is not None and lw.b_qkv is not None:
                torch.cat(qkv_b, out=lw.b_qkv)
            torch.cat(gu_w, out=lw.w_gu)
            if lw.b_gu is not None and mlp.gate_proj.bias is not None and mlp.up_proj.bias is not None:
                torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias], out=lw.b_gu)

    # ------------------------------------------------------------------ state
    def _state(self, batch: int) -> _BatchState:
        st = self._states.get(batch)
        if st is None:
            dev = self.device
            st = _BatchState(
                batch=batch,
                cur_tok=torch.zeros(batch, dtype=torch.long, device=dev),
                logits=torch.zeros(batch, self.cfg.vocab_size, dtype=self.dtype, device=dev),
                pad=torch.zeros(batch, dtype=torch.long, device=dev),
                slot=torch.zeros(1, dtype=torch.long, device=dev),
                step=torch.zeros(1, dtype=torch.long, device=dev),
                done=torch.zeros(batch, dtype=torch.bool, device=dev),
                lengths=torch.zeros(batch, dtype=torch.long, device=dev),
                out_tok=torch.zeros(batch, self.max_new_tokens, dtype=torch.long, device=dev),
                out_lp=torch.zeros(batch, self.max_new_tokens, dtype=torch.float32, device=dev),
            )
            self._states[batch] = st
        return st

    # ------------------------------------------------------------------ the step
    def _sample_record(self, st: _BatchState) -> None:
        """Sample a token per row from st.logits and record it; no host sync."""
        logp = filtered_logprobs(st.logits, self.params)
        if self.params.temperature == 0:
            tok = logp.argmax(-1)
        else:
            noise = torch.empty_like(logp).exponential_()
            tok = (logp - noise.log()).argmax(-1)
        chosen = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        alive = ~st.done
        tok = torch.where(alive, tok, torch.full_like(tok, self.pad_id))
        chosen = torch.where(alive, chosen, torch.zeros_like(chosen))
        st.out_tok.index_copy_(1, st.step, tok.unsqueeze(1))
        st.out_lp.index_copy_(1, st.step, chosen.unsqueeze(1))
        st.lengths.add_(alive.long())
        if self._eos is not None:
            st.done.logical_or_(alive & torch.isin(tok, self._eos))
        st.cur_tok.copy_(tok)
        st.step.add_(1)

    def _positions_of(self, pos: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """cos/sin at `pos` in the model's dtype, with a head axis; None, None for learned positions."""
        rope = self.model.model.rotary(pos)
        if rope is None:
            return None, None
        return rope[0].to(self.dtype).unsqueeze(-2), rope[1].to(self.dtype).unsqueeze(-2)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model.lm_head(self.model.model.norm(x))
        return logits

    def _forward_one(self, st: _BatchState) -> None:
        """Run cur_tok through the model at st.slot; writes st.logits and the caches."""
        b = st.batch
        pos = (st.slot - st.pad).clamp_(min=0)
        x = self.model.model.embed(st.cur_tok, pos)
        cos, sin = self._positions_of(pos)
        valid = (self._positions >= st.pad.unsqueeze(1)) & (self._positions <= st.slot)
        key_bias = torch.zeros(valid.shape, dtype=torch.float32, device=self.device)
        key_bias = key_bias.masked_fill(~valid, float("-inf")).view(b, 1, 1, self.seq_len)
        for i, lw in enumerate(self._layers):
            kc, vc = self.k_cache[i, :b], self.v_cache[i, :b]
            q, k, v = self._pre(x, cos=cos, sin=sin, **self._pre_args(lw))
            kc.index_copy_(2, st.slot, k.unsqueeze(2))
            vc.index_copy_(2, st.slot, v.unsqueeze(2))
            attn = self._attend(q, kc, vc, key_bias)
            x = self._post(x, attn, **lw.post())
        st.logits.copy_(self._head(x))
        st.slot.add_(1)

    def _pre_args(self, lw: _LayerWeights) -> dict[str, Any]:
        """The keyword arguments of `_pre_attention` besides x and the rotary tables."""
        return {
            "ln1": lw.ln1,
            "w_qkv": lw.w_qkv,
            "b_qkv": lw.b_qkv,
            "q_norm": lw.q_norm,
            "k_norm": lw.k_norm,
            "eps": lw.eps,
            "heads": self.cfg.num_heads,
            "kv_heads": self.cfg.num_kv_heads,
            "head_dim": self.head_dim,
        }

    @torch.no_grad()
    def _step(self, st: _BatchState) -> None:
        self._sample_record(st)
        self._forward_one(st)

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()  # else copy_ into the static buffers would chain them to an autograd graph
    def _prefill(self, st: _BatchState, ids: torch.Tensor, pad: torch.Tensor) -> None:
        """Fill cache slots [0, P) and st.logits from left-padded prompts (B, P); flash when unpadded."""
        b, t = ids.shape
        heads, kv_heads = self.cfg.num_heads, self.cfg.num_kv_heads
        pos = (torch.arange(t, device=self.device).unsqueeze(0) - pad.unsqueeze(1)).clamp(min=0)
        cos, sin = self._positions_of(pos)
        padded = bool((pad > 0).any())
        mask = None
        if padded:
            ar = torch.arange(t, device=self.device)
            causal = ar.unsqueeze(1) >= ar.unsqueeze(0)
            key_ok = ar.unsqueeze(0) >= pad.view(b, 1, 1)
            # A padding query sees only itself, so it stays finite (its output is never used).
            mask = (causal & key_ok) | torch.eye(t, dtype=torch.bool, device=self.device)
            mask = mask.unsqueeze(1)
        x = self.model.model.embed(ids, pos)
        for i, lw in enumerate(self._layers):
            q, k, v = _pre_attention(x, cos=cos, sin=sin, **self._pre_args(lw))
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            self.k_cache[i, :b, :, :t].copy_(k)
            self.v_cache[i, :b, :, :t].copy_(v)
            attn = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=not padded, enable_gqa=kv_heads != heads
            )
            attn = attn.transpose(1, 2).reshape(b, t, heads * self.head_dim)
            x = _post_attention(x, attn, **lw.post())
        st.logits.copy_(self._head(x[:, -1]))
        st.pad.copy_(pad)
        st.slot.fill_(t)
        st.step.zero_()
        st.done.zero_()
        st.lengths.zero_()
        st.out_tok.fill_(self.pad_id)
        st.out_lp.zero_()

    # ------------------------------------------------------------------ capture
    @torch.no_grad()
    def _capture(self, st: _BatchState) -> None:
        """Warm up on a side stream (compiles, cuBLAS handles), then capture one step."""

        def reset() -> None:
            st.pad.zero_()
            st.slot.zero_()
            st.step.zero_()
            st.done.zero_()

        stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                reset()
                self._step(st)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._step(st)
        self._pool = graph.pool()
        st.graph = graph
        # Warm-up wrote garbage into the caches; harmless: prefill overwrites slots [0, P) and
        # decode masks every slot it has not written yet.

    # ------------------------------------------------------------------ public
    def graph_batch(self, rows: int) -> int:
        """The batch size `rows` prompts decode at: with CUDA graphs the next power of two (capped
        at max_batch), so a few captured graphs serve every batch; without graphs `rows` itself."""
        if not self.use_cuda_graph:
            return rows
        return min(1 << max(rows - 1, 0).bit_length(), self.max_batch)

    @torch.no_grad()
    def start(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
    ) -> Decoding:
        """Prefill the prompts (ragged lists, or an unpadded (B, P) tensor) and return the decoding.

        `seed` reseeds the device's default generator (CUDA graphs draw from it); greedy decoding
        ignores it. The batch is padded to `graph_batch(B)` rows that are ended from the start (they
        neither stop the early exit nor appear in the output). One decoding at a time: a second
        `start` overwrites the cache the first one reads.
        """
        ids, pad = self._pack(prompts)
        rows = ids.shape[0]
        if rows > self.max_batch:
            raise ValueError(f"batch {rows} exceeds max_batch {self.max_batch}")
        n_new = self.max_new_tokens if max_new_tokens is None else min(max_new_tokens, self.max_new_tokens)
        if n_new < 1:
            raise ValueError("max_new_tokens must be at least 1")
        b = self.graph_batch(rows)
        if b > rows:
            fill = torch.full((b - rows, ids.shape[1]), self.pad_id, dtype=torch.long, device=self.device)
            ids = torch.cat([ids, fill])
            pad = torch.cat([pad, torch.full((b - rows,), ids.shape[1] - 1, device=self.device)])
        st = self._state(b)
        if self.use_cuda_graph and st.graph is None:
            self._capture(st)
        if seed is not None:
            if self.device.type == "cuda":
                torch.cuda.manual_seed(seed)
            else:
                torch.manual_seed(seed)
        self._prefill(st, ids, pad)
        st.done[rows:] = True
        return Decoding(self, st, rows, n_new)

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
    ) -> DecodeOutput:
        """Decode up to max_new_tokens for each prompt in one go (`start`, then every chunk)."""
        decoding = self.start(prompts, seed=seed, max_new_tokens=max_new_tokens)
        while not decoding.advance():
            pass
        return decoding.output()

    def _pack(self, prompts: Sequence[Sequence[int]] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(prompts, torch.Tensor):
            ids = prompts.to(self.device, torch.long)
            pad = torch.zeros(ids.shape[0], dtype=torch.long, device=self.device)
        else:
            rows = [list(p) for p in prompts]
            if not rows or min(len(r) for r in rows) == 0:
                raise ValueError("every prompt needs at least one token")
            t = max(len(r) for r in rows)
            ids_cpu = torch.full((len(rows), t), self.pad_id, dtype=torch.long)
            for i, r in enumerate(rows):
                ids_cpu[i, t - len(r) :] = torch.tensor(r, dtype=torch.long)
            pads = torch.tensor([t - len(r) for r in rows], dtype=torch.long)
            ids, pad = ids_cpu.to(self.device), pads.to(self.device)
        if ids.shape[1] > self.max_prompt_len:
            raise ValueError(f"prompt of {ids.shape[1]} tokens exceeds max_prompt_len {self.max_prompt_len}")
        return ids, pad


class Decoding:
    """One batch being decoded by a `StaticDecoder`, in chunks of `sync_every` steps.

    Why chunks: each chunk ends with the one device->host read, "has every row ended?", so the
    host learns between chunks whether to stop early, and a caller can do other work there, e.g.
    overwrite the model's parameters in place and `refresh_weights()`; the following steps then
    use the new weights with the KV already cached.

    `advance()` runs one chunk and waits for it. An asynchronous caller splits that into
    `launch()` (queue the chunk and its end check, return at once), `ready()` (has the device got
    there?) and `collect()`, so its host thread is free while the device decodes: on CUDA
    everything is queued on the current stream, so work the caller queues after `launch()` (a
    weight copy) runs after the chunk and before the next one.
    """

    def __init__(self, decoder: StaticDecoder, st: _BatchState, rows: int, n_new: int) -> None:
        self._dec, self._st, self._rows = decoder, st, rows
        self._last = n_new - 1  # steps with a forward; the last token needs none
        self._steps = 0
        self.finished = False
        cuda = decoder.device.type == "cuda"
        self._all_ended = torch.zeros(1, dtype=torch.bool, pin_memory=cuda)
        self._chunk_done: torch.cuda.Event | None = torch.cuda.Event() if cuda else None  # type: ignore[no-untyped-call]
        self._final_chunk = False

    @torch.no_grad()
    def launch(self) -> None:
        """Queue up to `sync_every` decode steps and the end-of-batch check; does not wait."""
        if self.finished:
            return
        dec, st = self._dec, self._st
        end = min(self._steps + dec.sync_every, self._last)
        while self._steps < end:
            if st.graph is not None:
                st.graph.replay()
            else:
                dec._step(st)
            self._steps += 1
        self._final_chunk = self._steps == self._last
        if self._final_chunk:
            dec._sample_record(st)
        else:
            self._all_ended.copy_(st.done.all().view(1), non_blocking=True)
        if self._chunk_done is not None:
            self._chunk_done.record()

    def ready(self) -> bool:
        """Has the device finished the launched chunk (always, off CUDA)?"""
        return self._chunk_done is None or self._chunk_done.query()  # type: ignore[no-untyped-call]

    def collect(self) -> bool:
        """After `ready()`: True once every row has ended or the budget is spent."""
        if self._final_chunk or bool(self._all_ended[0]):
            self.finished = True
        return self.finished

    def advance(self) -> bool:
        """Run up to `sync_every` decode steps; True once every row has ended or the budget is spent."""
        self.launch()
        if self._chunk_done is not None:
            self._chunk_done.synchronize()
        return self.collect()

    def output(self) -> DecodeOutput:
        """Tokens and log-probs of the real rows (the padding rows are dropped); call once finished."""
        if not self.finished:
            raise RuntimeError("the decoding has not finished")
        st, rows = self._st, self._rows
        used = int(st.step.item())
        return DecodeOutput(
            tokens=st.out_tok[:rows, :used].clone(),
            logprobs=st.out_lp[:rows, :used].clone(),
            lengths=st.lengths[:rows].clone(),
            finished=st.done[:rows].clone(),
        )
