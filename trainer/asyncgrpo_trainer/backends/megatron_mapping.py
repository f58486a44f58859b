"""Weight names and layouts between Megatron-core's `GPTModel` and `CausalLM` (pure torch).

The generation engines run `CausalLM`, so the Megatron policy must hand them its weights under
CausalLM's names, and must start from the same seeded weights they start from. Three layout
differences matter:

- attention: Megatron fuses q, k and v into one `linear_qkv` whose rows are grouped per key/value
  head ("query group"): for each group g, the group's query heads, then k_g, then v_g. Splitting
  it by plain thirds would scramble heads silently, so it goes through `_split_qkv`/`_fuse_qkv`.
- MLP: `linear_fc1` is [gate; up] (SwiGLU). Under tensor parallelism each rank holds
  [gate shard; up shard], so gathering fc1 by plain concatenation would interleave the halves.
- vocabulary: Megatron's vocab-parallel embedding and output layer need the vocabulary to divide
  by the tensor-parallel size; the extra rows are zeros here and are never a target. The policy
  masks their logits, so they never carry probability either.

"Full" below means Megatron's names with tensor-parallel size 1; `shard`/`unshard` convert between
a full tensor and one rank's piece. Layer norms are replicated on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from asyncgrpo_trainer.models.config import ModelConfig

_COLUMN = (
    "embedding.word_embeddings.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "mlp.linear_fc1.weight",
    "output_layer.weight",
)
"""Split along dim 0 (output features / vocabulary rows) under tensor parallelism."""
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
"""Split along dim 1 (input features)."""


def padded_vocab_size(vocab_size: int, tensor_parallel_size: int) -> int:
    """The smallest multiple of the tensor-parallel size that holds the vocabulary."""
    return -(-vocab_size // tensor_parallel_size) * tensor_parallel_size


def _split_qkv(w: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's grouped qkv rows (weight (rows, H) or bias (rows,)) -> q, k, v as CausalLM has them."""
    d = cfg.head_dim
    groups, per_group = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    grouped = w.reshape(groups, per_group + 2, d, *w.shape[1:])
    q = grouped[:, :per_group].reshape(cfg.num_heads * d, *w.shape[1:])
    k = grouped[:, per_group].reshape(groups * d, *w.shape[1:])
    v = grouped[:, per_group + 1].reshape(groups * d, *w.shape[1:])
    return q, k, v


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Inverse of `_split_qkv`."""
    d = cfg.head_dim
    groups, per_group = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(groups, per_group, d, *rest),
            k.reshape(groups, 1, d, *rest),
            v.reshape(groups, 1, d, *rest),
        ],
        dim=1,
    )
    return fused.reshape(-1, *rest)


def megatron_to_tiny(full: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full Megatron parameters -> a CausalLM state dict (padded vocabulary rows dropped)."""
    v, inter = cfg.vocab_size, cfg.intermediate_size
    out = {
        "model.embed_tokens.weight": full["embedding.word_embeddings.weight"][:v],
        "model.norm.weight": full["decoder.final_layernorm.weight"],
        "lm_head.weight": full["output_layer.weight"][:v],
    }
    for i in range(cfg.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv_w = _split_qkv(full[src + "self_attention.linear_qkv.weight"], cfg)
        qkv_b = _split_qkv(full[src + "self_attention.linear_qkv.bias"], cfg)
        for proj, w, b in zip(("q_proj", "k_proj", "v_proj"), qkv_w, qkv_b, strict=True):
            out[f"{dst}self_attn.{proj}.weight"] = w
            out[f"{dst}self_attn.{proj}.bias"] = b
        fc1 = full[src + "mlp.linear_fc1.weight"]
        out |= {
            dst + "input_layernorm.weight": full[src + "input_layernorm.weight"],
            dst + "self_attn.o_proj.weight": full[src + "self_attention.linear_proj.weight"],
            dst + "post_attention_layernorm.weight": full[src + "pre_mlp_layernorm.weight"],
            dst + "mlp.gate_proj.weight": fc1[:inter],
            dst + "mlp.up_proj.weight": fc1[inter:],
            dst + "mlp.down_proj.weight": full[src + "mlp.linear_fc2.weight"],
        }
    return {k: t.contiguous() for k, t in out.items()}


def tiny_to_megatron(
    tiny: Mapping[str, torch.Tensor], cfg: ModelConfig, *, padded_vocab: int
) -> dict[str, torch.Tensor]:
    """A CausalLM state dict -> full Megatron parameters (vocabulary zero-padded to `padded_vocab`)."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])])

    out = {
        "embedding.word_embeddings.weight": pad(tiny["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": tiny["model.norm.weight"],
        "output_layer.weight": pad(tiny["lm_head.weight"]),
    }
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = src + "self_attn."

        def qkv(kind: str, attn: str = attn) -> torch.Tensor:
            return _fuse_qkv(
                tiny[f"{attn}q_proj.{kind}"], tiny[f"{attn}k_proj.{kind}"], tiny[f"{attn}v_proj.{kind}"], cfg
            )

        out |= {
            dst + "input_layernorm.weight": tiny[src + "input_layernorm.weight"],
            dst + "self_attention.linear_qkv.weight": qkv("weight"),
            dst + "self_attention.linear_qkv.bias": qkv("bias"),
            dst + "self_attention.linear_proj.weight": tiny[attn + "o_proj.weight"],
            dst + "pre_mlp_layernorm.weight": tiny[src + "post_attention_layernorm.weight"],
            dst + "mlp.linear_fc1.weight": torch.cat(
                [tiny[src + "mlp.gate_proj.weight"], tiny[src + "mlp.up_proj.weight"]]
            ),
            dst + "mlp.linear_fc2.weight": tiny[src + "mlp.down_proj.weight"],
        }
    return {k: t.contiguous() for k, t in out.items()}


def _split_dim(name: str) -> int | None:
    if name.endswith(_COLUMN):
        return 0
    if name.endswith(_ROW):
        return 1
    return None


def is_split(name: str) -> bool:
    """Whether the parameter `name` is split over the tensor-parallel ranks (else replicated)."""
    return _split_dim(name) is not None


def shard(name: str, full: torch.Tensor, *, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank `rank`'s piece of the full parameter `name`."""
    dim = _split_dim(name)
    if dim is None or size == 1:
        return full
    if name.endswith("mlp.linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    return full.chunk(size, dim=dim)[rank]


def unshard(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full parameter `name` from every tensor-parallel rank's piece, in rank order."""
    dim = _split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith("mlp.linear_fc1.weight"):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(list(shards), dim=dim)
