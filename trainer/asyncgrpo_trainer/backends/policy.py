"""The policy side: the interface every trainer backend implements, and the torch backend.

One RL step is one optimizer step by default, possibly fed in several chunks (streaming):
`train_chunk` runs forward/backward on its rows and accumulates *unnormalized* gradient sums;
`finish_step` all-reduces gradients and the token (or sequence) count over the data-parallel group
once, scales by 1/count, clips, and steps the optimizer. So chunking and sharding give exactly the
gradient of one big batch, and grad_norm is the norm of that global gradient before clipping (the
reference system read the gradient before its reduce had finished and reported about half of it).

PPO mini-batches (`OptimConfig.minibatches` k > 1, policy.trainGlobalBatchSize = P x N / k): each
chunk is only scored as it arrives, under the weights of the step's start (pi_old, no gradient),
and kept; `finish_step` then splits this rank's rows, in arrival order, into k parts and runs k
optimizer steps, each exactly the single-step procedure above on its part. From the second part
on, the ratio pi_theta / pi_old moves away from 1, so the clip range and the dual clip act and
`clip_fraction` counts the tokens they cut. The step's metrics are token-weighted over the k
parts (loss and grad_norm: their mean; is_weight_max: their max; `optimizer_steps`: k).

When the sampler filters (generation.topP < 1 or topK), each chunk is also scored under that
filter (`sampling.token_logprobs` with the sampler's `Filter`, an extra forward without gradient),
and the importance weight compares that with the engine's filtered log-probs: one distribution on
both sides, so the weight is 1 when the weights are equal.

On CUDA the worker trains with `cuda_train.Recipe.for_device`: fp32 master parameters with the
forward under autocast to the model's dtype, compiled decoder blocks and output head, fused AdamW;
on CPU the plain eager recipe in the model's dtype. Both run the same step below; only the recipe
differs. `weights()` are in the model's dtype (what the generation engines hold), the checkpoint
(`save`, straight from the worker to the checkpoint directory, CPU tensors) keeps the master weights.

With one optimizer step, prev_logprobs (pi_old) are the detached log-probs of the same forward
pass: the weights do not change within the step, so a separate "old policy" pass would compute the
same numbers. Reference
log-probs come from a frozen copy of the initial weights, built only when the KL penalty is on.
Megatron-core plugs in behind `PolicyWorker` with the same four calls.

The step keeps the device queue full: the metrics are summed on the device (`StepAccumulator`,
float64, which the Megatron backend shares) and read once in `finish_step`, together with the
counters' all-reduce, and host->device copies do not wait for the queue. On the compiled recipe
every micro-batch is padded to a fixed shape (see `ResponseLogprobs`) with fully masked rows,
which add nothing to the loss, the gradient, the token and sequence counts or the metrics.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.cuda_train import Recipe, ResponseLogprobs, compile_blocks
from asyncgrpo_trainer.models import hf
from asyncgrpo_trainer.models.recipe import DTYPES, ModelBuild

POLICY_FILE = "policy.pt"
"""The torch backend's file in a checkpoint directory (`checkpoint`)."""


@dataclass(frozen=True)
class TrainRow:
    """One sample to train on: the prompt, the sampled response and what the loss needs."""

    prompt_ids: list[int]
    response_ids: list[int]
    generation_logprobs: list[float]
    advantage: float
    reference_logprobs: list[float] | None = None
    prev_logprobs: list[float] | None = None
    """log pi_old from before the step's first optimizer step, where the training forward cannot
    give it (PPO mini-batches); unset: the training forward's own, detached."""
    importance_logprobs: list[float] | None = None
    """log pi_old under the sampler's top-k / top-p filter (only when it filters)."""


