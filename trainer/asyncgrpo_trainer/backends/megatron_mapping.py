"""Weight names and layouts between Megatron-core's `GPTModel` and `CausalLM` (pure torch).

The generation engines run `CausalLM` (Hugging Face names), so the Megatron policy must hand them
its weights under those names, and must start from the same weights they start from (a seeded tiny
model or a pretrained checkpoint). What the mapping covers, per `ModelConfig`:

- attention: Megatron fuses q, k and v (weights, and biases when the model has them) into one
  `linear_qkv` whose rows are grouped per key/value head ("query group"): for each group g, the
  group's query heads, then k_g, then v_g. Splitting it by plain thirds would scramble heads
  silently, so it goes through `_split_qkv`/`_fuse_qkv`. Qwen3's per-head q/k RMSNorms are
  `self_attention.q_layernorm`/`k_layernorm` (one head_dim weight each, replicated); an o_proj
  bias (Llama's attention_bias) is `linear_proj.bias`, replicated, added once after the reduce.
- MLP: `linear_fc1` is [gate; up] (SwiGLU), its bias too (Llama's mlp_bias). Under tensor
  parallelism each rank holds [gate shard; up shard], so gathering fc1 by plain concatenation
  would interleave the halves.
- embeddings: learned absolute positions are `embedding.position_embeddings` (replicated). With
  tied embeddings Megatron has no `output_layer.weight`: the output layer multiplies by the word
  embedding, as `CausalLM`'s `lm_head.weight` is the embedding's Parameter. `to_network` then
  returns the embedding under both names, as `CausalLM.state_dict()` does (what the engines load).
- vocabulary: Megatron's vocab-parallel embedding and output layer need the vocabulary to divide
  by the tensor-parallel size; the extra rows are zeros here and are never a target. The policy
  masks their logits, so they never carry probability either.

"Full" below means Megatron's names with tensor-parallel size 1; `shard`/`unshard` convert between
a full tensor and one rank's piece. Everything not split (norms, position embeddings, the biases
added after a row-parallel reduce) is replicated on every rank.
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
    "mlp.linear_fc1.bias",
    "output_layer.weight",
)
"""Split along dim 0 (output features / vocabulary rows) under tensor parallelism."""
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
"""Split along dim 1 (input features)."""
_GATE_UP = ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias")
"""[gate; up]: each rank holds [its gate shard; its up shard]."""
QK_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")
"""Replicated, but each rank's gradient covers only its own heads (see the policy's step)."""


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


def _layer_pairs(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(Megatron suffix, CausalLM suffix) of the per-layer tensors that map one to one."""
    pairs = [
        ("input_layernorm.weight", "input_layernorm.weight"),
        ("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
        ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"),
        ("mlp.linear_fc2.weight", "mlp.down_proj.weight"),
    ]
    if cfg.o_bias:
        pairs.append(("self_attention.linear_proj.bias", "self_attn.o_proj.bias"))
    if cfg.mlp_bias:
        pairs.append(("mlp.linear_fc2.bias", "mlp.down_proj.bias"))
    if cfg.qk_norm:
        pairs += [(QK_NORMS[0], "self_attn.q_norm.weight"), (QK_NORMS[1], "self_attn.k_norm.weight")]
    return pairs


def _kinds(cfg: ModelConfig, present: bool) -> tuple[str, ...]:
    return ("weight", "bias") if present else ("weight",)


def to_network(full: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full Megatron parameters -> a CausalLM state dict (padded vocabulary rows dropped; with tied
    embeddings `lm_head.weight` is the embedding tensor itself, as in `CausalLM.state_dict()`)."""
    v, inter = cfg.vocab_size, cfg.intermediate_size
    embed = full["embedding.word_embeddings.weight"][:v].contiguous()
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": full["decoder.final_layernorm.weight"]}
    if cfg.position_embedding == "learned":
        out["model.embed_positions.weight"] = full["embedding.position_embeddings.weight"]
    for i in range(cfg.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for kind in _kinds(cfg, cfg.qkv_bias):
            fused = _split_qkv(full[f"{src}self_attention.linear_qkv.{kind}"], cfg)
            for proj, tensor in zip(("q_proj", "k_proj", "v_proj"), fused, strict=True):
                out[f"{dst}self_attn.{proj}.{kind}"] = tensor
        for kind in _kinds(cfg, cfg.mlp_bias):
            fc1 = full[f"{src}mlp.linear_fc1.{kind}"]
            out |= {f"{dst}mlp.gate_proj.{kind}": fc1[:inter], f"{dst}mlp.up_proj.{kind}": fc1[inter:]}
        out |= {dst + theirs: full[src + ours] for ours, theirs in _layer_pairs(cfg)}
    out = {k: t.contiguous() for k, t in out.items()}
    out["lm_head.weight"] = embed if cfg.tie_word_embeddings else full["output_layer.weight"][:v].contiguous()
    return out


def from_network(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, *, padded_vocab: int
) -> dict[str, torch.Tensor]:
    """A CausalLM state dict -> full Megatron parameters (vocabulary zero-padded to `padded_vocab`;
    a tied `lm_head.weight` is the embedding, which Megatron holds once)."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])])

    out = {
        "embedding.word_embeddings.weight": pad(state["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": state["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = pad(state["lm_head.weight"])
    if cfg.position_embedding == "learned":
        out["embedding.position_embeddings.weight"] = state["model.embed_positions.weight"]
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn, mlp = src + "self_attn.", src + "mlp."
        for kind in _kinds(cfg, cfg.qkv_bias):
            out[f"{dst}self_attention.linear_qkv.{kind}"] = _fuse_qkv(
                state[f"{attn}q_proj.{kind}"],
                state[f"{attn}k_proj.{kind}"],
                state[f"{attn}v_proj.{kind}"],
                cfg,
            )
        for kind in _kinds(cfg, cfg.mlp_bias):
            out[f"{dst}mlp.linear_fc1.{kind}"] = torch.cat(
                [state[f"{mlp}gate_proj.{kind}"], state[f"{mlp}up_proj.{kind}"]]
            )
        out |= {dst + ours: state[src + theirs] for ours, theirs in _layer_pairs(cfg)}
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
    if name.endswith(_GATE_UP):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    return full.chunk(size, dim=dim)[rank]


def unshard(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full parameter `name` from every tensor-parallel rank's piece, in rank order."""
    dim = _split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith(_GATE_UP):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(list(shards), dim=dim)
