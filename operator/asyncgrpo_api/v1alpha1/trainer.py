"""The trainer block: everything the single-controller async GRPO driver reads from a job.

P = grpo.numPromptsPerStep, N = grpo.numGenerationsPerPrompt, S = asyncRL.maxStalenessVersions.
Cross-field invariants live in asyncgrpo_api.rules so the webhook, the CLI and the trainer report
them identically.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from asyncgrpo_api.v1alpha1.base import AbsolutePath, ApiModel

DataKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]
"""A column of a data file (a key of a JSON row)."""
RewardFunction = Annotated[str, StringConstraints(min_length=3, max_length=512)]
EnvClass = Annotated[str, StringConstraints(min_length=3, max_length=512)]
FunctionScope = Literal["response", "group"]
"""How env.function is called: once per response, or once per prompt group with all its responses."""
DEFAULT_MAX_TURNS = 4
"""env.maxTurns of a multi-turn environment when the job leaves it unset."""
"""\"package.module:function\"; its shape is checked by asyncgrpo_api.rules (with a message that says how)."""


class TinyModelSpec(ApiModel):
    """A small Qwen2-shaped decoder built locally from this config (no download)."""

    hidden_size: int = Field(default=64, ge=8, le=16384, description="Model width.")
    num_layers: int = Field(default=2, ge=1, le=256, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, le=256, description="Attention heads.")
    num_kv_heads: int = Field(
        default=2, ge=1, le=256, description="Key/value heads (grouped-query attention)."
    )
    intermediate_size: int | None = Field(
        default=None, ge=8, le=65536, description="MLP width; unset uses 4 x hiddenSize."
    )
    position_embedding: Literal["learned", "rope"] = Field(
        default="learned",
        description="learned: absolute position embeddings (a 2-layer model learns position-sensitive "
        "tasks such as digit reversal from random weights with them); rope: rotary, as Qwen2 (learns "
        "such tasks far more slowly from random weights). Only rope models export to Hugging Face.",
    )


class ModelSpec(ApiModel):
    """The policy model: a pretrained checkpoint on a volume, or a tiny model built from a config."""

    source: Literal["tiny", "pretrained"] = Field(
        default="tiny",
        description="tiny: build a small model from `tiny` with random weights (CPU demos, tests); "
        "pretrained: load a Hugging Face checkpoint directory from `path`.",
    )
    path: AbsolutePath | None = Field(
        default=None,
        description="Directory of a Hugging Face checkpoint (config, tokenizer, weights), usually under "
        "storage.models.mountPath; required when source is pretrained. Nothing is downloaded.",
    )
    tiny: TinyModelSpec = Field(default_factory=TinyModelSpec, description="Shape of the tiny model.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Parameter dtype of the policy and generation copies."
    )
    max_sequence_length: int = Field(
        default=128, ge=8, le=1_048_576, description="Prompt plus response tokens, at most."
    )


class GRPOSpec(ApiModel):
    """The RL loop: how many prompts and samples make a step, and for how many steps."""

    num_prompts_per_step: int = Field(
        default=8, ge=1, le=65536, description="P: prompt groups trained on in one RL (optimizer) step."
    )
    num_generations_per_prompt: int = Field(
        default=8, ge=1, le=1024, description="N: samples per prompt; advantages are relative within a group."
    )
    max_num_steps: int = Field(default=100, ge=1, le=10_000_000, description="RL steps to train.")
    normalize_rewards: bool = Field(
        default=True, description="Divide advantages by the group's reward standard deviation."
    )
    use_leave_one_out_baseline: bool = Field(
        default=True, description="Baseline each sample with the mean reward of the other N-1 samples."
    )
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for data order, sampling and init.")
    val_period: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Validate every N steps, and once before the first; 0 validates only at the end.",
    )
    val_at_end: bool = Field(default=True, description="Validate once after the last step.")
    dynamic_sampling: bool = Field(
        default=False,
        description="DAPO's dynamic sampling: a prompt group whose N samples all got the same reward "
        "(zero advantage, no gradient) is dropped and a group of the next prompt is generated in its "
        "place, so that each step trains on P groups that carry a gradient, up to "
        "dynamicSamplingMaxExtraGroups replacements per step. Needs numGenerationsPerPrompt >= 2.",
    )
    dynamic_sampling_max_extra_groups: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="The most groups dynamic sampling drops and replaces for one step. Once a step has "
        "dropped that many, it keeps the groups still to come as they are, equal rewards included "
        "(no gradient from them: plain GRPO for the rest of that step), and its step record says "
        "dynamic_sampling_cap_hit. Unset means numPromptsPerStep (at most twice the step's groups "
        "generated).",
    )
    overlong_penalty_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="DAPO's soft overlong punishment: the length L_cache of a band just below "
        "generation.maxNewTokens (L_max) in which a response's reward is lowered linearly, from 0 at "
        "L_max - L_cache tokens to -1 at L_max (a response cut at maxNewTokens gets -1), before "
        "advantages are computed. At most generation.maxNewTokens. Unset: no length penalty.",
    )


