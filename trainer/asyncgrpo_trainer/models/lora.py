"""LoRA (spec.trainer.policy.lora): low-rank adapters on the decoder layers' linear projections.

An adapted projection computes W x + b + (alpha / rank) * B (A x), with A (rank, in) drawn like
PEFT's default (Kaiming uniform) and B (out, rank) zero, so the adapted model starts equal to the
base model. Only A and B train: the policy's optimizer holds them alone (AdamW state of a few MB
instead of twice the model), and a refit sends them alone (`adapters`); the torch engine merges
them into its copy of the base weights (`merged`), vLLM serves them as a LoRA adapter it loads from
a PEFT directory (`PeftAdapter`), and a checkpoint of a pretrained model keeps one beside its
merged Hugging Face weights.

Names: an adapted projection is a `LoraLinear`, an `nn.Linear` that keeps its base parameters under
their names (`model.layers.0.self_attn.q_proj.weight`) and adds `...q_proj.lora_A` and
`...q_proj.lora_B`. So base checkpoints load unchanged, `policy.pt` holds base and adapters, and
a PEFT export only renames the adapters (`base_model.model.<module>.lora_A.weight`).

The data-parallel ranks draw A from the job's seed, so they start identical without a broadcast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import save_file
from torch import nn

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections an adapter can sit on (a decoder layer's attention and MLP linears)."""
A, B = "lora_A", "lora_B"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraConfig:
    """policy.lora: the adapters' rank, alpha and the projections they adapt."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...] = TARGETS

    @property
    def scale(self) -> float:
        """The factor on B A: alpha / rank (PEFT's, without rsLoRA)."""
        return self.alpha / self.rank

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoraConfig:
        return cls(int(data["rank"]), float(data["alpha"]), tuple(data["target_modules"]))


class LoraLinear(nn.Linear):
    """An `nn.Linear` whose base parameters are frozen and shared with the layer it replaces, plus
    the trainable adapter `lora_A` (rank, in) and `lora_B` (out, rank)."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, generator: torch.Generator) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: the base's parameters are reused, not allocated
        self.in_features, self.out_features, self.scale = base.in_features, base.out_features, scale
        base.requires_grad_(False)
        self.weight, self.bias = base.weight, base.bias
        dtype, device = base.weight.dtype, base.weight.device
        a = torch.empty(rank, self.in_features, dtype=torch.float32)
        bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=sqrt(5)), as PEFT and nn.Linear
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(device, dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adapted = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + adapted * self.scale


def apply(model: nn.Module, cfg: LoraConfig, *, seed: int) -> None:
    """Freeze every parameter of `model` and put adapters on the `cfg.target_modules` projections of
    each decoder layer, in place; A from `seed` (the same on every rank)."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if name in cfg.target_modules and isinstance(child, nn.Linear)
    ]
    if not targets:
        raise ValueError(
            f"spec.trainer.policy.lora.targetModules {list(cfg.target_modules)} names none of the "
            f"model's projections; use some of {list(TARGETS)}"
        )
    for parent, name, child in targets:
        setattr(parent, name, LoraLinear(child, cfg.rank, cfg.scale, generator))


def is_adapter(name: str) -> bool:
    """Whether `name` is an adapter tensor's (`...q_proj.lora_A`), not a base weight's."""
    return name.endswith((f".{A}", f".{B}"))


def adapters(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a state dict (what a LoRA refit sends)."""
    return {k: v for k, v in state.items() if is_adapter(k)}


def base(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base weights of a state dict, without its adapters."""
    return {k: v for k, v in state.items() if not is_adapter(k)}


def delta(adapter_state: Mapping[str, torch.Tensor], module: str, scale: float) -> torch.Tensor:
    """scale x B A of `module` (`model.layers.0.self_attn.q_proj`), in fp32."""
    a, b = adapter_state[f"{module}.{A}"].float(), adapter_state[f"{module}.{B}"].float()
    return (b @ a) * scale


def adapted_modules(adapter_state: Mapping[str, torch.Tensor]) -> list[str]:
    """The module names the adapters of `adapter_state` sit on, in order."""
    return [k.removesuffix(f".{A}") for k in adapter_state if k.endswith(f".{A}")]


def merged(
    base_weights: Mapping[str, torch.Tensor], adapter_state: Mapping[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """W + scale x B A for every adapted module's `weight` in `base_weights`, in W's dtype and device:
    the weights the adapters amount to (the torch engine's refit, a merged export)."""
    out = {}
    for module in adapted_modules(adapter_state):
        w = base_weights[f"{module}.weight"]
        out[f"{module}.weight"] = (w.float() + delta(adapter_state, module, scale).to(w.device)).to(w.dtype)
    return out


def merged_state(state: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict (base and adapters) as the plain network's: adapters merged."""
    plain = base(state)
    return plain | merged(plain, adapters(state), scale)


@dataclass(frozen=True)
class PeftAdapter:
    """A PEFT-format LoRA adapter still to be written (`write`): what `peft.PeftModel.from_pretrained`
    and vLLM's LoRARequest load over the base checkpoint `base_model`."""

    state: dict[str, torch.Tensor]
    """The adapters under the network's names (`...q_proj.lora_A`)."""
    cfg: LoraConfig
    base_model: str

    def write(self, out_dir: str | Path, dtype: torch.dtype) -> Path:
        """`adapter_config.json` and `adapter_model.safetensors` in `out_dir` (created)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        modules = sorted({m.rsplit(".", 1)[-1] for m in adapted_modules(self.state)})
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.cfg.rank,
            "lora_alpha": self.cfg.alpha,
            "target_modules": modules,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
            "inference_mode": True,
            "modules_to_save": None,
        }
        (out / PEFT_CONFIG).write_text(json.dumps(config, indent=2))
        tensors = {
            f"{PEFT_PREFIX}{k}.weight": v.detach().to("cpu", dtype).contiguous()
            for k, v in self.state.items()
        }
        save_file(tensors, str(out / PEFT_WEIGHTS), metadata={"format": "pt"})
        return out
