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

With policy.maxTokensPerMicroBatch every forward pass (training, reference, pi_old) takes rows
packed end to end up to that many tokens instead of a fixed number of padded rows (`packing`
plans them, `ResponseLogprobs` runs them); the log-probs come back in the padded layout, so the
step above is unchanged and gives the same loss and gradient.

With policy.sharding.strategy fsdp (`fsdp`) each rank holds a shard of the model, the optimizer
state and the reference: the same step, with the gradients summed by FSDP during the backward
passes instead of by the reduce in `finish_step`, every rank running as many forward passes as
the others in each call, and the weights gathered for `weights()`, the refit and a checkpoint
(same `policy.pt` as unsharded). policy.activationCheckpointing recomputes each layer's
activations in the backward pass (`CausalLM.checkpoint_activations`).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import packing, sampling
from asyncgrpo_trainer.backends.cuda_train import Recipe, ResponseLogprobs, compile_blocks
from asyncgrpo_trainer.models import hf, lora
from asyncgrpo_trainer.models.recipe import DTYPES, ModelBuild

if TYPE_CHECKING:  # imported when a worker shards (`TorchPolicyWorker`): DTensor's imports are slow
    from asyncgrpo_trainer.backends import fsdp

Row = TypeVar("Row")

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
    fresh: bool = True
    """Generated by the weights this step trains (staleness 0): counts in the log-prob gate."""
    loss_mask: list[int] | None = None
    """Per response token, 1 where it is trained: a conversation's environment tokens, and its
    policy tokens older than the staleness bound, are 0 (`controller`); None: every token."""


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
    schedule: str = "constant"
    """policy.learningRateSchedule: constant or cosine (`learning_rate_at`)."""
    min_lr_ratio: float = 0.0
    total_steps: int = 0
    """Optimizer steps in the whole run (grpo.maxNumSteps x minibatches): where cosine ends."""
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens_per_micro_batch: int | None = None
    """policy.maxTokensPerMicroBatch: pack rows into micro-batches of at most this many tokens
    (`packing`, `network.PackedRows`) instead of micro_batch_size / logprob_batch_size rows."""

    @property
    def sampler(self) -> sampling.Filter:
        """The distribution the engine samples from (generation.temperature, topP, topK)."""
        return sampling.Filter(self.temperature, self.top_p, self.top_k)


@dataclass(frozen=True)
class Sharding:
    """spec.trainer.policy.sharding with strategy fsdp (`fsdp`)."""

    cpu_offload: bool = False
    """Sharded parameters, gradients and optimizer state in host memory. Only on CUDA: a CPU
    worker's are there already (admission warns that the field does nothing there)."""