@dataclass(frozen=True)
class OptimConfig:
    learning_rate: float
    weight_decay: float
    max_grad_norm: float | None
    warmup_steps: int
    """Optimizer steps of linear learning-rate warm-up (k per RL step with PPO mini-batches)."""
    micro_batch_size: int
    logprob_batch_size: int
    temperature: float
    minibatches: int = 1
    """Optimizer steps per RL step: P x N / policy.trainGlobalBatchSize (PPO mini-batches)."""
    top_p: float = 1.0
    top_k: int | None = None

    @property
    def sampler(self) -> sampling.Filter:
        """The distribution the engine samples from (generation.temperature, topP, topK)."""
        return sampling.Filter(self.temperature, self.top_p, self.top_k)


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
    def save(self, directory: str) -> dict[str, Any]:
        """Write this rank's checkpoint file(s), CPU tensors, into `directory` (a checkpoint's
        temporary directory, `checkpoint.begin`, on storage every pod should mount). The group
        calls it on the ranks whose files make up the checkpoint. Returns the files this rank could
        not write because `directory` is not on its node ({} normally): the group writes those."""

    @abc.abstractmethod
    def load(self, directory: str) -> None:
        """Restore this rank from the checkpoint step directory `directory`; a missing or
        mismatched file raises an error naming the file and the spec field to fix."""


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
        self._held: list[TrainRow] = []  # PPO mini-batches: the step's rows, with pi_old
        self._reset_step()
        self.busy_seconds = 0.0

    def _reset_step(self) -> None:
        self._step = StepAccumulator(self.loss_cfg, self.device)
        self.optimizer.zero_grad(set_to_none=True)

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
        """Queue forward/backward of the rows (with PPO mini-batches: score them under pi_old and
        keep them for `finish_step`); no metrics until `finish_step`, since reading them here
        would make the host wait for the device queue to drain."""
        t0 = time.perf_counter()
        rows = self._with_old_logprobs(rows)
        if self.optim_cfg.minibatches > 1:
            self._held.extend(rows)
        else:
            self._train_rows(rows)
        self.busy_seconds += time.perf_counter() - t0
        return {}

    def _train_rows(self, rows: list[TrainRow]) -> None:
        size = self.optim_cfg.micro_batch_size
        for i in range(0, len(rows), size):
            self._train_micro(rows[i : i + size])

    def _with_old_logprobs(self, rows: list[TrainRow]) -> list[TrainRow]:
        """`rows` with the log-probs under the current weights (the step's pi_old) that the
        training forward cannot supply: before any update of a mini-batched step, and under the
        sampler's filter; unchanged when neither applies."""
        sampler = self.optim_cfg.sampler
        prev, filtered = self.optim_cfg.minibatches > 1, sampler.filters
        if not rows or not (prev or filtered):
            return rows
        size = self.optim_cfg.logprob_batch_size
        out: list[TrainRow] = []
        for i in range(0, len(rows), size):
            part = rows[i : i + size]
            pairs = [(r.prompt_ids, r.response_ids) for r in part]
            old = imp = None
            with torch.no_grad():
                if prev:
                    old = self.logprobs(self.model, pairs, self.device, batch=size)[0].cpu()
                if filtered:
                    with self.recipe.forward_context(self.device):
                        imp = sampling.token_logprobs(
                            self.model, pairs, pad_id=self.build.pad_id, params=sampler, device=self.device
                        )[0].cpu()
            for j, r in enumerate(part):
                n = len(r.response_ids)
                out.append(
                    dataclasses.replace(
                        r,
                        prev_logprobs=None if old is None else old[j, :n].tolist(),
                        importance_logprobs=None if imp is None else imp[j, :n].tolist(),
                    )
                )
        return out

    def _train_micro(self, rows: list[TrainRow]) -> None:
        pairs = [(r.prompt_ids, r.response_ids) for r in rows]
        logp, mask = self.logprobs(self.model, pairs, self.device, batch=self.optim_cfg.micro_batch_size)
        self._step.backward(rows, logp, mask)

    def finish_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        k = self.optim_cfg.minibatches
        if k == 1:
            out = self._optimizer_step().metrics()
        else:
            held, self._held = self._held, []
            steps = []
            for part in split_evenly(held, k):  # the same k on every rank: the reduces pair up
                self._train_rows(part)
                steps.append(self._optimizer_step())
            out = OptimizerStep.combine(steps)
        self.busy_seconds += time.perf_counter() - t0
        return out

    def _optimizer_step(self) -> OptimizerStep:
        """Reduce, clip and step on what `_train_micro` accumulated since the last one."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        totals = self._step.reduce(params, dist.group.WORLD if self.world_size > 1 else None)
        max_norm = self.optim_cfg.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        lr = optimizer_step(self.optimizer, self.optim_cfg, self.steps_taken)
        self.steps_taken += 1
        self._reset_step()
        return OptimizerStep(totals, float(grad_norm), lr)

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies in the model's dtype: what the generation engines hold."""
        return {k: v.detach().to("cpu", self.dtype, copy=True) for k, v in self.model.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """What `save` writes: master weights, optimizer, step count and reference, all on the CPU."""
        return {
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "optimizer": cpu_copy(self.optimizer.state_dict()),
            "steps_taken": self.steps_taken,
            "reference": None
            if self.reference is None
            else {k: v.detach().to("cpu", copy=True) for k, v in self.reference.state_dict().items()},
        }

    def save(self, directory: str) -> dict[str, Any]:
        """Write `policy.pt`, and for a pretrained model the Hugging Face directory `hf` (the
        group calls data-parallel rank 0 only: every rank holds the same state)."""
        returned = checkpoint.write_or_return(Path(directory) / POLICY_FILE, self.state())
        export = hf_export(self.build, self.weights())
        if export is not None:
            returned |= checkpoint.write_or_return(Path(directory) / checkpoint.HF_DIR, export)
        return returned

    def load(self, directory: str) -> None:
        state = checkpoint.read(
            Path(directory) / POLICY_FILE,
            fix="the torch policy backend writes it; resume with the spec.trainer.policy.backend "
            "the checkpoint was written with",
            mmap=self.device.type != "cpu",
        )
        self.model.load_state_dict(state["model"])
        load_optimizer(self.optimizer, state["optimizer"])
        self.steps_taken = int(state["steps_taken"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self._held = []
        self._reset_step()

    def busy(self) -> float:
        return self.busy_seconds

    def shutdown(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


class StepAccumulator:
    """One step's accounting, the same for every backend: what differs between them (how the
    log-probs are computed, the gradient clipping, the process groups) stays in the worker.

    `backward` turns a micro-batch's log-probs into the unnormalized loss, runs its backward pass
    and adds its metrics to float64 running sums on the device, so the host never waits for the
    device queue mid-step; `reduce` sums gradients and counters over the data-parallel group and
    reads the counters back, once per step.
    """

    def __init__(self, loss: losses.LossConfig, device: torch.device) -> None:
        self.loss_cfg, self.device = loss, device
        self._sums: dict[str, torch.Tensor] = {}
        self._maxes: dict[str, torch.Tensor] = {}

    def backward(self, rows: list[TrainRow], logprobs: torch.Tensor, mask: torch.Tensor) -> None:
        """`logprobs` and `mask` are (B, R) for `rows` in order; rows past len(rows) (a compiled
        micro-batch's padding) are fully masked and add nothing. A row's `prev_logprobs` and
        `importance_logprobs`, when set, are pi_old for the ratio and for the importance weight."""
        ref = None
        if self.loss_cfg.reference_policy_kl_penalty > 0:
            ref = _padded([r.reference_logprobs or [] for r in rows], mask)
        prev = logprobs.detach()
        if rows and rows[0].prev_logprobs is not None:
            prev = _padded([r.prev_logprobs or [] for r in rows], mask)
        imp = None
        if rows and rows[0].importance_logprobs is not None:
            imp = _padded([r.importance_logprobs or [] for r in rows], mask)
        # advantages: (B,), 0 for padding rows.
        total, metrics = losses.policy_loss_terms(
            logprobs=logprobs,
            prev_logprobs=prev,
            generation_logprobs=_padded([r.generation_logprobs for r in rows], mask),
            advantages=_padded([[r.advantage] for r in rows], mask[:, :1]).squeeze(1),
            mask=mask,
            cfg=self.loss_cfg,
            reference_logprobs=ref,
            importance_logprobs=imp,
        )
        total.backward()  # type: ignore[no-untyped-call]
        # Device-side float64 running sums: the same additions the host used to do on floats.
        metrics["loss_sum"] = total.detach()
        metrics["sequences"] = torch.full((), float(len(rows)), device=self.device)
        for key in _SUMMED:
            value = metrics[key].double()
            self._sums[key] = self._sums[key] + value if key in self._sums else value
        for key in _MAXED:
            value = metrics[key].double()
            self._maxes[key] = torch.maximum(self._maxes[key], value) if key in self._maxes else value

    def reduce(self, params: list[torch.nn.Parameter], group: dist.ProcessGroup | None) -> StepTotals:
        """Sum the gradients of `params` and the counters over `group` (None: this rank is the only
        data-parallel replica) and divide the gradients by the global token (or sequence) count:
        afterwards they are the gradient of the whole step's batch. A parameter without a gradient
        (unused by this rank's rows) joins the reduce with zeros."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        stats = torch.stack([self._sums.get(k, zero) for k in _SUMMED])
        peaks = torch.stack([self._maxes.get(k, zero) for k in _MAXED])  # the metrics are >= 0
        if group is not None:
            # One reduce per step for the gradients and one for the counters; the backward passes
            # ran without any communication.
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            dist.all_reduce(stats, group=group)
            dist.all_reduce(peaks, op=dist.ReduceOp.MAX, group=group)
        # The step's one read of the counters.
        sums = dict(zip(_SUMMED, stats.tolist(), strict=True))
        maxes = dict(zip(_MAXED, peaks.tolist(), strict=True))
        count = max(sums["tokens" if self.loss_cfg.token_level_loss else "sequences"], 1.0)
        for g in grads:
            g.div_(count)
        return StepTotals(sums, count, maxes)


@dataclass(frozen=True)
class StepTotals:
    """A step's global sums (`_SUMMED`), maxima (`_MAXED`) and the count its loss and gradient
    are divided by."""

    sums: dict[str, float]
    count: float
    maxes: dict[str, float] = dataclasses.field(default_factory=dict)

    def metrics(self, *, grad_norm: float, lr: float) -> dict[str, float]:
        """What `finish_step` reports: per-token means of the token metrics."""
        tokens = max(self.sums["tokens"], 1.0)
        return {
            "loss": self.sums["loss_sum"] / self.count,
            "grad_norm": grad_norm,
            "lr": lr,
            "train_tokens": self.sums["tokens"],
            "is_weight_mean": self.sums["is_weight_sum"] / tokens,
            "is_weight_max": self.maxes.get("is_weight_max", 0.0),
            "clip_fraction": self.sums["clip_fraction_sum"] / tokens,
            "kl": self.sums["kl_sum"] / tokens,
            "gen_kl_error": self.sums["gen_kl_sum"] / tokens,
            "entropy": self.sums["entropy_sum"] / tokens,
            "gen_logprob_error": self.sums["gen_logprob_error_sum"] / tokens,
        }


@dataclass(frozen=True)
class OptimizerStep:
    """One optimizer step's totals, gradient norm (before clipping) and learning rate."""

    totals: StepTotals
    grad_norm: float
    lr: float

    def metrics(self) -> dict[str, float]:
        return self.totals.metrics(grad_norm=self.grad_norm, lr=self.lr)

    @staticmethod
    def combine(steps: list[OptimizerStep]) -> dict[str, float]:
        """An RL step's metrics over its mini-batch steps: token metrics over all their tokens,
        loss and grad_norm averaged over the steps, the last learning rate, the largest weight."""
        sums = {k: sum(s.totals.sums[k] for s in steps) for k in _SUMMED}
        maxes = {k: max(s.totals.maxes.get(k, 0.0) for s in steps) for k in _MAXED}
        out = StepTotals(sums, 1.0, maxes).metrics(grad_norm=0.0, lr=steps[-1].lr)
        out["loss"] = sum(s.metrics()["loss"] for s in steps) / len(steps)
        out["grad_norm"] = sum(s.grad_norm for s in steps) / len(steps)
        out["optimizer_steps"] = float(len(steps))
        return out


def split_evenly(rows: list[TrainRow], parts: int) -> list[list[TrainRow]]:
    """`rows` in order, cut into `parts` consecutive parts whose sizes differ by at most one."""
    size, extra = divmod(len(rows), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(rows[start:end])
        start = end
    return out


def hf_export(build: ModelBuild, weights: dict[str, torch.Tensor]) -> hf.Export | None:
    """The Hugging Face directory a checkpoint of a pretrained model holds (the source checkpoint's
    config and tokenizer, the trained weights in the model's dtype); None for the tiny model."""
    if build.checkpoint is None:
        return None
    return hf.Export(weights, build.config, build.checkpoint, build.torch_dtype)


def optimizer_step(optimizer: torch.optim.Optimizer, optim: OptimConfig, steps_taken: int) -> float:
    """Step `optimizer` at the learning rate of step `steps_taken` (linear warmup); that rate."""
    warm = optim.warmup_steps
    lr = optim.learning_rate * (min(1.0, (steps_taken + 1) / warm) if warm else 1.0)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return lr


_SUMMED = (
    "tokens",
    "sequences",
    "loss_sum",
    "is_weight_sum",
    "clip_fraction_sum",
    "kl_sum",
    "gen_kl_sum",
    "entropy_sum",
    "gen_logprob_error_sum",
)
"""The per-step sums `StepAccumulator.reduce` reduces over the data-parallel group."""
_MAXED = ("is_weight_max",)
"""The per-step maxima it reduces (with MAX) over the group."""


def _padded(values: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Ragged per-row floats -> (B, R) aligned with `mask`, zeros past each row's end and in the
    rows past the last value (a compiled micro-batch's padding rows). The copy to the device does
    not wait for the device's queue."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i, row in enumerate(values):
        out[i, : len(row)] = torch.tensor(row[: mask.shape[1]], dtype=torch.float32)
    return out.to(mask.device, non_blocking=True)


def cpu_copy(obj: Any) -> Any:
    """`obj` (an optimizer's state_dict) with every tensor copied to the CPU, so a checkpoint
    written on a GPU loads in a process that has none."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")
"""Optimizer param-group keys that choose the kernel (per device), not the optimization."""


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a `cpu_copy`'d optimizer state, keeping this optimizer's kernel choice: a CPU
    checkpoint resumed on CUDA keeps its fused AdamW (and the step counters go on the GPU, where
    fused needs them), a CUDA one resumed on CPU does not try to run the fused CUDA kernel."""
    groups = [
        {**saved, **{k: own[k] for k in _IMPLEMENTATION if k in own}}
        for saved, own in zip(state["param_groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({**state, "param_groups": groups})


def default_device(gpus: int) -> str:
    """cuda when this worker was given a GPU and torch sees one, else cpu."""
    if gpus > 0 and torch.cuda.is_available():
        return "cuda"
    return os.environ.get("ASYNCGRPO_DEVICE", "cpu")