class AsyncRLSpec(ApiModel):
    """Asynchrony: how far rollouts may lag the trainer and how the two pumps are gated.

    The four modes and their invariants are in docs/guides/async-modes.md.
    """

    max_staleness_versions: int = Field(
        default=1,
        ge=0,
        le=64,
        description="S: the most policy versions a trained-on rollout may lag; older data is evicted. "
        "0 is synchronous on-policy training.",
    )
    over_sampling: bool = Field(
        default=False,
        description="Keep dispatching rollouts without waiting for the trainer; data that ages past S "
        "is wasted. False gates one dispatch batch per trainer version.",
    )
    force_in_order: bool | None = Field(
        default=None,
        description="Train step t only on the batch dispatched for step t (exact batch-to-step "
        "matching). Only with overSampling false; ignored in sync mode. Unset means true when "
        "overSampling is false and false when it is true.",
    )
    min_groups_for_streaming_train: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Prompt groups the trainer waits for before it streams a chunk into the current "
        "step; at most P. Unset means P (one chunk per step).",
    )
    max_buffered_rollouts: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Prompt groups in flight or waiting to be trained on (backpressure). Must be "
        "P x (S+1) when overSampling is false, at least that when true. Unset means P x (S+1).",
    )
    max_inflight_prompts: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Prompt groups generating at once; unset means maxBufferedRollouts.",
    )
    drain_before_refit: bool | None = Field(
        default=None,
        description="Before a weight update, wait for in-flight rollouts to finish so that every "
        "rollout comes from exactly one policy version (costs generation idle time). Unset means true "
        "in async-in-order mode (forceInOrder, S >= 1), where it makes the schedule exact: batch k "
        "comes from weights k - S whatever the machine's load, so a seeded run repeats; false otherwise.",
    )
    rollout_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Deadline of one prompt group's generation; a group past it is retried. Scoring has its "
        "own deadline, env.timeoutSeconds.",
    )
    max_rollout_attempts: int = Field(
        default=3, ge=1, le=100, description="Attempts per prompt group before the run fails."
    )
    stall_timeout_seconds: float = Field(
        default=600,
        gt=0,
        le=604_800,
        description="Watchdog: fail the run when neither pump made progress for this long.",
    )