class PolicyWorker(abc.ABC):
    """What the controller calls on one data-parallel rank of the trainer."""

    @abc.abstractmethod
    def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]: ...

    @abc.abstractmethod
    def train_chunk(self, rows: list[TrainRow]) -> dict[str, float]: ...

    @abc.abstractmethod
    def finish_step(self) -> dict[str, float | None]: ...

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

    `recipe` overrides the device's default (tests and the GPU benchmark use it). `sharding`
    (policy.sharding strategy fsdp) shards the model over the ranks, even over one, which then
    forms a process group of its own (it needs `rendezvous` too).
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
        sharding: Sharding | None = None,
        activation_checkpointing: bool = False,
    ) -> None:
        torch.set_num_threads(num_threads)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        if self.device.index is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL's and FSDP's device (several GPUs, no Ray)
        offload = sharding is not None and sharding.cpu_offload and self.device.type == "cuda"
        self._grouped = world_size > 1 or sharding is not None
        if self._grouped:
            if rendezvous is None:
                raise ValueError("data-parallel or sharded policy workers need a rendezvous address")
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            if offload:  # collectives of the shards in host memory (the clip's norm) go over gloo
                backend = "cpu:gloo,cuda:nccl"
            dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world_size)
        self.build, self.optim_cfg, self.loss_cfg = build, optim, loss
        self.dtype = DTYPES[build.dtype]
        self.recipe = recipe if recipe is not None else Recipe.for_device(self.device, self.dtype)
        self.fsdp: fsdp.Sharded | None = None
        if sharding is not None:
            from asyncgrpo_trainer.backends import fsdp  # noqa: PLC0415  (see TYPE_CHECKING above)

            self.fsdp = fsdp.Sharded(self.device, param_dtype=self.dtype, cpu_offload=offload)
            # With offload AdamW steps on the shards in host memory, with PyTorch's fused CPU kernel
            # (the recipe's fused_adamw stays on): the single-tensor loop it used before took
            # 10.4-14.5 s of an 11-15 s step at 1.5B on an H100's host (2026-12-06), and the
            # fused kernel is 7-9x faster than that loop on one thread (bench/trainer/cpu_adamw.py).
        model = build.instantiate()
        self.reference = None
        if loss.reference_policy_kl_penalty > 0:  # the policy's precision, so its KL starts at 0
            self.reference = self.recipe.prepare(copy.deepcopy(model)).eval().requires_grad_(False)
        if build.lora is not None:
            if sharding is not None:
                raise ValueError(
                    "spec.trainer.policy.lora with policy.sharding.strategy fsdp: LoRA trains adapters on "
                    "an unsharded model; set sharding.strategy none or unset policy.lora"
                )
            lora.apply(model, build.lora, seed=build.seed)
        model = self.recipe.prepare(model)  # after LoRA froze the base: fp32 masters for what trains
        if activation_checkpointing:
            model.checkpoint_activations()
        for m in (model, self.reference):
            if m is None:
                continue
            if self.recipe.compile:
                compile_blocks(m)
            if self.fsdp is None:
                m.to(self.device)
            else:
                self.fsdp.shard(m, trains=m is model)
        self.model = model.train()
        self.logprobs = ResponseLogprobs(
            self.recipe,
            pad_id=build.pad_id,
            temperature=optim.temperature,
            token_budget=optim.max_tokens_per_micro_batch,
        )
        self.optimizer = self.recipe.optimizer(
            [p for p in self.model.parameters() if p.requires_grad],  # with LoRA: the adapters
            lr=optim.learning_rate,
            weight_decay=optim.weight_decay,
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
        out: list[list[float]] = [[] for _ in rows]
        size = self.optim_cfg.logprob_batch_size
        for batch in self._forward_passes([len(p) + len(r) for p, r in rows], size):
            part = self._scored([rows[i] for i in batch])
            with torch.no_grad():
                lp, _ = self.logprobs(self.reference, part, self.device, batch=size)
            lp = lp.cpu()  # one device->host copy per batch, not one per row
            for j, i in enumerate(batch):
                out[i] = lp[j, : len(rows[i][1])].tolist()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def _forward_passes(self, lengths: list[int], rows_per_batch: int) -> list[list[int]]:
        """Row indices per forward pass: `rows_per_batch` rows, or packed to the token budget.
        Sharded, every rank runs as many passes as the rank with the most (`fsdp.in_lockstep`): the
        extra ones are empty, and `_scored` gives them a row to run."""
        batches = packing.micro_batches(
            lengths, rows_per_batch=rows_per_batch, token_budget=self.optim_cfg.max_tokens_per_micro_batch
        )
        return batches if self.fsdp is None else self.fsdp.in_lockstep(batches)

    def _scored(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
        """The (prompt, response) pairs of a forward pass; for an empty lockstep pass one that scores
        nothing (two pad tokens of prompt, no response: its mask is all zero)."""
        return pairs or [([self.build.pad_id] * 2, [])]

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
        for batch in self._forward_passes(_lengths(rows), self.optim_cfg.micro_batch_size):
            self._train_micro([rows[i] for i in batch])

    def _with_old_logprobs(self, rows: list[TrainRow]) -> list[TrainRow]:
        """`rows` with the log-probs under the current weights (the step's pi_old) that the
        training forward cannot supply: before any update of a mini-batched step, and under the
        sampler's filter; unchanged when neither applies."""
        sampler = self.optim_cfg.sampler
        prev, filtered = self.optim_cfg.minibatches > 1, sampler.filters
        if not (prev or filtered):
            return rows
        size = self.optim_cfg.logprob_batch_size
        out = list(rows)
        for batch in self._forward_passes(_lengths(rows), size):
            part = [rows[i] for i in batch]
            pairs = self._scored([(r.prompt_ids, r.response_ids) for r in part])
            old = imp = None
            with torch.no_grad():
                if prev:
                    old = self.logprobs(self.model, pairs, self.device, batch=size)[0].cpu()
                if filtered:
                    with self.recipe.forward_context(self.device):
                        imp = sampling.token_logprobs(
                            self.model, pairs, pad_id=self.build.pad_id, params=sampler, device=self.device
                        )[0].cpu()
            for j, i in enumerate(batch):
                n = len(rows[i].response_ids)
                out[i] = dataclasses.replace(
                    rows[i],
                    prev_logprobs=None if old is None else old[j, :n].tolist(),
                    importance_logprobs=None if imp is None else imp[j, :n].tolist(),
                )
        return out

    def _train_micro(self, rows: list[TrainRow]) -> None:
        pairs = self._scored([(r.prompt_ids, r.response_ids) for r in rows])
        logp, mask = self.logprobs(self.model, pairs, self.device, batch=self.optim_cfg.micro_batch_size)
        self._step.backward(rows, logp, mask)

    def finish_step(self) -> dict[str, float | None]:
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
        totals = self._step.reduce(
            params,
            dist.group.WORLD if self.world_size > 1 else None,
            gradients_summed=self.fsdp is not None,
        )
        max_norm = self.optim_cfg.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        if self.fsdp is not None:
            grad_norm = self.fsdp.whole(grad_norm)  # the norm of the shards' global gradient
        lr = optimizer_step(self.optimizer, self.optim_cfg, self.steps_taken)
        self.steps_taken += 1
        self._reset_step()
        return OptimizerStep(totals, float(grad_norm), lr)

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies in the model's dtype: what the generation engines hold, or with LoRA only the
        adapters (`lora`: the engines merge or serve them). Sharded, a collective that gives them to
        rank 0 ({} on the other ranks)."""
        if self.fsdp is not None:
            return {k: v.to(self.dtype) for k, v in self.fsdp.model_state(self.model).items()}
        return {k: v.detach().to("cpu", self.dtype, copy=True) for k, v in self._refit_state().items()}

    def _refit_state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return state if self.build.lora is None else lora.adapters(state)

    def refit_parameters(self) -> dict[str, torch.Tensor]:
        """What a refit sends, on this worker's device under the engines' names: the parameters
        themselves (the sender casts them; with LoRA the adapters only), or sharded, every rank's
        gathered copy in the model's dtype (a collective)."""
        if self.fsdp is not None:
            return self.fsdp.gathered_parameters(self.model, self.dtype)
        named: dict[str, torch.Tensor] = dict(self.model.named_parameters())
        return named if self.build.lora is None else lora.adapters(named)

    def state(self) -> dict[str, Any]:
        """What `save` writes: master weights, optimizer, step count and reference, all on the CPU.
        Sharded, a collective that gives the whole state to rank 0 (empty dicts elsewhere)."""
        optimizer = (
            cpu_copy(self.optimizer.state_dict())
            if self.fsdp is None
            else self.fsdp.optimizer_state(self.model, self.optimizer)
        )
        return {
            "model": self._cpu_state(self.model),
            "optimizer": optimizer,
            "steps_taken": self.steps_taken,
            "reference": None if self.reference is None else self._cpu_state(self.reference),
        }

    def _cpu_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.fsdp is not None:
            return self.fsdp.model_state(model)
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def _load_state(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        if self.fsdp is not None:
            self.fsdp.load_model_state(model, state)
        else:
            model.load_state_dict(state)

    def save(self, directory: str) -> dict[str, Any]:
        """Write `policy.pt`, and for a pretrained model the Hugging Face directory `hf`. The group
        calls data-parallel rank 0 only, since every rank holds the same state; sharded, it calls
        every rank (gathering the state is a collective) and rank 0 writes."""
        state = self.state()
        if self.rank != 0:
            return {}
        returned = checkpoint.write_or_return(Path(directory) / POLICY_FILE, state)
        export = hf_export(self.build, {k: v.to(self.dtype) for k, v in state["model"].items()})
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
        self._load_state(self.model, state["model"])
        if self.fsdp is None:
            load_optimizer(self.optimizer, state["optimizer"])
        else:
            own = with_own_kernels(self.optimizer, state["optimizer"])
            self.fsdp.load_optimizer_state(self.model, self.optimizer, own)
        self.steps_taken = int(state["steps_taken"])
        if self.reference is not None and state.get("reference") is not None:
            self._load_state(self.reference, state["reference"])
        self._held = []
        self._reset_step()

    def busy(self) -> float:
        return self.busy_seconds

    def shutdown(self) -> None:
        """Leave the process group this worker formed (none for a single unsharded rank)."""
        if self._grouped and dist.is_initialized():
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
        `importance_logprobs`, when set, are pi_old for the ratio and for the importance weight.
        A row's `loss_mask` zeroes the tokens it excludes in `mask`: they add nothing to the loss,
        its gradient, the token count that normalizes the step or any metric."""
        if any(r.loss_mask is not None for r in rows):
            kept = [
                [1.0] * len(r.response_ids) if r.loss_mask is None else [float(m) for m in r.loss_mask]
                for r in rows
            ]
            mask = mask * _padded(kept, mask)
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
            fresh=_padded([[float(r.fresh)] for r in rows], mask[:, :1]).squeeze(1),
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

    def reduce(
        self,
        params: list[torch.nn.Parameter],
        group: dist.ProcessGroup | None,
        *,
        gradients_summed: bool = False,
    ) -> StepTotals:
        """Sum the gradients of `params` and the counters over `group` (None: this rank is the only
        data-parallel replica) and divide the gradients by the global normalizer (token or sequence
        count, or Dr. GRPO's sequences x constant; `LossConfig.normalizer`):
        afterwards they are the gradient of the whole step's batch. A parameter without a gradient
        (unused by this rank's rows) joins the reduce with zeros. `gradients_summed`: the gradients
        already are the group's sums (FSDP's reduce-scatter, `fsdp`): only the counters travel."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        stats = torch.stack([self._sums.get(k, zero) for k in _SUMMED])
        peaks = torch.stack([self._maxes.get(k, zero) for k in _MAXED])  # the metrics are >= 0
        if group is not None:
            if not gradients_summed:
                # One reduce per step for the gradients and one for the counters; the backward
                # passes ran without any communication.
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
        count = max(self.loss_cfg.normalizer(tokens=sums["tokens"], sequences=sums["sequences"]), 1.0)
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

    def metrics(self, *, grad_norm: float, lr: float) -> dict[str, float | None]:
        """What `finish_step` reports: per-token means of the token metrics. The log-prob gate is
        None on a step with no fresh row (every sample generated by older weights)."""
        tokens = max(self.sums["tokens"], 1.0)
        fresh = self.sums["fresh_tokens"]
        return {
            "loss": self.sums["loss_sum"] / self.count,
            "grad_norm": grad_norm,
            "lr": lr,
            "train_tokens": self.sums["tokens"],
            "is_weight_mean": self.sums["is_weight_sum"] / tokens,
            "is_weight_max": self.maxes.get("is_weight_max", 0.0),
            "is_out_of_bounds": self.sums["is_out_of_bounds_sum"] / tokens,
            "clip_fraction": self.sums["clip_fraction_sum"] / tokens,
            "kl": self.sums["kl_sum"] / tokens,
            "gen_kl_error": self.sums["gen_kl_sum"] / tokens,
            "behaviour_kl": self.sums["behaviour_kl_sum"] / tokens,
            "entropy": self.sums["entropy_sum"] / tokens,
            "gen_logprob_error": self.sums["gen_logprob_error_sum"] / fresh if fresh else None,
        }


@dataclass(frozen=True)
class OptimizerStep:
    """One optimizer step's totals, gradient norm (before clipping) and learning rate."""

    totals: StepTotals
    grad_norm: float
    lr: float

    @property
    def loss(self) -> float:
        return self.totals.sums["loss_sum"] / self.totals.count

    def metrics(self) -> dict[str, float | None]:
        return self.totals.metrics(grad_norm=self.grad_norm, lr=self.lr)

    @staticmethod
    def combine(steps: list[OptimizerStep]) -> dict[str, float | None]:
        """An RL step's metrics over its mini-batch steps: token metrics over all their tokens,
        loss and grad_norm averaged over the steps, the last learning rate, the largest weight."""
        sums = {k: sum(s.totals.sums[k] for s in steps) for k in _SUMMED}
        maxes = {k: max(s.totals.maxes.get(k, 0.0) for s in steps) for k in _MAXED}
        out = StepTotals(sums, 1.0, maxes).metrics(grad_norm=0.0, lr=steps[-1].lr)
        out["loss"] = sum(s.loss for s in steps) / len(steps)
        out["grad_norm"] = sum(s.grad_norm for s in steps) / len(steps)
        out["optimizer_steps"] = float(len(steps))
        return out


def _lengths(rows: list[TrainRow]) -> list[int]:
    """Each row's tokens, prompt and response: what a packed micro-batch's budget counts."""
    return [len(r.prompt_ids) + len(r.response_ids) for r in rows]


def split_evenly(rows: list[Row], parts: int) -> list[list[Row]]:
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
    config and tokenizer, the trained weights in the model's dtype); None for the tiny model. With
    LoRA the weights are merged and the PEFT adapter goes beside them (`hf.ADAPTER_DIR`)."""
    if build.checkpoint is None:
        return None
    if build.lora is None:
        return hf.Export(weights, build.config, build.checkpoint, build.torch_dtype)
    adapter = lora.PeftAdapter(lora.adapters(weights), build.lora, build.checkpoint)
    merged = lora.merged_state(weights, build.lora.scale)
    return hf.Export(merged, build.config, build.checkpoint, build.torch_dtype, adapter=adapter)


def learning_rate_at(optim: OptimConfig, steps_taken: int) -> float:
    """The rate of optimizer step `steps_taken` (0-based): a linear warm-up over warmup_steps, then
    constant, or down a half cosine from learning_rate to min_lr_ratio x learning_rate at the last
    of total_steps."""
    peak, warm = optim.learning_rate, optim.warmup_steps
    if warm and steps_taken < warm:
        return peak * (steps_taken + 1) / warm
    if optim.schedule != "cosine":
        return peak
    span = max(optim.total_steps - 1 - warm, 1)
    progress = min(max(steps_taken - warm, 0) / span, 1.0)
    floor = peak * optim.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_step(optimizer: torch.optim.Optimizer, optim: OptimConfig, steps_taken: int) -> float:
    """Step `optimizer` at the learning rate of step `steps_taken` (`learning_rate_at`); that rate."""
    lr = learning_rate_at(optim, steps_taken)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return lr


_SUMMED = (
    "tokens",
    "sequences",
    "loss_sum",
    "is_weight_sum",
    "is_out_of_bounds_sum",
    "clip_fraction_sum",
    "kl_sum",
    "gen_kl_sum",
    "behaviour_kl_sum",
    "entropy_sum",
    "gen_logprob_error_sum",
    "fresh_tokens",
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
    """Load a `cpu_copy`'d optimizer state, keeping this optimizer's kernel choice
    (`with_own_kernels`)."""
    optimizer.load_state_dict(with_own_kernels(optimizer, state))


def with_own_kernels(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A saved optimizer state with `optimizer`'s kernel choice in its groups: a CPU checkpoint
    resumed on CUDA keeps its fused AdamW (and the step counters go on the GPU, where fused needs
    them), a CUDA one resumed on CPU does not try to run the fused CUDA kernel."""
    groups = [
        {**saved, **{k: own[k] for k in _IMPLEMENTATION if k in own}}
        for saved, own in zip(state["param_groups"], optimizer.param_groups, strict=True)
    ]
    return {**state, "param_groups": groups}


def default_device(gpus: int) -> str:
    """cuda when this worker was given a GPU and torch sees one, else cpu."""
    if gpus > 0 and torch.cuda.is_available():
        return "cuda"
    return os.environ.get("ASYNCGRPO_DEVICE", "cpu")
