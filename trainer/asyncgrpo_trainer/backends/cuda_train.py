"""How the torch policy computes on its device: the training recipe, and response log-probs.

Why a recipe: the plain eager step (bf16 parameters, fused AdamW) measured 27% MFU on an H200 for
the 387M Qwen2-shaped model at 16 x 1024 tokens. Its GEMMs are large enough; the time goes to the
memory-bound glue between them (fp32 RMSNorm, RoPE, SiLU x up, residual adds, and the fp32
log-softmax over a 32k vocabulary), each a separate kernel reading and writing full activations,
forward and backward. Compiling each decoder block (one compiled graph serves all layers: same
code, parameters are inputs) and the output head (final norm + lm_head + log-softmax + gather)
fuses that glue, and the compiled head never keeps fp32 logits (B, T, V) around; flash attention
comes from the model's own SDPA call. `Recipe.for_device` picks it on CUDA (41.6% MFU in the
standalone benchmark); CPU keeps the plain recipe, which is what CI runs.

Precision: `master_fp32` keeps fp32 parameters (the optimizer's master weights) and runs the
forward under autocast to the model's dtype (`spec.trainer.model.dtype`, the dtype the generation
copies hold), the usual mixed-precision recipe; without it the parameters are trained in the
model's dtype directly (cheaper, but AdamW updates smaller than bf16's resolution are lost). With
float16 there is no loss scaling.

`ResponseLogprobs` is the one place the policy turns (prompt, response) rows into per-token
log-probs, for the training loss and the reference pass alike; it computes what
`sampling.token_logprobs` computes (the generation side's notion of a token's log-prob), through
`CausalLM.target_logprobs` with `head_logprobs` as its head, so the compiled head can be used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer.models.network import CausalLM, PackedRows


@dataclass(frozen=True)
class Recipe:
    """How the policy trains on its device; the default is the plain eager recipe."""

    compile: bool = False
    master_fp32: bool = False
    autocast: torch.dtype | None = None
    """Compute dtype of the forward (None: the parameters' dtype)."""
    fused_adamw: bool = False

    @classmethod
    def for_device(cls, device: torch.device, dtype: torch.dtype) -> Recipe:
        """The fast recipe on CUDA (autocast to `dtype` unless it is float32), plain on CPU."""
        if device.type != "cuda":
            return cls()
        return cls(
            compile=True,
            master_fp32=True,
            autocast=None if dtype == torch.float32 else dtype,
            fused_adamw=True,
        )

    def forward_context(self, device: torch.device) -> AbstractContextManager[Any]:
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)

    def prepare(self, model: CausalLM) -> CausalLM:
        """The model in its training dtype: with master weights, its trainable parameters in fp32.
        Frozen ones (LoRA's base) keep the model's dtype, which autocast computes in anyway: a LoRA
        policy held 4 bytes per base parameter when the whole model was made fp32 before LoRA froze
        it (28 GiB at 7B, where bf16 needs 14). Compile separately."""
        if self.master_fp32:
            for param in model.parameters():
                if param.requires_grad:
                    param.data = param.data.float()
        return model

    def optimizer(
        self, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float
    ) -> torch.optim.AdamW:
        return torch.optim.AdamW(
            params, lr=lr, weight_decay=weight_decay, fused=True if self.fused_adamw else None
        )