class LossSpec(ApiModel):
    """The clipped policy-gradient loss with importance-sampling correction for stale data."""

    ratio_clip_min: float = Field(default=0.2, ge=0, le=10, description="Lower clip: ratio >= 1 - this.")
    ratio_clip_max: float = Field(default=0.28, ge=0, le=10, description="Upper clip: ratio <= 1 + this.")
    ratio_clip_c: float | None = Field(
        default=None, gt=1, le=100, description="Dual-clip constant for negative advantages (> 1); unset off."
    )
    use_importance_sampling_correction: bool = Field(
        default=True,
        description="Weight each token by pi_old / pi_generation (truncated by "
        "truncatedImportanceSamplingType): on a sample of the weights being trained it corrects the "
        "engine's numerics against the policy's, on an older one (importanceSamplingOnStaleData) also the "
        "policy's change since the sample was drawn.",
    )
    truncated_importance_sampling_ratio: float | None = Field(
        default=2.0,
        gt=0,
        le=1000,
        description="Upper bound of the importance weight (see truncatedImportanceSamplingType); unset "
        "leaves it uncapped (tis only).",
    )
    truncated_importance_sampling_ratio_min: float | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Lower bound of the importance weight; unset means 0 with tis. Required by icepop "
        "and seq-mask-tis.",
    )
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] = Field(
        default="tis",
        description="What a weight outside [truncatedImportanceSamplingRatioMin, "
        "truncatedImportanceSamplingRatio] becomes, as in NeMo-RL. tis: clamped into the bounds; "
        "icepop (masked IS): 0, so that token (per sequence with sequenceLevelImportanceRatios: that "
        "sequence) adds nothing; seq-mask-tis: a sequence whose geometric-mean token weight is outside "
        "the bounds is dropped whole, the others keep their untruncated token weights.",
    )
    sequence_level_importance_ratios: bool = Field(
        default=False,
        description="GSPO: one ratio per sequence, the geometric mean of its token ratios pi_theta / "
        "pi_old, clipped as a whole, and one importance weight per sequence, its likelihood ratio "
        "pi_old / pi_generation (truncated as truncatedImportanceSamplingType says). Needs "
        "tokenLevelLoss false.",
    )
    importance_sampling_on_stale_data: bool | None = Field(
        default=None,
        description="Also weight a sample that older weights generated (asynchronous modes) by pi_old / "
        "pi_generation; false weighs it 1, as a one-step-off trainer without behaviour correction does, "
        "and a sample of the weights being trained keeps its weight. Unset means false for a pretrained "
        "checkpoint and true for the tiny model from random weights. Measured with one step of "
        "staleness (docs/benchmarks.md, issue 46): on the warm-started real-model case (async-in-order, "
        "5 seeds) true learned at 0.42x sync's area under held-out accuracy and false at 0.92x; on the "
        "calculator tool task both at 0.95-1.00x; on the tiny model's reversal task false left a seeded "
        "run at 0.67 held-out where true reached 0.8.",
    )
    reference_policy_kl_penalty: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="beta of the KL(pi || pi_ref) term; 0 skips reference log-probs.",
    )
    kl_type: Literal["k1", "k2", "k3"] = Field(default="k3", description="KL estimator.")
    token_level_loss: bool = Field(
        default=True,
        description="Average over all tokens of the step (true) or per sequence then over sequences.",
    )
    constant_normalizer: bool = Field(
        default=False,
        description="Dr. GRPO: divide the step's summed token loss by its number of samples x "
        "generation.maxNewTokens, a constant, instead of its actual token count, so that shorter "
        "responses do not get larger per-token gradients. Needs tokenLevelLoss true.",
    )


class LogprobGateSpec(ApiModel):
    """The generation engine's log-prob gate (status.progress and /metrics: genLogprobError): the
    mean over the tokens each step's own weights generated of exp|log pi_engine - log pi_policy|,
    1 when the engine samples exactly the policy's distribution."""

    threshold: float | None = Field(
        default=1.1,
        ge=1,
        le=1000,
        description="Above this for `steps` measured steps in a row, the job's LogprobMismatch condition "
        "turns True (with a Warning event). NeMo-RL's bar is 1.1 in bf16; unset turns the gate off.",
    )
    steps: int = Field(
        default=5,
        ge=1,
        le=100_000,
        description="Consecutive measured steps (steps with samples of their own weights) above the "
        "threshold that trip the gate.",
    )
    fail_job: bool = Field(
        default=False,
        description="Fail the job (TrainingError, not retried) when the gate trips, instead of only "
        "setting the condition.",
    )


class ShardingSpec(ApiModel):
    """How the torch policy backend lays its model out over its data-parallel ranks."""

    strategy: Literal["none", "fsdp"] = Field(
        default="none",
        description="none: every policy rank holds the whole model, its gradients and the optimizer state, "
        "and the gradients are all-reduced once per step. fsdp: PyTorch FSDP2 (fully_shard per decoder "
        "layer) shards all three over the ranks, gathering one layer's weights at a time in model.dtype "
        "and reducing gradients in float32: the same step (in float32, equal to none's up to summation "
        "order), for models that do not fit one GPU with AdamW. Checkpoints are the same files either "
        "way. torch backend only.",
    )
    cpu_offload: bool = Field(
        default=False,
        description="With strategy fsdp on GPUs: keep the sharded weights, gradients and optimizer state in "
        "host memory and run the AdamW step on the CPU (FSDP2's CPUOffloadPolicy), leaving the GPU the "
        "gathered layers and the activations; slower steps. On CPU policy workers it changes nothing.",
    )


LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""A decoder layer's linear projection, by its Hugging Face name."""
LORA_TARGETS: list[LoraTarget] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSpec(ApiModel):
    """Low-rank adapters (LoRA) in place of full fine-tuning."""

    rank: int = Field(
        default=16, ge=1, le=512, description="The adapters' rank r (vLLM serves ranks up to 512)."
    )
    alpha: float = Field(
        default=16.0,
        gt=0,
        le=100_000,
        description="The adapters' scale is alpha / rank (PEFT's lora_alpha; no rsLoRA).",
    )
    target_modules: list[LoraTarget] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        max_length=7,
        description="The projections of every decoder layer that get an adapter (PEFT's target_modules).",
    )


class MegatronSpec(ApiModel):
    """Model-parallel layout of the Megatron-core policy backend."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="Tensor-parallel ranks.")
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64, description="Pipeline stages.")
    context_parallel_size: int = Field(default=1, ge=1, le=64, description="Context-parallel ranks.")


class PolicySpec(ApiModel):
    """The training side: backend, batch sizes and optimizer."""

    backend: Literal["torch", "megatron"] = Field(
        default="torch", description="torch runs on CPU or CUDA (data parallel); megatron needs GPUs."
    )
    train_global_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="Samples per optimizer step. P x N must be a multiple of it: an RL step then takes "
        "P x N / this optimizer steps (PPO mini-batches, consecutive slices of the step's samples), all "
        "with pi_old from before the first, so the ratio clip (loss.ratioClipMin/Max) and the dual "
        "clip (ratioClipC) act from the second on. Unset means P x N: one optimizer step per RL step.",
    )
    train_micro_batch_size: int = Field(
        default=8, ge=1, le=65536, description="Samples per forward/backward pass (gradient accumulation)."
    )
    logprob_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Samples per log-prob pass; unset means trainMicroBatchSize.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="Pack rows (prompt + response) end to end into micro-batches of at most this many "
        "tokens, with positions restarting and attention kept within each row, instead of padding "
        "trainMicroBatchSize rows to the longest; the log-prob passes pack the same way, and the "
        "data-parallel ranks get equal token counts instead of equal row counts. The loss and gradient "
        "are those of the padded micro-batches. At least data.maxPromptLength + generation.maxNewTokens "
        "(the longest row). Unset: trainMicroBatchSize and logprobBatchSize rows, right-padded. torch "
        "backend only.",
    )
    learning_rate: float = Field(default=1e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="AdamW weight decay.")
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, le=1e6, description="Clip the global gradient norm; unset disables clipping."
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Linear learning-rate warm-up, in optimizer steps (P x N / trainGlobalBatchSize per RL "
        "step).",
    )
    learning_rate_schedule: Literal["constant", "cosine"] = Field(
        default="constant",
        description="The rate after the warm-up. constant: learningRate to the end; cosine: down a half "
        "cosine from learningRate to minLearningRateRatio x learningRate at the last optimizer step "
        "(grpo.maxNumSteps x the optimizer steps per RL step), so late steps, when most groups carry "
        "no signal, are small.",
    )
    min_learning_rate_ratio: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="With learningRateSchedule cosine: the last step's rate as a fraction of learningRate.",
    )
    sharding: ShardingSpec = Field(
        default_factory=ShardingSpec,
        description="Sharding of the torch backend's model over the policy ranks (FSDP).",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Keep only each decoder layer's input for the backward pass and recompute the layer "
        "there (gradient checkpointing): about one more forward pass per step for the activations of "
        "one layer at a time instead of all of them; the gradients are unchanged. torch backend only.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Train low-rank adapters (LoRA) on frozen base weights instead of every weight: the "
        "optimizer holds the adapters only, a refit sends only them (the torch engine merges them into "
        "its weights, vLLM serves them as a LoRA adapter), and a checkpoint of a pretrained model holds "
        "the merged weights plus a PEFT adapter directory (hf/adapter). Unset: full fine-tuning. torch "
        "backend only, unsharded (sharding.strategy none), refit over the object store "
        "(weightSync.transport auto or object-store).",
    )
    megatron: MegatronSpec = Field(
        default_factory=MegatronSpec, description="Parallel layout when backend is megatron."
    )


class GenerationSpec(ApiModel):
    """The sampling side: backend and decoding settings."""

    backend: Literal["auto", "torch", "vllm"] = Field(
        default="auto",
        description="torch: the project's engine (CPU or CUDA; CUDA graphs on GPUs); vllm: vLLM 0.26 "
        "on the checkpoint of model.path (model.source pretrained), on GPUs or with vLLM's CPU build. "
        "auto: vllm for a pretrained checkpoint on GPUs whose responses end at end-of-sequence (there it "
        "generated 1.5-1.9x the torch engine's tokens/s: docs/benchmarks.md), torch otherwise (CPU, "
        "model.source tiny, ignoreEos).",
    )
    torch_decode: Literal["auto", "batched", "per-group"] = Field(
        default="auto",
        description="How the torch engine decodes (backend torch). batched: the prompt groups in flight "
        "are decoded together as one batch (the GPU path; on a 2-core CPU 5-6x the tokens/s of "
        "per-group), so a group's samples also depend on which groups share its batch. per-group: each "
        "group is decoded on its own from its own seed, with a prefix cache of prompt KV, so a run "
        "repeats its samples and learning curve (where the mode does not let timing pick the weights "
        "that sample a group: sync, or forceInOrder). auto: batched on GPUs, per-group on CPU.",
    )
    max_new_tokens: int = Field(default=16, ge=1, le=1_048_576, description="Response length cap.")
    temperature: float = Field(default=1.0, ge=0, le=10, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Nucleus sampling mass. Below 1 the policy scores each training sample once more under "
        "the same filter, so that the importance weight compares the engine's distribution with pi_old's.",
    )
    top_k: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Top-k sampling; unset off. Like topP, the importance weight then uses pi_old under the "
        "same filter.",
    )
    ignore_eos: bool = Field(
        default=False,
        description="Rollouts sample past the end-of-sequence token up to maxNewTokens (vLLM's "
        "ignore_eos), so every response is maxNewTokens long and counts as truncated: for throughput "
        "benchmarks, not for learning a task that must stop. Validation still stops at end-of-sequence.",
    )
    recompute_kv_cache_after_weight_updates: bool = Field(
        default=False,
        alias="recomputeKVCacheAfterWeightUpdates",
        description="In async modes, reset the generation prefix/KV cache after each weight update "
        "(always done in sync mode).",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="Tensor-parallel size of one generation engine (vllm)."
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of GPU memory vllm may take. Unset: 0.8 on GPUs of its own, 0.4 colocated "
        "(the policy rank keeps its weights, gradients and optimizer state in the rest).",
    )
    colocated: bool = Field(
        default=False,
        description="Run generation on the policy workers' GPUs (time-shared) instead of its own pool.",
    )
    sleep_while_training: bool = Field(
        default=False,
        description="Free the engine's memory while the policy trains, for a policy that shares its GPUs "
        "(colocated): vLLM sleeps (level 1: its KV cache is discarded and its weights move to host "
        "memory) and wakes before the refit; the torch engine drops its KV caches and batched decoders "
        "(rebuilt, CUDA graphs recaptured, by the next batch). The engine sleeps only while nothing "
        "generates (a validation in progress keeps it awake), so it needs asyncRL sync mode "
        "(maxStalenessVersions 0), and vLLM's sleep needs GPUs.",
    )


class WeightSyncSpec(ApiModel):
    """How new policy weights reach the generation workers after each step (refit)."""

    transport: Literal["auto", "nccl", "cuda-ipc", "object-store"] = Field(
        default="auto",
        description="auto: a bucketed NCCL broadcast between separate GPU pools, CUDA IPC between a "
        "torch policy rank and the engine colocated on its GPU, Ray's object store otherwise "
        "(CPU; a colocated Megatron policy). nccl: the broadcast, over NCCL when both pools have GPUs "
        "and over gloo when neither has (the same code); admission refuses it when only one has, and "
        "with generation colocated on GPUs.",
    )
    bucket_size_mb: int = Field(
        default=512,
        alias="bucketSizeMB",
        ge=1,
        le=65536,
        description="Tensors are sent in buckets of about this size.",
    )
    timeout_seconds: float = Field(default=600, gt=0, le=86_400, description="Deadline of one refit.")


class DataSpec(ApiModel):
    """Prompts and reference answers: the environment's built-in set, or data files on a volume.

    How files are read, which rows are skipped and how the reference answer is taken from a row:
    docs/guides/models.md#datasets.
    """

    train_path: AbsolutePath | None = Field(
        default=None,
        description="Training rows: a JSON Lines (.jsonl) or JSON (.json) file, a Parquet file (.parquet), "
        "or a directory written by the datasets library's save_to_disk; unset uses the environment's "
        "built-in set.",
    )
    validation_path: AbsolutePath | None = Field(
        default=None,
        description="Held-out rows, in the formats of trainPath; unset holds out numValidationPrompts rows "
        "of trainPath (never trained on), or uses the built-in validation set without trainPath.",
    )
    prompt_key: DataKey = Field(
        default="prompt",
        description="Column (key) of a row holding the prompt, e.g. question: text, or chat messages (a list "
        "of {role, content}, as in verl's prompt column; turns after the last user turn are left out). A "
        "dotted path reaches into nested objects and lists (messages).",
    )
    answer_key: DataKey = Field(
        default="answer",
        description="Column (key) of a row holding the reference answer, text or a number, e.g. solution, "
        "reward_model.ground_truth (verl's files) or messages.1.content (NeMo-RL's); a dotted path reaches "
        "into nested objects and lists. The environment takes the answer from it (gsm8k: the number after "
        "####; math: the last \\boxed{}).",
    )
    num_validation_prompts: int = Field(
        default=32, ge=0, le=1_000_000, description="Held-out prompts scored at each validation."
    )
    shuffle: bool = Field(default=True, description="Shuffle the training prompts every epoch.")
    max_prompt_length: int = Field(
        default=64, ge=1, le=1_048_576, description="Prompts longer than this (in tokens) are skipped."
    )
    chat_template: bool | None = Field(
        default=None,
        description="Wrap each prompt in the checkpoint tokenizer's chat template (one user turn, or the "
        "row's chat messages; generation prompt appended); without it a chat prompt must be one user turn. "
        "Unset: true when the tokenizer has a template. Pretrained models only; the tiny model's character "
        "tokenizer has none.",
    )
    system_prompt: str | None = Field(
        default=None,
        max_length=65536,
        description="System turn before each prompt when the chat template is applied, unless the row's "
        "chat messages start with their own.",
    )


REWARD_FAILURE_FRACTION = 0.1
"""The share of recently scored prompt groups that may be dropped (scoring failed twice)."""
REWARD_FAILURE_WINDOW_STEPS = 4
"""The failure budget's window: the last this many x numPromptsPerStep groups scored."""
REWARD_FAILURE_MIN_GROUPS = 4
"""Drops every window allows whatever its fraction: 10% of a small job's window is below one
group, and a single flaky call must not fail a job with numPromptsPerStep 4."""


