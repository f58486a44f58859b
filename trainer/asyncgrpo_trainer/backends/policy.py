"""The policy side: the interface every trainer backend implements, and the torch backend.

One RL step is one optimizer step, possibly fed in several chunks (streaming): `train_chunk`
runs forward/backward on its rows and accumulates *unnormalized* gradient sums; `finish_step`
all-reduces gradients and the token (or sequence) count over the data-parallel group once, scales
by 1/count, clips, and steps the optimizer. So chunking and sharding give exactly the gradient of
one big batch, and grad_norm is the norm of that global gradient before clipping (the reference
system read the gradient before its reduce had finished and reported about half of it).

On CUDA the worker trains with `cuda_train.Recipe.for_device`: fp32 master parameters with the
forward under autocast to the model's dtype, compiled decoder blocks and output head, fused AdamW;
on CPU the plain eager recipe in the model's dtype. Both run the same step below; only the recipe
differs. `weights()` are in the model's dtype (what the generation engines hold), `state()` keeps
the master weights.

prev_logprobs (pi_old) are the detached log-probs of the same forward pass: the weights do not
change within a step, so a separate "old policy" pass would compute the same numbers. Reference
log-probs come from a frozen copy of the initial weights, built only when the KL penalty is on.
Megatron-core plugs in behind `PolicyWorker` with the same four calls.

The step keeps the device queue full: the metrics are summed on the device (`_SUMMED`, float64)
and read once in `finish_step`, together with the counters' all-reduce, and host->device copies
do not wait for the queue. On the compiled recipe every micro-batch is padded to a fixed shape
(see `ResponseLogprobs`) with fully masked rows, which add nothing to the loss, the gradient, the
token and sequence counts or the metrics.
"""

from __future__ import annotations

import abc
import copy
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends.cuda_train import Recipe, ResponseLogprobs, compile_blocks
from asyncgrpo_trainer.backends.modelspec import DTYPES, ModelBuild


@dataclass(frozen=True)
class TrainRow:
    """One sample to train on: the prompt, the sampled response and what the loss needs."""

    prompt_ids: list[int]
    response_ids: list[int]
    generation_logprobs: list[float]
    advantage: float
    reference_logprobs: list[float] | None = None


@dataclass(frozen=True)
class OptimConfig:
    learning_rate: float
    weight_decay: float
    max_grad_norm: float | None
    warmup_steps: int
    micro_batch_size: int
    logprob_batch_size: int
    temperature: float