def bucket_length(n: int, cap: int) -> int:
    """The block input length that `n` positions are padded to on the compiled path.

    Multiples of 64, coarsening to an eighth of the power of two above 512 tokens: padding costs
    at most 63 positions or 25% of the row, and a 2K-position model has 16 buckets (32K: 32), so
    static graphs compile a bounded number of times. Capped at the model's positions (never below
    `n`, so an over-long row fails in the model as it would unpadded).
    """
    step = max(64, 1 << max(n.bit_length() - 3, 0))
    return max(n, min(-(-n // step) * step, cap))


def length_buckets(cap: int) -> list[int]:
    """Every block input length `bucket_length` can return for a model of `cap` positions."""
    return sorted({bucket_length(n, cap) for n in range(1, cap + 1)})


def compile_blocks(model: CausalLM) -> None:
    """Compile every decoder block in place (one graph, reused by all blocks; names unchanged).

    Static shapes: `ResponseLogprobs` feeds the compiled path only a fixed batch size and
    `bucket_length` lengths, so each (batch, bucket) compiles once and runs a static graph (torch's
    default would recompile dynamic on the second shape, and dynamic graphs are slower). Dynamo's
    per-function cache (the blocks' and the compiled head's) is raised to hold every bucket for
    the training batch with gradients and the reference batch without; past its default of 8
    entries it would silently run the function eagerly.
    """
    needed = 2 * len(length_buckets(model.cfg.max_positions))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, needed)
    for blk in model.layers:
        blk.compile(dynamic=False)


def head_logprobs(
    x: torch.Tensor,
    targets: torch.Tensor,
    *,
    norm_w: torch.Tensor,
    eps: float,
    lm_w: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """log softmax(lm_head(norm(x)) / T) at `targets`: (B, T) fp32. Compiled, this never keeps
    fp32 logits (B, T, V) around; eager, it is what `sampling.token_logprobs` computes."""
    var = x.float().pow(2).mean(-1, keepdim=True)
    h = norm_w * (x.float() * torch.rsqrt(var + eps)).to(x.dtype)
    logits = F.linear(h, lm_w).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


class ResponseLogprobs:
    """Per-token log-probs (B, R) of each row's response given its prompt, and the mask (B, R).

    Rows are right-padded (a causal model never attends to later positions, so no attention mask);
    R is the longest response, and the token at position t is scored by the head at t - 1.

    With a compiling recipe the call also pads to the shapes the static graphs were built for:
    the block input length up to `bucket_length` and the rows up to `batch` with rows of pad
    tokens whose mask is all zero (their log-probs are 0 and get no gradient), so ragged GRPO
    batches and a short last micro-batch reuse a few compiled graphs. Eager recipes keep the
    tight shapes: there padding would only add work.

    With a `token_budget` (policy.maxTokensPerMicroBatch) the rows are packed instead
    (`network.PackedRows`): each row but its last token, end to end in one sequence, scored by
    the same head; the log-probs come back in the same (B, R) layout, so the loss is computed the
    same way. A compiling recipe pads the packed sequence to the budget: one shape, one graph.
    """

    def __init__(
        self, recipe: Recipe, *, pad_id: int, temperature: float, token_budget: int | None = None
    ) -> None:
        self.recipe = recipe
        self.pad_id = pad_id
        self.temperature = temperature if temperature > 0 else 1.0
        self.token_budget = token_budget
        self._head: Any = torch.compile(head_logprobs, dynamic=False) if recipe.compile else head_logprobs

    def __call__(
        self,
        model: CausalLM,
        rows: Sequence[tuple[Sequence[int], Sequence[int]]],
        device: torch.device,
        *,
        batch: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.token_budget is not None:
            return self._packed(model, rows, device, self.token_budget)
        full = [[*p, *r] for p, r in rows]
        length = max(2, *(len(x) for x in full))
        r_max = max(1, *(len(r) for _, r in rows))
        n = len(rows)
        if self.recipe.compile:
            length = bucket_length(length - 1, model.cfg.max_positions) + 1
            n = max(n, batch)
        ids = torch.full((n, length), self.pad_id, dtype=torch.long)
        index = torch.zeros((n, r_max), dtype=torch.long)
        mask = torch.zeros((n, r_max))
        for i, ((p, r), seq) in enumerate(zip(rows, full, strict=True)):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            index[i, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            mask[i, : len(r)] = 1.0
        # Pageable host -> device copies without a stream sync: CUDA stages the source at once,
        # and a blocking copy would wait for the queued work of the previous micro-batch.
        ids, index, mask = (x.to(device, non_blocking=True) for x in (ids, index, mask))
        with self.recipe.forward_context(device):
            logp_all = model.target_logprobs(
                ids[:, :-1], ids[:, 1:], self._head, temperature=self.temperature
            )
        return logp_all.gather(1, index) * mask, mask

    def _packed(
        self,
        model: CausalLM,
        rows: Sequence[tuple[Sequence[int], Sequence[int]]],
        device: torch.device,
        budget: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed forward: row i's inputs are its tokens but the last, from `offsets[i]`, and
        its response token j is scored at offsets[i] + len(prompt) - 1 + j."""
        inputs = [[*p, *r][:-1] for p, r in rows]
        lengths = [len(x) for x in inputs]
        total = sum(lengths)
        if self.recipe.compile and total < budget:  # rows of pad tokens, each attending only to itself
            lengths.extend(filler_rows(budget - total, model.cfg.max_positions))
        ids = torch.full((1, sum(lengths)), self.pad_id, dtype=torch.long)
        targets = ids.clone()
        r_max = max(1, *(len(r) for _, r in rows))
        index = torch.zeros((len(rows), r_max), dtype=torch.long)
        mask = torch.zeros((len(rows), r_max))
        offset = 0
        for i, ((p, r), x) in enumerate(zip(rows, inputs, strict=True)):
            ids[0, offset : offset + len(x)] = torch.tensor(x, dtype=torch.long)
            targets[0, offset : offset + len(x)] = torch.tensor([*p, *r][1:], dtype=torch.long)
            index[i, : len(r)] = torch.arange(offset + len(p) - 1, offset + len(p) - 1 + len(r))
            mask[i, : len(r)] = 1.0
            offset += len(x)
        ids, targets, index, mask = (x.to(device, non_blocking=True) for x in (ids, targets, index, mask))
        with self.recipe.forward_context(device):
            logp_all = model.target_logprobs(
                ids, targets, self._head, temperature=self.temperature, packed=PackedRows(tuple(lengths))
            )
        return logp_all[0][index] * mask, mask


def filler_rows(tokens: int, max_positions: int) -> list[int]:
    """The lengths of the pad rows that fill a compiled packed micro-batch up to its token budget
    (one static shape): none longer than the model's positions, since each is a sequence of its
    own. One filler row of the whole gap failed every step whose rows left more than
    maxSequenceLength of a larger maxTokensPerMicroBatch empty (found on an H100, 2026-12-06)."""
    full, rest = divmod(tokens, max_positions)
    return [max_positions] * full + ([rest] if rest else [])


def matmul_params(model: CausalLM) -> int:
    """Parameters that take part in a matmul per token: all but the embedding tables' lookups
    (a tied table is the output head too, so it counts once).

    6 x this x tokens is the training FLOP count MFU uses (the 27% baseline used the same N).
    """
    decoder = model.model
    lookups = 0 if model.cfg.tie_word_embeddings else decoder.embed_tokens.weight.numel()
    if decoder.embed_positions is not None:
        lookups += decoder.embed_positions.weight.numel()
    return sum(p.numel() for p in model.parameters()) - lookups