class EnvSpec(ApiModel):
    """The reward environment: what a row's reference answer is, and how a response is scored."""

    name: Literal["reverse", "math", "gsm8k", "calculator"] = Field(
        default="reverse",
        description="reverse: a shipped synthetic task (write a 4-digit string backwards) that a tiny "
        "model learns from scratch, with held-out strings; math: answer equivalence by math-verify "
        "(\\boxed{}, fractions, LaTeX, numbers); gsm8k: the final number of the response against the "
        "number after #### (needs data.trainPath); calculator: a multi-turn tool environment (multiply "
        "two 2-digit numbers, with a calculator the policy calls and that runs in a sandboxed "
        "subprocess), with held-out pairs. Leave it unset with env.class.",
    )
    env_class: EnvClass | None = Field(
        default=None,
        alias="class",
        description='An environment of your own, "package.module:Class", importable in the trainer image: '
        "a subclass of asyncgrpo_trainer.envs.Environment (single-turn) or of "
        "asyncgrpo_trainer.envs.MultiTurnEnvironment (a conversation: the policy speaks, the environment "
        "answers, until it says done). It replaces env.name; it reads the data and scores the responses "
        "(docs/guides/environments.md).",
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=f"Policy turns of a conversation at most (multi-turn environments only; default "
        f"{DEFAULT_MAX_TURNS}). A conversation the environment has not ended by then is truncated "
        "(rewarded 0).",
    )
    max_tokens_per_turn: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Tokens of one policy turn at most (multi-turn environments only; default "
        "generation.maxNewTokens, which bounds the whole conversation after the prompt, the "
        "environment's tokens included). A turn cut by it truncates the conversation.",
    )
    function: RewardFunction | None = Field(
        default=None,
        description='A reward function of your own, "package.module:function", importable in the trainer '
        "image, run in the reward workers (only there): function(prompt, response, reference_answer) -> "
        "float, or per group (functionScope). Keywords its signature names are passed: stop_reason "
        '("finished" or "truncated"; stop_reasons per group) and row (the prompt\'s whole data row). It '
        "replaces the environment's reward; the environment still reads the data and measures accuracy. A "
        "response cut at generation.maxNewTokens is rewarded 0 without calling it, as the environments "
        "score it, unless scoreTruncated (docs/guides/environments.md).",
    )
    function_scope: FunctionScope = Field(
        default="response",
        description="How env.function is called. response: once per response. group: once per prompt group, "
        "function(prompt, responses, reference_answer) -> a list of one float per response, in their "
        "order, so a reward can compare a response with its siblings; it is shown the finished responses "
        "only (the others are rewarded 0), or all of them under scoreTruncated.",
    )
    score_truncated: bool = Field(
        default=False,
        description="Hand responses cut at generation.maxNewTokens to env.function (with stop_reason "
        '"truncated" when it takes it) instead of rewarding them 0. A function that only compares '
        "answers then rewards a policy that writes the answer and never stops.",
    )
    num_workers: int = Field(default=1, ge=1, le=1024, description="Reward worker actors.")
    timeout_seconds: float = Field(
        default=10,
        gt=0,
        le=3600,
        description="Deadline of scoring one prompt group's responses in a reward worker. A call past it, "
        "or one that raises, is retried once; then the group is dropped (status.progress.rewardFailures), "
        "never trained on, and replaced by the next prompt for the same step. The run fails when more "
        f"than max({REWARD_FAILURE_MIN_GROUPS}, {REWARD_FAILURE_FRACTION:.0%}) of the last "
        f"{REWARD_FAILURE_WINDOW_STEPS} x numPromptsPerStep groups scored were dropped.",
    )


