"""The Megatron-core policy backend: `PolicyWorker` on a tensor-parallel `GPTModel`.

Same contract as `policy.TorchPolicyWorker` (read its module docstring first), and the same step
accounting (`policy.StepAccumulator`): `train_chunk` accumulates unnormalized gradient sums;
`finish_step` does one reduce over the data-parallel group, scales by the global token (or
sequence) count, clips the global gradient norm and steps AdamW. What Megatron adds is tensor
parallelism (TP): every layer's weight matrices are split over the TP ranks of one data-parallel
replica, which all see the same rows.

- The model is a `GPTModel` with the local (non-TransformerEngine) layer spec and no fused kernels
  (no TE, no apex on the GPU image), shaped exactly like `CausalLM` for every model the network
  runs (Qwen2/2.5, Qwen3, Llama 3, the tiny model; see `build_gpt_model`), and initialised from
  `ModelBuild.instantiate()` (the tiny model's seeded weights or the pretrained checkpoint's)
  through `megatron_mapping`, sharded over TP, so policy and generation engines start identical,
  and `weights()` hands the engines CausalLM's names.
- Log-probs are computed on the vocab-parallel logits with Megatron's vocab-parallel cross entropy
  (no rank ever materialises the full vocabulary), at the same temperature and with the same
  response masking as `sampling.token_logprobs`.
- The gradient norm is the norm of the whole model's gradient: TP-split parameters contribute
  their shards from every rank, replicated ones (norm weights) once. Qwen3's q/k norms are the one
  replicated weight whose gradient each rank holds only in part (its own heads'): it is summed
  over the TP group first.
- A checkpoint is one file per TP rank of replica 0 (`policy-tp{rank}.pt`, Megatron's names and
  shards, the optimizer's state), plus for a pretrained model the Hugging Face directory `hf/`
  that TP rank 0 writes from the gathered weights, as the torch backend does.
- Global ranks are laid out TP-fastest (Megatron's order): rank r is TP rank r % TP of data-parallel
  replica r // TP. `megatron_workers.MegatronPolicyGroup` hands rows out accordingly.

Not supported: pipeline parallelism (it needs Megatron's pipeline schedules, which this worker
does not drive) and context parallelism (the local layer spec has no context-parallel attention;
Megatron implements it only in TransformerEngine's attention). Both are rejected with the spec
field named.

CPU: megatron-core is a GPU library, but with gloo process groups and CPU initialisation the
local spec runs on CPU except for a few unconditional `torch.cuda.current_device()` calls
(RotaryEmbedding.get_emb moves its frequency table there; the global memory buffer and the
tensor-parallel gathers allocate there). `_cuda_calls_on_cpu` points those at the CPU while a
CPU worker computes, which is what lets the tests compare this backend with the torch one on CPU.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from asyncgrpo_trainer import checkpoint
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import megatron_mapping as mapping
from asyncgrpo_trainer.backends.policy import (
    OptimConfig,
    PolicyWorker,
    StepAccumulator,
    TrainRow,
    cpu_copy,
    hf_export,
    load_optimizer,
    optimizer_step,
)
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.recipe import DTYPES, ModelBuild

MEGATRON = "spec.trainer.policy.megatron"


@dataclass(frozen=True)
class MegatronLayout:
    """The parallel layout of `spec.trainer.policy.megatron`."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1

    def check(self, build: ModelBuild, world_size: int) -> None:
        """Reject what this backend cannot run, naming the spec field (before any process group forms)."""
        if self.pipeline_parallel_size != 1:
            raise ValueError(
                f"{MEGATRON}.pipelineParallelSize must be 1: the Megatron policy backend does not run "
                f"pipeline parallelism yet; got {self.pipeline_parallel_size}"
            )
        if self.context_parallel_size != 1:
            raise ValueError(
                f"{MEGATRON}.contextParallelSize must be 1: context parallelism needs TransformerEngine's "
                f"attention, which the trainer image does not ship; got {self.context_parallel_size}"
            )
        tp, cfg = self.tensor_parallel_size, build.config
        if cfg.o_bias != cfg.mlp_bias or (cfg.o_bias and not cfg.qkv_bias):
            # Megatron has one switch (add_bias_linear) for the o_proj and MLP biases, and it
            # implies the q/k/v bias; the layer spec cannot give one of them a bias alone.
            raise InvalidModelError(
                "spec.trainer.policy.backend megatron cannot run this model: config.json gives the o_proj "
                f"a bias: {cfg.o_bias} (attention_bias) and the MLP a bias: {cfg.mlp_bias} (mlp_bias), and "
                "Megatron-core has one switch for both (add_bias_linear, which biases q/k/v too); use "
                "policy.backend torch for this checkpoint"
            )
        if world_size % tp:
            raise ValueError(f"{MEGATRON}.tensorParallelSize {tp} must divide the {world_size} policy ranks")
        if cfg.num_heads % tp or (cfg.num_kv_heads % tp and tp % cfg.num_kv_heads):
            # A checkpoint's head counts are known only from its config.json, after admission.
            error = ValueError if build.checkpoint is None else InvalidModelError
            raise error(
                f"{MEGATRON}.tensorParallelSize {tp} must divide the model's {cfg.num_heads} attention heads "
                f"and divide or be a multiple of its {cfg.num_kv_heads} key/value heads"
            )


