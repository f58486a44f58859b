"""The decoder-only network every torch backend runs: Qwen2/Qwen2.5, Qwen3, Llama 3 and the tiny model.

One module covers the supported families (`config.ModelConfig` says which parts a family has: q/k/v
and o biases, per-head q/k RMSNorm, an MLP bias, tied embeddings, RoPE or learned absolute
positions). Parameter names are the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`, ...), so a checkpoint loads without a mapping table, a trained model saves as a
Hugging Face checkpoint as it is, and vLLM's `load_weights` takes a refit under the same names.
With tied embeddings `lm_head.weight` is the embedding's Parameter: `named_parameters()` lists it
once (under the embedding's name), the checkpoint files omit it, as transformers does.

Numerics follow transformers (RMSNorm in fp32 then cast, cos/sin in fp32 cast to the activations'
dtype, attention scale 1/sqrt(head_dim)), which is what the parity tests check to 1e-4 in fp32.
The forward takes an optional key/value cache so generation decodes one token per step instead of
re-running the prefix; training runs the same forward without a cache. Shapes: B batch, T tokens,
H heads, D head width.

Activation checkpointing (`CausalLM.checkpoint_activations`, policy.activationCheckpointing): a
layer then keeps only its input for the backward pass and recomputes the rest there
(torch.utils.checkpoint, non-reentrant), which trades one more forward per layer for the
activations of all but one layer at a time. The recomputation runs the same operations, so the
gradients are those without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

from asyncgrpo_trainer.models.config import ModelConfig

KVCache = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each (B, H_kv, T_past, D)."""