JUDGE_PLACEHOLDERS = ("{prompt}", "{response}", "{reference}")
"""What rewardModel.template may name; each is replaced by its text (nothing else in it is special)."""
DEFAULT_JUDGE_TEMPLATE = (
    "Question: {prompt}\nReference answer: {reference}\nResponse: {response}\n"
    "Is the response correct? Answer yes or no."
)


class RewardModelSpec(ApiModel):
    """A reward model: a checkpoint that reads each response and writes a verdict, run by a generation
    engine of its own (docs/guides/environments.md#a-reward-model)."""

    path: AbsolutePath = Field(
        description="Directory of the judge's Hugging Face checkpoint (config, tokenizer, weights), loaded "
        "as model.path is, usually under storage.models.mountPath. Nothing is downloaded.",
    )
    template: str = Field(
        default=DEFAULT_JUDGE_TEMPLATE,
        min_length=1,
        max_length=65536,
        description="What the judge reads for one response: {prompt}, {response} and {reference} are "
        "replaced by the prompt's text, the response and the reference answer (nothing else is special, "
        "so other braces stay as written). It must name {response}.",
    )
    chat_template: bool | None = Field(
        default=None,
        description="Wrap the rendered template in the judge tokenizer's chat template (one user turn, "
        "generation prompt appended). Unset: true when the tokenizer has a template.",
    )
    max_new_tokens: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Tokens of the judge's verdict at most (greedy). The verdict is its text's first word: "
        "yes or no (any case) is 1 or 0, a number in [0, 1] is itself; anything else fails the group's "
        "scoring, as an env.function that raises does.",
    )
    max_sequence_length: int = Field(
        default=1024,
        ge=8,
        le=1_048_576,
        description="The judge's tokens at most: the rendered template plus maxNewTokens. A longer one "
        "fails the group's scoring.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Parameter dtype of the judge."
    )
    backend: Literal["torch", "vllm"] = Field(
        default="torch",
        description="The judge's engine: torch, or vllm (a trainer image with vLLM). It runs on the Ray "
        "cluster's CPUs, in an actor of its own that batches the verdicts it is asked for concurrently.",
    )