class PolicyWorker(abc.ABC):
    """What the controller calls on one data-parallel rank of the trainer."""

    @abc.abstractmethod
    def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]: ...

    @abc.abstractmethod
    def train_chunk(self, rows: list[TrainRow]) -> dict[str, float]: ...

    @abc.abstractmethod
    def finish_step(self) -> dict[str, float]: ...

    @abc.abstractmethod
    def weights(self) -> dict[str, torch.Tensor]: ...

    @abc.abstractmethod
    def state(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state(self, state: dict[str, Any]) -> None: ...


class TorchPolicyWorker(PolicyWorker):
    """Torch training on CPU or CUDA, data parallel over gloo/nccl; see the module docstring.

    `recipe` overrides the device's default (tests and the GPU benchmark use it).
    """

    def __init__(
        self,
        build: ModelBuild,
        optim: OptimConfig,
        loss: losses.LossConfig,
        *,
        rank: int,
        world_size: int,
        device: str,
        rendezvous: str | None = None,
        num_threads: int = 1,
        recipe: Recipe | None = None,
    ) -> None:
        torch.set_num_threads(num_threads)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        if world_size > 1:
            if rendezvous is None:
                raise ValueError("data-parallel policy workers need a rendezvous address")
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world_size)
        self.build, self.optim_cfg, self.loss_cfg = build, optim, loss
        self.dtype = DTYPES[build.dtype]
        self.recipe = recipe if recipe is not None else Recipe.for_device(self.device, self.dtype)
        self.model = self.recipe.prepare(build.instantiate()).to(self.device).train()
        self.reference = None
        if loss.reference_policy_kl_penalty > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        if self.recipe.compile:
            for m in (self.model, self.reference):
                if m is not None:
                    compile_blocks(m)
        self.logprobs = ResponseLogprobs(self.recipe, pad_id=build.pad_id, temperature=optim.temperature)
        self.optimizer = self.recipe.optimizer(
            self.model.parameters(), lr=optim.learning_rate, weight_decay=optim.weight_decay
        )
        self.steps_taken = 0
        self._reset_step()
        self.busy_seconds = 0.0

    def _reset_step(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self.optimizer.zero_grad(set_to_none=True)

    def _lr(self) -> float:
        warm = self.optim_cfg.warmup_steps
        scale = min(1.0, (self.steps_taken + 1) / warm) if warm else 1.0
        return self.optim_cfg.learning_rate * scale

    def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        if self.reference is None:
            raise RuntimeError("reference log-probs requested but the KL penalty is off")
        t0 = time.perf_counter()
        out: list[list[float]] = []
        size = self.optim_cfg.logprob_batch_size
        for i in range(0, len(rows), size):
            part = rows[i : i + size]
            with torch.no_grad():
                lp, _ = self.logprobs(self.reference, part, self.device, batch=size)
            lp = lp.cpu()  # one device->host copy per batch, not one per row
            out.extend(lp[j, : len(r)].tolist() for j, (_, r) in enumerate(part))
        self.busy_seconds += time.perf_counter() - t0
        return out

    def train_chunk(self, rows: list[TrainRow]) -> dict[str, float]:
        """Queue forward/backward of the rows; no metrics until `finish_step`, since reading
        them here would make the host wait for the device queue to drain."""
        t0 = time.perf_counter()
        size = self.optim_cfg.micro_batch_size
        for i in range(0, len(rows), size):
            self._train_micro(rows[i : i + size])
        self.busy_seconds += time.perf_counter() - t0
        return {}

    def _train_micro(self, rows: list[TrainRow]) -> None:
        pairs = [(r.prompt_ids, r.response_ids) for r in rows]
        logp, mask = self.logprobs(self.model, pairs, self.device, batch=self.optim_cfg.micro_batch_size)
        gen = _padded([r.generation_logprobs for r in rows], mask)
        ref = None
        if self.reference is not None:
            ref = _padded([r.reference_logprobs or [] for r in rows], mask)
        adv = _padded([[r.advantage] for r in rows], mask[:, :1]).squeeze(1)  # (B,), 0 for padding rows
        total, metrics = losses.policy_loss_terms(
            logprobs=logp,
            prev_logprobs=logp.detach(),
            generation_logprobs=gen,
            advantages=adv,
            mask=mask,
            cfg=self.loss_cfg,
            reference_logprobs=ref,
        )
        total.backward()  # type: ignore[no-untyped-call]
        # Device-side float64 running sums: the same additions the host used to do on floats.
        metrics["loss_sum"] = total.detach()
        metrics["sequences"] = torch.full((), float(len(rows)), device=self.device)
        for key in _SUMMED:
            value = metrics[key].double()
            self._sums[key] = self._sums[key] + value if key in self._sums else value

    def finish_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        stats = torch.stack([self._sums.get(k, zero) for k in _SUMMED])
        if self.world_size > 1:
            # One reduce per step for the gradients and one for the counters; the backward passes
            # above ran without any communication.
            flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
            dist.all_reduce(flat)
            offset = 0
            for p in params:
                assert p.grad is not None
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n
            dist.all_reduce(stats)
        # The step's one read of the counters (and the second sync, grad_norm, below).
        sums = dict(zip(_SUMMED, stats.tolist(), strict=True))
        count = max(sums["tokens" if self.loss_cfg.token_level_loss else "sequences"], 1.0)
        for p in params:
            if p.grad is not None:
                p.grad.div_(count)
        max_norm = self.optim_cfg.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        lr = self._lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.steps_taken += 1
        tokens = max(sums["tokens"], 1.0)
        out = {
            "loss": sums["loss_sum"] / count,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "train_tokens": sums["tokens"],
            "is_weight_mean": sums["is_weight_sum"] / tokens,
            "clip_fraction": sums["clip_fraction_sum"] / tokens,
            "kl": sums["kl_sum"] / tokens,
            "gen_kl_error": sums["gen_kl_sum"] / tokens,
        }
        self._reset_step()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies in the model's dtype: what the generation engines hold."""
        return {k: v.detach().to("cpu", self.dtype, copy=True) for k, v in self.model.state_dict().items()}

    def state(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "steps_taken": self.steps_taken,
            "reference": None
            if self.reference is None
            else {k: v.detach().cpu() for k, v in self.reference.state_dict().items()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_taken = int(state["steps_taken"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self._reset_step()

    def busy(self) -> float:
        return self.busy_seconds

    def shutdown(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


_SUMMED = ("tokens", "sequences", "loss_sum", "is_weight_sum", "clip_fraction_sum", "kl_sum", "gen_kl_sum")
"""The per-step sums `finish_step` reduces over the data-parallel group and reports from."""


def _padded(values: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Ragged per-row floats -> (B, R) aligned with `mask`, zeros past each row's end and in the
    rows past the last value (a compiled micro-batch's padding rows). The copy to the device does
    not wait for the device's queue."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i, row in enumerate(values):
        out[i, : len(row)] = torch.tensor(row[: mask.shape[1]], dtype=torch.float32)
    return out.to(mask.device, non_blocking=True)


def default_device(gpus: int) -> str:
    """cuda when this worker was given a GPU and torch sees one, else cpu."""
    if gpus > 0 and torch.cuda.is_available():
        return "cuda"
    return os.environ.get("ASYNCGRPO_DEVICE", "cpu")
