"""The supported model families, and a checkpoint's config.json turned into the network's config.

`ModelConfig` is everything the network, the engines and the Megatron mapping need to know about a
model's shape, read once here so that no backend parses a config itself. Supported families (by
config.json's `model_type`): Qwen2/Qwen2.5 (`qwen2`: q/k/v projections with a bias), Qwen3
(`qwen3`: RMSNorm on each head's queries and keys, explicit head_dim) and Llama 3 (`llama`: the
optional attention/MLP biases, llama3 rope scaling). Everything outside them fails with an
`InvalidModelError` that names the file and the field, before any worker starts.

Rotary frequencies are computed here with transformers' own functions for the scaled variants
(linear, llama3, yarn), so that the rotation is the one the checkpoint was trained with, bit for
bit; variants whose frequencies change with the sequence length (dynamic NTK, longrope) are
refused rather than approximated. The tiny model of `source: tiny` is the same network with the
project's defaults, and may use learned absolute positions instead of RoPE (they let a 2-layer
model learn position-sensitive tasks such as digit reversal from random weights, where RoPE stalls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from asyncgrpo_trainer.models.directory import InvalidModelError

PositionEmbedding = Literal["rope", "learned"]


@dataclass(frozen=True)
class Family:
    """What differs between the supported families (HF's defaults for each model_type)."""

    architecture: str
    qkv_bias: bool
    qk_norm: bool


FAMILIES: dict[str, Family] = {
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, qk_norm=False),
    "qwen3": Family("Qwen3ForCausalLM", qkv_bias=False, qk_norm=True),
    "llama": Family("LlamaForCausalLM", qkv_bias=False, qk_norm=False),
}
"""config.json model_type -> family. The tiny model is shaped like qwen2."""

SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only model's shape. `family` is a FAMILIES key (the tiny model's is qwen2)."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = True
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    position_embedding: PositionEmbedding = "rope"
    rope_inv_freq: tuple[float, ...] = ()
    """Rotary inverse frequencies (head_dim / 2 of them); empty with learned positions."""
    rope_attention_scaling: float = 1.0
    """Factor on cos/sin (yarn's attention temperature; 1 otherwise)."""

    @property
    def hf_exportable(self) -> bool:
        """Whether a Hugging Face family holds this model (learned positions are the tiny model's own)."""
        return self.position_embedding == "rope"


def default_inv_freq(head_dim: int, theta: float) -> tuple[float, ...]:
    """Unscaled RoPE frequencies 1 / theta^(2i / head_dim), as transformers computes them (fp32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return tuple((1.0 / (theta**exponents)).tolist())


def tiny_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int | None,
    max_positions: int,
    position_embedding: PositionEmbedding,
    rope_theta: float = 10000.0,
) -> ModelConfig:
    """The tiny model: Qwen2-shaped (q/k/v bias, untied head), intermediate 4 x hidden by default."""
    head_dim = hidden_size // num_heads
    return ModelConfig(
        family="qwen2",
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_positions=max_positions,
        position_embedding=position_embedding,
        rope_inv_freq=default_inv_freq(head_dim, rope_theta) if position_embedding == "rope" else (),
    )


def _field(raw: dict[str, Any], name: str, source: str, kind: type = int) -> Any:
    value = raw.get(name)
    if value is None or (kind is int and (not isinstance(value, int) or isinstance(value, bool))):
        raise InvalidModelError(f"{source}: `{name}` is missing or not {kind.__name__} (got {value!r})")
    return value


def _rope(raw: dict[str, Any], head_dim: int, source: str) -> tuple[tuple[float, ...], float]:
    """(inverse frequencies, attention scaling) of the config's rope parameters."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = str(params.get("rope_type", params.get("type", "default")))
    if kind not in SUPPORTED_ROPE:
        raise InvalidModelError(
            f"{source}: rope type {kind!r} is not supported (its frequencies change with the sequence "
            f"length or are unknown here); supported: {', '.join(SUPPORTED_ROPE)}"
        )
    if kind == "default":
        return default_inv_freq(head_dim, theta), 1.0
    from transformers import AutoConfig  # noqa: PLC0415
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415

    cfg = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    if not math.isfinite(float(scaling)):
        raise InvalidModelError(f"{source}: rope parameters give a non-finite attention scaling")
    return tuple(inv_freq.float().tolist()), float(scaling)


def from_hf(raw: dict[str, Any], *, source: str, max_positions: int) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (`raw`), read from `source` (for messages).

    `max_positions` is the job's maxSequenceLength: the network never sees a longer sequence.
    """
    model_type = raw.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise InvalidModelError(
            f"{source}: model_type {model_type!r} is not a supported family; supported: "
            f"{', '.join(sorted(FAMILIES))} (Qwen2/Qwen2.5, Qwen3, Llama 3)"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise InvalidModelError(f"{source}: hidden_act {raw.get('hidden_act')!r}; only silu is supported")
    window = raw.get("sliding_window")
    if raw.get("use_sliding_window") and window is not None and int(window) < max_positions:
        raise InvalidModelError(
            f"{source}: sliding-window attention ({window} tokens) is not supported; set "
            f"spec.trainer.model.maxSequenceLength <= {window} or use a checkpoint without it"
        )
    hidden = _field(raw, "hidden_size", source)
    heads = _field(raw, "num_attention_heads", source)
    kv_heads = raw.get("num_key_value_heads") or heads
    head_dim = raw.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise InvalidModelError(f"{source}: num_attention_heads {heads} is not a multiple of {kv_heads}")
    limit = raw.get("max_position_embeddings")
    if isinstance(limit, int) and max_positions > limit:
        raise InvalidModelError(
            f"spec.trainer.model.maxSequenceLength {max_positions} exceeds the checkpoint's "
            f"max_position_embeddings {limit} ({source}); lower maxSequenceLength"
        )
    attention_bias = bool(raw.get("attention_bias", False))
    inv_freq, scaling = _rope(raw, head_dim, source)
    return ModelConfig(
        family=str(model_type),
        vocab_size=_field(raw, "vocab_size", source),
        hidden_size=hidden,
        num_layers=_field(raw, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_field(raw, "intermediate_size", source),
        max_positions=max_positions,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        qkv_bias=family.qkv_bias or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=family.qk_norm,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        position_embedding="rope",
        rope_inv_freq=inv_freq,
        rope_attention_scaling=scaling,
    )