class TrainerSpec(ApiModel):
    """Everything the driver needs besides the cluster: model, algorithm, asynchrony and backends."""

    model: ModelSpec = Field(default_factory=ModelSpec, description="The policy model.")
    grpo: GRPOSpec = Field(default_factory=GRPOSpec, description="The GRPO loop sizes.")
    async_rl: AsyncRLSpec = Field(
        default_factory=AsyncRLSpec, alias="asyncRL", description="Asynchrony and its invariants."
    )
    loss: LossSpec = Field(default_factory=LossSpec, description="The policy-gradient loss.")
    policy: PolicySpec = Field(default_factory=PolicySpec, description="The training backend.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="The sampling backend.")
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec, description="Refit transport.")
    data: DataSpec = Field(default_factory=DataSpec, description="Training and validation prompts.")
    env: EnvSpec = Field(default_factory=EnvSpec, description="The reward environment.")
    reward_model: RewardModelSpec | None = Field(
        default=None,
        description="A reward model: its verdicts are the reward trained on, in place of the environment's "
        "(the environment still reads the data and measures accuracy). Not with env.function.",
    )
    logprob_gate: LogprobGateSpec = Field(
        default_factory=LogprobGateSpec,
        description="Whether the generation engine samples the policy's distribution, checked every step.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of the driver and its controller actor."
    )

    @property
    def required_buffer_capacity(self) -> int:
        """P x (S+1): the groups the gated rollout pump may have outstanding."""
        return self.grpo.num_prompts_per_step * (self.async_rl.max_staleness_versions + 1)

    @property
    def max_buffered_rollouts(self) -> int:
        """asyncRL.maxBufferedRollouts with its default (P x (S+1)) applied."""
        return self.async_rl.max_buffered_rollouts or self.required_buffer_capacity

    @property
    def min_groups_for_streaming_train(self) -> int:
        """asyncRL.minGroupsForStreamingTrain with its default (P) applied."""
        return self.async_rl.min_groups_for_streaming_train or self.grpo.num_prompts_per_step

    @property
    def max_inflight_prompts(self) -> int:
        """asyncRL.maxInflightPrompts with its default (maxBufferedRollouts) applied."""
        return self.async_rl.max_inflight_prompts or self.max_buffered_rollouts

    @property
    def dynamic_sampling_max_extra_groups(self) -> int:
        """grpo.dynamicSamplingMaxExtraGroups with its default (P) applied."""
        return self.grpo.dynamic_sampling_max_extra_groups or self.grpo.num_prompts_per_step

    @property
    def samples_per_step(self) -> int:
        """P x N: samples in one RL step."""
        return self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt

    @property
    def train_global_batch_size(self) -> int:
        """policy.trainGlobalBatchSize with its default (P x N) applied."""
        return self.policy.train_global_batch_size or self.samples_per_step

    @property
    def force_in_order(self) -> bool:
        """asyncRL.forceInOrder with its default (not overSampling) applied."""
        if self.async_rl.force_in_order is None:
            return not self.async_rl.over_sampling
        return self.async_rl.force_in_order

    @property
    def drain_before_refit(self) -> bool:
        """asyncRL.drainBeforeRefit with its default applied: on in async-in-order mode, where each
        batch is dispatched at weights k - S and drained before the next refit, so that no batch
        mixes in newer weights by timing (docs/guides/async-modes.md, "Reproducible async")."""
        if self.async_rl.drain_before_refit is None:
            return self.force_in_order and not self.is_sync and not self.async_rl.over_sampling
        return self.async_rl.drain_before_refit

    @property
    def importance_sampling_on_stale_data(self) -> bool:
        """loss.importanceSamplingOnStaleData with its default applied: off for a pretrained
        checkpoint, where weighting one-step-old samples halved the learning of the real-model case
        and changed nothing on the calculator task (5 seeds each); on for the tiny model from random
        weights, whose seeded reversal runs learned more slowly without it (issue 46)."""
        if self.loss.importance_sampling_on_stale_data is None:
            return self.model.source != "pretrained"
        return self.loss.importance_sampling_on_stale_data

    @property
    def is_sync(self) -> bool:
        """S = 0: every rollout is generated by the policy it trains."""
        return self.async_rl.max_staleness_versions == 0