@contextlib.contextmanager
def _cuda_calls_on_cpu(device: torch.device) -> Iterator[None]:
    """On a CPU worker, answer megatron-core's unconditional torch.cuda.current_device() with the CPU."""
    if device.type != "cpu":
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.current_device = original


def _import_megatron() -> Any:
    """megatron.core, imported on first use (the package never imports it otherwise); its warnings
    about missing TransformerEngine/apex are expected with the local spec and silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: PLC0415
        import megatron.core.models.gpt.gpt_model  # noqa: PLC0415
        import megatron.core.parallel_state  # noqa: PLC0415
        import megatron.core.tensor_parallel  # noqa: PLC0415
        import megatron.core.transformer.transformer_config  # noqa: PLC0415

    return megatron.core


def build_gpt_model(build: ModelBuild, tensor_parallel_size: int, device: torch.device) -> torch.nn.Module:
    """A GPTModel shaped like `build`'s CausalLM (parameters uninitialised; `megatron_mapping`
    names what goes where).

    The config's parts map onto Megatron's switches: q/k/v bias -> add_qkv_bias, o_proj and MLP
    biases -> add_bias_linear (`MegatronLayout.check` refuses them apart), Qwen3's per-head q/k
    RMSNorm -> qk_layernorm (the local spec's norms over head_dim), tied embeddings ->
    share_embeddings_and_output_weights, learned positions -> "learned_absolute". RoPE: the
    rotation is the checkpoint's own frequencies (scaled variants included), not Megatron's from a
    base: `rotary_pos_emb.inv_freq` is what RotaryEmbedding.forward reads on every call (it is not
    a buffer and nothing precomputes from it before the first forward). Yarn's attention factor s
    multiplies cos and sin, i.e. q and k, so it is the softmax scale s^2 / sqrt(head_dim).

    Needs `parallel_state.initialize_model_parallel` to have run.
    """
    core = _import_megatron()
    cfg = build.config
    dtype = DTYPES[build.dtype]
    rope = cfg.position_embedding == "rope"
    with warnings.catch_warnings():
        # Deprecation notes ("GPTModel is deprecated": HybridModel needs TE for this shape; cuda
        # graph scopes this model does not use).
        warnings.simplefilter("ignore")
        config = core.transformer.transformer_config.TransformerConfig(
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_heads,
            num_query_groups=cfg.num_kv_heads,
            kv_channels=cfg.head_dim,
            ffn_hidden_size=cfg.intermediate_size,
            normalization="RMSNorm",
            layernorm_epsilon=cfg.rms_norm_eps,
            add_bias_linear=cfg.o_bias,
            add_qkv_bias=cfg.qkv_bias,
            qk_layernorm=cfg.qk_norm,
            softmax_scale=cfg.rope_attention_scaling**2 / math.sqrt(cfg.head_dim),
            gated_linear_unit=True,
            activation_func=F.silu,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            tensor_model_parallel_size=tensor_parallel_size,
            params_dtype=dtype,
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            attention_softmax_in_fp32=True,
            use_cpu_initialization=device.type == "cpu",
            perform_initialization=False,
            # No apex / TransformerEngine / compiled Megatron kernels on the image: plain torch paths.
            masked_softmax_fusion=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            persist_layer_norm=False,
        )
        model: torch.nn.Module = core.models.gpt.gpt_model.GPTModel(
            config,
            transformer_layer_spec=core.models.gpt.gpt_layer_specs.get_gpt_layer_local_spec(
                normalization="RMSNorm", qk_layernorm=cfg.qk_norm
            ),
            vocab_size=mapping.padded_vocab_size(cfg.vocab_size, tensor_parallel_size),
            max_sequence_length=cfg.max_positions,
            share_embeddings_and_output_weights=cfg.tie_word_embeddings,
            position_embedding_type="rope" if rope else "learned_absolute",
            rotary_percent=1.0,
        )
    if rope:
        rotary: Any = model.rotary_pos_emb
        rotary.inv_freq = torch.tensor(cfg.rope_inv_freq, dtype=torch.float32, device=device)
    # The local spec's norms are torch.nn.RMSNorm in fp32 whatever params_dtype says; the whole
    # model in the recipe's dtype is what Megatron's Float16Module does and what the engines hold.
    return model.to(device=device, dtype=dtype)


class MegatronPolicyWorker(PolicyWorker):
    """One rank of the Megatron policy; see the module docstring."""

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
        layout: MegatronLayout | None = None,
        num_threads: int = 1,
    ) -> None:
        layout = layout or MegatronLayout()
        layout.check(build, world_size)
        torch.set_num_threads(num_threads)
        self.build, self.optim_cfg, self.loss_cfg = build, optim, loss
        self.rank, self.world_size = rank, world_size
        self.tp = layout.tensor_parallel_size
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)
            self.device = torch.device("cuda", torch.cuda.current_device())
        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            init = rendezvous or _local_rendezvous(world_size)
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size)
        self.core = _import_megatron()
        ps = self.core.parallel_state
        with _cuda_calls_on_cpu(self.device):
            # Dropout is 0 everywhere, so the model-parallel CUDA RNG is never drawn from; the
            # inference tracker's no-op fork keeps CPU workers off torch.cuda's RNG.
            self.core.tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)
            # Extra gloo groups only serve Megatron's distributed optimizer, which is not used here.
            ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, create_gloo_process_groups=False)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.tp_rank = int(ps.get_tensor_model_parallel_rank())
        self.dp_group = ps.get_data_parallel_group()
        self.dp_size = int(ps.get_data_parallel_world_size())
        self.vocab_size = build.config.vocab_size
        self.reference: torch.nn.Module | None = None
        with _cuda_calls_on_cpu(self.device):
            initial = self._initial_shards()
            self.model = self._model_of(initial).train()
            if loss.reference_policy_kl_penalty > 0:
                self.reference = self._model_of(initial).eval().requires_grad_(False)
            del initial
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.learning_rate, weight_decay=optim.weight_decay
        )
        self.steps_taken = 0
        self.busy_seconds = 0.0
        self._reset_step()

    def _initial_shards(self) -> dict[str, torch.Tensor]:
        """This rank's shards (Megatron names) of the recipe's initial CausalLM weights: the tiny
        model's seeded ones, or the pretrained checkpoint's, read once for the model and the
        reference."""
        cfg = self.build.config
        full = mapping.from_network(
            self.build.instantiate().state_dict(),
            cfg,
            padded_vocab=mapping.padded_vocab_size(cfg.vocab_size, self.tp),
        )
        return {name: mapping.shard(name, t, rank=self.tp_rank, size=self.tp) for name, t in full.items()}

    def _model_of(self, shards: dict[str, torch.Tensor]) -> torch.nn.Module:
        """A GPTModel holding `shards` (copies: the model and the reference never share storage)."""
        model = build_gpt_model(self.build, self.tp, self.device)
        params = dict(model.named_parameters())
        if params.keys() != shards.keys():  # e.g. a megatron-core release that renamed a module
            raise RuntimeError(
                f"megatron-core's GPTModel and megatron_mapping disagree on the parameters: "
                f"{sorted(params.keys() ^ shards.keys())[:6]}"
            )
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(shards[name])
        return model

    def _reset_step(self) -> None:
        self._step = StepAccumulator(self.loss_cfg, self.device)
        self.optimizer.zero_grad(set_to_none=True)

    # --- log-probs ------------------------------------------------------------------------------

    def token_logprobs(
        self, model: torch.nn.Module, rows: Sequence[tuple[Sequence[int], Sequence[int]]], *, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (B, R) of each row's response tokens and the response mask (B, R); the same
        quantity as `sampling.token_logprobs`, from vocab-parallel logits."""
        full = [list(p) + list(r) for p, r in rows]
        length = max(*(len(x) for x in full), 2)
        if length > self.build.max_positions:
            raise ValueError(
                f"sequence of {length} tokens exceeds maxSequenceLength {self.build.max_positions}"
            )
        ids = torch.full((len(rows), length), self.build.pad_id, dtype=torch.long)
        for i, seq in enumerate(full):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        ids = ids.to(self.device)
        r_max = max(*(len(r) for _, r in rows), 1)
        index = torch.zeros((len(rows), r_max), dtype=torch.long)
        mask = torch.zeros((len(rows), r_max))
        for i, (p, r) in enumerate(rows):
            if r:
                index[i, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
                mask[i, : len(r)] = 1.0
        index, mask = index.to(self.device), mask.to(self.device)
        with torch.set_grad_enabled(grad):
            # next_logp[b, t] = log p(ids[b, t + 1] | ids[b, : t + 1])
            next_logp = self._next_token_logprobs(model, ids)
            out = next_logp.gather(1, index.clamp(max=length - 2)) * mask
        return out, mask

    def forward_logits(self, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary shard of the logits (B, T, V_padded / TP) of token ids (B, T)."""
        b, t = ids.shape
        positions = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, -1)
        # An explicit mask: Megatron builds its default causal mask on "cuda" unconditionally.
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), diagonal=1)
        with _cuda_calls_on_cpu(self.device):
            logits: torch.Tensor = model(ids, positions, causal.view(1, 1, t, t))
        return logits

    def _next_token_logprobs(self, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        logits = self.forward_logits(model, ids)
        temp = self.optim_cfg.temperature if self.optim_cfg.temperature > 0 else 1.0
        logits = logits[:, :-1].float() / temp
        width = logits.shape[-1]
        vocab_ids = torch.arange(self.tp_rank * width, (self.tp_rank + 1) * width, device=ids.device)
        if int(vocab_ids[-1]) >= self.vocab_size:  # padding rows of the last shard: no probability
            logits = logits.masked_fill(vocab_ids >= self.vocab_size, float("-inf"))
        nll: torch.Tensor = self.core.tensor_parallel.vocab_parallel_cross_entropy(
            logits.contiguous(), ids[:, 1:].contiguous()
        )
        return -nll

    def reference_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        if self.reference is None:
            raise RuntimeError("reference log-probs requested but the KL penalty is off")
        t0 = time.perf_counter()
        out: list[list[float]] = []
        size = self.optim_cfg.logprob_batch_size
        with _cuda_calls_on_cpu(self.device):
            for i in range(0, len(rows), size):
                part = rows[i : i + size]
                lp, _ = self.token_logprobs(self.reference, part, grad=False)
                out.extend(lp[j, : len(r)].tolist() for j, (_, r) in enumerate(part))
        self.busy_seconds += time.perf_counter() - t0
        return out

    # --- training -------------------------------------------------------------------------------

    def train_chunk(self, rows: list[TrainRow]) -> dict[str, float]:
        """Queue forward/backward of the rows; the metrics come from `finish_step`."""
        t0 = time.perf_counter()
        size = self.optim_cfg.micro_batch_size
        with _cuda_calls_on_cpu(self.device):
            for i in range(0, len(rows), size):
                self._train_micro(rows[i : i + size])
        self.busy_seconds += time.perf_counter() - t0
        return {}

    def _train_micro(self, rows: list[TrainRow]) -> None:
        logp, mask = self.token_logprobs(
            self.model, [(r.prompt_ids, r.response_ids) for r in rows], grad=True
        )
        self._step.backward(rows, logp, mask)

    def finish_step(self) -> dict[str, float | None]:
        t0 = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        # The reduce runs over the replicas only: the TP peers of a replica saw the same rows.
        totals = self._step.reduce(params, self.dp_group if self.dp_size > 1 else None)
        self._sum_qk_norm_grads()
        grad_norm = self._clip(params)
        lr = optimizer_step(self.optimizer, self.optim_cfg, self.steps_taken)
        self.steps_taken += 1
        out = totals.metrics(grad_norm=grad_norm, lr=lr)
        self._reset_step()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def _sum_qk_norm_grads(self) -> None:
        """Sum the q/k RMSNorm gradients over the TP group (as Megatron's finalize_model_grads does).

        Those weights are replicated, but each rank normalises only its own heads, so each holds the
        gradient of its heads' share; every other replicated weight sees the whole (all-reduced)
        activation and already holds the full gradient."""
        if self.tp == 1 or not self.build.config.qk_norm:
            return
        grads = [
            p.grad
            for name, p in self.model.named_parameters()
            if name.endswith(mapping.QK_NORMS) and p.grad is not None
        ]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.tp_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _clip(self, params: list[torch.nn.Parameter]) -> float:
        """Norm of the whole model's gradient over the TP group, and clip to max_grad_norm the way
        torch.nn.utils.clip_grad_norm_ does (scale by min(1, max / (norm + 1e-6))).

        Split parameters count on every TP rank, replicated ones on TP rank 0 only. Which is which
        comes from the mapping's names: Megatron tags its split parameters only when it initialises
        them itself, which this worker skips (the weights come from the recipe).
        """
        square = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is not None and p.requires_grad and (self.tp_rank == 0 or mapping.is_split(name)):
                square += p.grad.double().pow(2).sum()
        if self.tp > 1:
            dist.all_reduce(square, group=self.tp_group)
        norm = float(square.sqrt())
        max_norm = self.optim_cfg.max_grad_norm
        if max_norm is not None:
            coef = min(max_norm / (norm + 1e-6), 1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    # --- weights and checkpoints -----------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """CausalLM-named CPU weights on TP rank 0 ({} on the others). A collective over the TP
        group: every TP rank of the replica must call it."""
        return self.full_weights(torch.device("cpu"))

    def full_weights(self, device: torch.device) -> dict[str, torch.Tensor]:
        """`weights` on `device` (this worker's own for the broadcast refit: no host copy)."""
        full: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                local = param.detach().contiguous()
                if self.tp > 1:
                    shards = [torch.empty_like(local) for _ in range(self.tp)]
                    dist.all_gather(shards, local, group=self.tp_group)
                    local = mapping.unshard(name, shards)
                if self.tp_rank == 0:
                    full[name] = local.to(device, copy=True)
        return mapping.to_network(full, self.build.config) if self.tp_rank == 0 else {}

    def state(self) -> dict[str, Any]:
        """What `save` writes: this rank's shard of the parameters (Megatron names), optimizer,
        step count and reference, all on the CPU."""
        return {
            "tensor_parallel": (self.tp_rank, self.tp),
            "model": _cpu_params(self.model),
            "optimizer": cpu_copy(self.optimizer.state_dict()),
            "steps_taken": self.steps_taken,
            "reference": None if self.reference is None else _cpu_params(self.reference),
        }

    def save(self, directory: str) -> dict[str, Any]:
        """Write `policy-tp{TP rank}.pt`, and for a pretrained model the Hugging Face directory
        `hf`, which TP rank 0 writes from the weights every TP rank joins in gathering (the group
        calls the TP ranks of replica 0: the other replicas hold the same shards)."""
        returned = checkpoint.write_or_return(Path(directory) / shard_file(self.tp_rank), self.state())
        if self.build.checkpoint is None:
            return returned
        weights = self.weights()  # a collective over the TP group; TP rank 0 gets them
        export = hf_export(self.build, weights) if self.tp_rank == 0 else None
        if export is not None:
            returned |= checkpoint.write_or_return(Path(directory) / checkpoint.HF_DIR, export)
        return returned

    def load(self, directory: str) -> None:
        path = Path(directory) / shard_file(self.tp_rank)
        state = checkpoint.read(
            path,
            fix=f"the Megatron policy backend writes one per tensor-parallel rank; resume with the "
            f"spec.trainer.policy.backend and {MEGATRON}.tensorParallelSize it was written with",
            mmap=self.device.type != "cpu",
        )
        written = tuple(state["tensor_parallel"])
        if written != (self.tp_rank, self.tp):
            raise ValueError(
                f"checkpoint shard {path} is tensor-parallel rank/size {written}, this worker is "
                f"{(self.tp_rank, self.tp)}: resume with the same {MEGATRON}.tensorParallelSize"
            )
        _load_params(self.model, state["model"])
        load_optimizer(self.optimizer, state["optimizer"])
        self.steps_taken = int(state["steps_taken"])
        if self.reference is not None and state.get("reference") is not None:
            _load_params(self.reference, state["reference"])
        self._reset_step()

    def busy(self) -> float:
        return self.busy_seconds

    def shutdown(self) -> None:
        self.core.parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def shard_file(tp_rank: int) -> str:
    """A tensor-parallel rank's file in a checkpoint directory (`checkpoint`)."""
    return f"policy-tp{tp_rank}.pt"


def _cpu_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.named_parameters()}


def _load_params(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(params[name])


def _local_rendezvous(world_size: int) -> str:
    """A file store for a single-process group (Megatron's parallel state needs one). Not a TCP
    port: a free port picked here can be taken by another process before the group listens on it
    (EADDRINUSE in a CI run beside other tests)."""
    if world_size != 1:
        raise ValueError("Megatron policy ranks need a rendezvous address when there is more than one")
    return f"file://{tempfile.mkdtemp(prefix='asyncgrpo-megatron-')}/store"


def read_full_weights(step: Path, build: ModelBuild) -> dict[str, torch.Tensor]:
    """The network's weights (Hugging Face names) from a checkpoint's `policy-tp*.pt` shards:
    every tensor-parallel rank's file, reassembled (for `asyncgrpo export`, no process group)."""
    first = checkpoint.read(
        step / shard_file(0), fix="the checkpoint was not written by the Megatron backend"
    )
    size = int(first["tensor_parallel"][1])
    shards = [first["model"]] + [
        checkpoint.read(step / shard_file(r), fix=f"the Megatron backend writes {size} shard files")["model"]
        for r in range(1, size)
    ]
    full = {name: mapping.unshard(name, [s[name] for s in shards]) for name in shards[0]}
    return mapping.to_network(full, build.config)
