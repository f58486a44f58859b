"""The tiny Qwen2-shaped decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) in plain torch.

Built from `model.tiny` with random weights, so no checkpoint is downloaded. The forward takes an
optional key/value cache so generation decodes one token per step instead of re-running the prefix;
training runs the same forward without a cache. Shapes: B batch, T tokens, H heads, D head width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

KVCache = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each (B, H_kv, T_past, D)."""


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_tables(cfg: TinyConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_positions, D) for rotary position embeddings."""
    dim = cfg.hidden_size // cfg.num_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    freqs = torch.outer(torch.arange(cfg.max_positions, device=device).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated by cos/sin (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.h, self.h_kv = cfg.num_heads, cfg.num_kv_heads
        self.d = cfg.hidden_size // cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=True)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.h_kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.h_kv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        rep = self.h // self.h_kv
        kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        # With a cache the new queries sit after every cached key, so a causal mask is needed only
        # among the new tokens themselves (prefill); a single decode query sees everything.
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=past is None and t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d)), (k, v)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + attn
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), kv


class TinyCausalLM(nn.Module):
    """Decoder-only LM; `forward(ids, past)` returns logits (B, T, V) and the extended cache."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, torch.device("cpu"))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor, past: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        start = 0 if past is None else past[0][0].shape[2]
        t = ids.shape[1]
        if start + t > self.cfg.max_positions:
            raise ValueError(
                f"sequence of {start + t} tokens exceeds maxSequenceLength {self.cfg.max_positions}"
            )
        cos = self.rope_cos[start : start + t]  # type: ignore[index]
        sin = self.rope_sin[start : start + t]  # type: ignore[index]
        x = self.embed_tokens(ids)
        cache: KVCache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, None if past is None else past[i])
            cache.append(kv)
        return self.lm_head(self.norm(x)), cache


def tiny_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int | None,
    max_positions: int,
) -> TinyConfig:
    """A TinyConfig with the API's defaults applied (intermediate = 4 x hidden)."""
    return TinyConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_positions=max_positions,
    )


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