@dataclass(frozen=True)
class PackedRows:
    """Rows laid end to end in one sequence (B = 1), each of `lengths[i]` tokens.

    Each row restarts its positions at 0 and attends only to its own earlier tokens (a
    block-diagonal causal mask), so a row's outputs are those it gets alone or right-padded in a
    batch, without computing any padding (`policy.maxTokensPerMicroBatch`). The mask is dense
    (T, T) booleans for SDPA: the reference on CPU, and on CUDA the memory-efficient kernel.
    """

    lengths: tuple[int, ...]

    def positions(self, device: torch.device) -> torch.Tensor:
        """(T,) each token's position within its row."""
        return torch.cat([torch.arange(n, device=device) for n in self.lengths])

    def attention_mask(self, device: torch.device) -> torch.Tensor:
        """(T, T) True where the query (row) may attend to the key (column)."""
        rows = torch.repeat_interleave(
            torch.arange(len(self.lengths), device=device), torch.tensor(self.lengths, device=device)
        )
        same_row = rows[:, None] == rows[None, :]
        return same_row & torch.ones_like(same_row).tril()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def rope_tables(cfg: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_positions, D) in fp32 for the config's rotary frequencies."""
    inv = torch.tensor(cfg.rope_inv_freq, dtype=torch.float32, device=device)
    positions = torch.arange(cfg.max_positions, device=device, dtype=torch.int64).float()
    freqs = positions[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * cfg.rope_attention_scaling, emb.sin() * cfg.rope_attention_scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., D) rotated by cos/sin broadcastable to it (fp32 tables are cast to x's dtype)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.h, self.h_kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def project(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D), k and v (B, H_kv, T, D) of x (B, T, C): projection, q/k norm, rotation."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d)
        k = self.k_proj(x).view(b, t, self.h_kv, self.d)
        v = self.v_proj(x).view(b, t, self.h_kv, self.d).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q, k, v = self.project(x, rope)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        # With a cache the new queries sit after every cached key, so a causal mask is needed only
        # among the new tokens themselves (prefill); a single decode query sees everything. Packed
        # rows bring their own mask (`PackedRows.attention_mask`), causal within each row.
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and past is None and t > 1,
            enable_gqa=self.h != self.h_kv,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    recompute = False
    """Activation checkpointing: with gradients on, keep only the input for the backward pass and
    recompute the rest there (set by `CausalLM.checkpoint_activations`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        # Inside forward, so that a compiled block traces the checkpoint (and recomputes within its
        # own graph), and under FSDP the recomputation uses the weights gathered for the backward.
        if self.recompute and torch.is_grad_enabled():
            out: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] = checkpoint(
                self._forward, x, rope, past, mask, use_reentrant=False
            )
            return out
        return self._forward(x, rope, past, mask)

    def _forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn, kv = self.self_attn(self.input_layernorm(x), rope, past, mask)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Decoder(nn.Module):
    """Embeddings, the layers and the final norm (Hugging Face's `model.` prefix)."""

    rope_cos: torch.Tensor | None
    rope_sin: torch.Tensor | None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_positions = (
            nn.Embedding(cfg.max_positions, cfg.hidden_size) if cfg.position_embedding == "learned" else None
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        self.init_buffers(torch.device("cpu"))

    def init_buffers(self, device: torch.device) -> None:
        """(Re)compute the rotary tables on `device` (after a model built on the meta device)."""
        if self.cfg.position_embedding != "rope":
            return
        cos, sin = rope_tables(self.cfg, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token (plus learned position) embeddings of ids at `positions` (broadcastable to ids)."""
        x: torch.Tensor = self.embed_tokens(ids)
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions)
        return x

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """fp32 cos/sin (positions..., D) at `positions`; None with learned positions."""
        if self.rope_cos is None or self.rope_sin is None:
            return None
        return self.rope_cos[positions], self.rope_sin[positions]

    def forward(self, ids: torch.Tensor, past: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """Hidden states (B, T, C) after the final norm, and the extended cache."""
        x, cache = self.unnormed(ids, past)
        return self.norm(x), cache

    def unnormed(
        self, ids: torch.Tensor, past: KVCache | None = None, packed: PackedRows | None = None
    ) -> tuple[torch.Tensor, KVCache]:
        """The forward without the final norm (the compiled training head fuses the norm into it).
        With `packed`, ids (1, T) are those rows end to end (no cache)."""
        mask = None
        if packed is not None:
            longest = max(packed.lengths, default=0)
            if longest > self.cfg.max_positions:
                raise ValueError(
                    f"row of {longest} tokens exceeds maxSequenceLength {self.cfg.max_positions}"
                )
            positions, mask = packed.positions(ids.device), packed.attention_mask(ids.device)
        else:
            start = 0 if past is None else past[0][0].shape[2]
            t = ids.shape[1]
            if start + t > self.cfg.max_positions:
                raise ValueError(
                    f"sequence of {start + t} tokens exceeds maxSequenceLength {self.cfg.max_positions}"
                )
            positions = torch.arange(start, start + t, device=ids.device)
        x = self.embed(ids, positions)
        rope = self.rotary(positions)
        cache: KVCache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, rope, None if past is None else past[i], mask)
            cache.append(kv)
        return x, cache


class CausalLM(nn.Module):
    """Decoder-only LM; `forward(ids, past)` returns logits (B, T, V) and the extended cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_random(self) -> None:
        """The tiny model's initial weights (normal(0, 0.02) matrices, zero biases, unit norms)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def checkpoint_activations(self) -> None:
        """Recompute each decoder layer's activations in the backward pass (see the module
        docstring); forwards without gradients are unchanged."""
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.recompute = True

    def forward(self, ids: torch.Tensor, past: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        hidden, cache = self.model(ids, past)
        return self.lm_head(hidden), cache

    def target_logprobs(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        head: Callable[..., torch.Tensor],
        *,
        temperature: float,
        packed: PackedRows | None = None,
    ) -> torch.Tensor:
        """log p(targets | ids) per position (B, T), through `head` (`cuda_train.head_logprobs`,
        compiled or not: it takes the unnormed hidden states, the final norm's and the output
        layer's weights). One call touches every weight, like `forward`, so FSDP can treat it as a
        forward (`fsdp.shard` registers it)."""
        x, _ = self.model.unnormed(ids, packed=packed)
        return head(
            x,
            targets,
            norm_w=self.model.norm.weight,
            eps=float(self.model.norm.eps),
            lm_w=self.lm_head.weight,
            temperature=temperature,
        )


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
