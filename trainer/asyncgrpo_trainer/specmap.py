"""From the API's TrainerSpec to the trainer's internal configs (pure functions, defaults applied).

The API models are the only place defaults live (asyncgrpo_api); these functions only translate
field names and apply the API's derived properties (TrainerSpec.max_buffered_rollouts, ...), so
the workers and the controller receive small frozen dataclasses instead of the whole job.
"""

from __future__ import annotations

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.trainer import DEFAULT_MAX_TURNS, TrainerSpec
from asyncgrpo_trainer import controller, envs, logprob_gate, rollout, sampler
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.algorithms.overlong import OverlongPenalty
from asyncgrpo_trainer.backends import policy, sampling, vllm_engine
from asyncgrpo_trainer.conversation import Budget
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.lora import LoraConfig
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

OWN_GPU_MEMORY_UTILIZATION = 0.8
"""vLLM's share of a GPU of its own when generation.gpuMemoryUtilization is unset."""
COLOCATED_GPU_MEMORY_UTILIZATION = 0.4
"""vLLM's share of a GPU it shares with a policy rank (generation.colocated) when unset."""


def settings(job: AsyncGRPOJob) -> controller.Settings:
    """The controller's knobs."""
    t = job.spec.trainer
    rl = t.async_rl
    return controller.Settings(
        mode=sampler.mode_name(
            max_staleness_versions=rl.max_staleness_versions,
            over_sampling=rl.over_sampling,
            force_in_order=t.force_in_order,
        ),
        prompts_per_step=t.grpo.num_prompts_per_step,
        generations_per_prompt=t.grpo.num_generations_per_prompt,
        max_steps=t.grpo.max_num_steps,
        min_groups_for_streaming_train=t.min_groups_for_streaming_train,
        max_buffered_rollouts=t.max_buffered_rollouts,
        max_inflight_prompts=min(t.max_inflight_prompts, t.max_buffered_rollouts),
        drain_before_refit=t.drain_before_refit,
        reset_cache_after_refit=t.is_sync or t.generation.recompute_kv_cache_after_weight_updates,
        stall_timeout_seconds=rl.stall_timeout_seconds,
        leave_one_out=t.grpo.use_leave_one_out_baseline,
        normalize_rewards=t.grpo.normalize_rewards,
        needs_reference_logprobs=t.loss.reference_policy_kl_penalty > 0,
        val_period=t.grpo.val_period,
        val_at_end=t.grpo.val_at_end,
        checkpoint_path=job.spec.checkpoint.path,
        checkpoint_every=job.spec.checkpoint.every_steps,
        checkpoint_keep=job.spec.checkpoint.keep_last,
        seed=t.grpo.seed,
        sleep_generation_while_training=t.generation.sleep_while_training,
        logprob_gate=logprob_gate.GateSettings(
            threshold=t.logprob_gate.threshold, steps=t.logprob_gate.steps, fail=t.logprob_gate.fail_job
        ),
        log_level=t.log_level,
        dynamic_sampling_max_extra_groups=t.dynamic_sampling_max_extra_groups
        if t.grpo.dynamic_sampling
        else None,
    )


def sampler_of(t: TrainerSpec) -> sampler.Sampler:
    """The staleness policy of the asyncRL block."""
    return sampler.for_spec(
        max_staleness_versions=t.async_rl.max_staleness_versions,
        over_sampling=t.async_rl.over_sampling,
        force_in_order=t.force_in_order,
    )


def overlong_penalty(t: TrainerSpec) -> OverlongPenalty | None:
    """DAPO's soft overlong punishment over the last grpo.overlongPenaltyTokens of maxNewTokens."""
    band = t.grpo.overlong_penalty_tokens
    return None if band is None else OverlongPenalty(t.generation.max_new_tokens, band)


def conversations(t: TrainerSpec, env: envs.Environment) -> rollout.Conversations | None:
    """How a multi-turn environment's conversations run (env.maxTurns, env.maxTokensPerTurn and
    generation.maxNewTokens); None for a single-turn one, which InvalidDataError refuses the two
    turn settings for (the admission rules can only say so for the built-in environments)."""
    e = t.env
    if not isinstance(env, envs.MultiTurnEnvironment):
        for field, value in (("maxTurns", e.max_turns), ("maxTokensPerTurn", e.max_tokens_per_turn)):
            if value is not None:
                raise InvalidDataError(
                    f"env.{field} applies to multi-turn environments only, and env.class {e.env_class} is "
                    f"not a MultiTurnEnvironment (it answers in one turn); remove env.{field}"
                )
        return None
    max_new = t.generation.max_new_tokens
    budget = Budget(
        max_turns=e.max_turns if e.max_turns is not None else DEFAULT_MAX_TURNS,
        tokens_per_turn=e.max_tokens_per_turn if e.max_tokens_per_turn is not None else max_new,
        max_new_tokens=max_new,
    )
    return rollout.Conversations(env, budget)


def loss_config(t: TrainerSpec) -> losses.LossConfig:
    loss = t.loss
    return losses.LossConfig(
        ratio_clip_min=loss.ratio_clip_min,
        ratio_clip_max=loss.ratio_clip_max,
        ratio_clip_c=loss.ratio_clip_c,
        use_importance_sampling_correction=loss.use_importance_sampling_correction,
        truncated_importance_sampling_ratio=loss.truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min=loss.truncated_importance_sampling_ratio_min,
        truncated_importance_sampling_type=loss.truncated_importance_sampling_type,
        sequence_level_importance_ratios=loss.sequence_level_importance_ratios,
        importance_sampling_on_stale_data=t.importance_sampling_on_stale_data,
        reference_policy_kl_penalty=loss.reference_policy_kl_penalty,
        kl_type=loss.kl_type,
        token_level_loss=loss.token_level_loss,
        constant_normalizer=t.generation.max_new_tokens if loss.constant_normalizer else None,
    )


def optim_config(t: TrainerSpec) -> policy.OptimConfig:
    p = t.policy
    return policy.OptimConfig(
        learning_rate=p.learning_rate,
        weight_decay=p.weight_decay,
        max_grad_norm=p.max_grad_norm,
        warmup_steps=p.warmup_steps,
        micro_batch_size=p.train_micro_batch_size,
        logprob_batch_size=p.logprob_batch_size or p.train_micro_batch_size,
        # The policy scores tokens under the same temperature (and for the importance weight the
        # same top-k / top-p) the engine sampled them with, so pi_old / pi_gen is 1 when the
        # weights are equal.
        temperature=t.generation.temperature,
        top_p=t.generation.top_p,
        top_k=t.generation.top_k,
        minibatches=t.samples_per_step // t.train_global_batch_size,
        schedule=p.learning_rate_schedule,
        min_lr_ratio=p.min_learning_rate_ratio,
        total_steps=t.grpo.max_num_steps * (t.samples_per_step // t.train_global_batch_size),
        max_tokens_per_micro_batch=p.max_tokens_per_micro_batch,
    )


def sharding(t: TrainerSpec) -> policy.Sharding | None:
    """policy.sharding of the torch backend: None when every rank holds the whole model."""
    s = t.policy.sharding
    return policy.Sharding(cpu_offload=s.cpu_offload) if s.strategy == "fsdp" else None


def sampling_params(t: TrainerSpec, *, greedy: bool = False) -> sampling.SamplingParams:
    """Rollout sampling; greedy (temperature 0) for validation."""
    g = t.generation
    if greedy:
        return sampling.SamplingParams(max_new_tokens=g.max_new_tokens, temperature=0.0)
    return sampling.SamplingParams(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        ignore_eos=g.ignore_eos,
    )


def tiny_recipe(t: TrainerSpec, tokenizer: CharTokenizer) -> recipe.ModelBuild:
    """The tiny model both worker groups build from the same seed."""
    tiny = t.model.tiny
    return recipe.tiny_build(
        tokenizer,
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        intermediate_size=tiny.intermediate_size,
        max_sequence_length=t.model.max_sequence_length,
        position_embedding=tiny.position_embedding,
        dtype=t.model.dtype,
        seed=t.grpo.seed,
    )


def lora_config(t: TrainerSpec) -> LoraConfig | None:
    """policy.lora as the model recipe carries it; None: full fine-tuning."""
    spec = t.policy.lora
    if spec is None:
        return None
    return LoraConfig(spec.rank, spec.alpha, tuple(spec.target_modules))


def vllm_options(t: TrainerSpec) -> vllm_engine.VLLMOptions:
    """The vLLM engine's knobs: at most the rows the controller can have generating at once."""
    g = t.generation
    rows = min(t.max_inflight_prompts, t.max_buffered_rollouts) * t.grpo.num_generations_per_prompt
    share = g.gpu_memory_utilization
    if share is None:  # colocated, the policy rank keeps its state in the rest of the GPU
        share = COLOCATED_GPU_MEMORY_UTILIZATION if g.colocated else OWN_GPU_MEMORY_UTILIZATION
    return vllm_engine.VLLMOptions(
        tensor_parallel_size=g.tensor_parallel_size,
        gpu_memory_utilization=share,
        sleep_mode=g.sleep_while_training,
        max_num_seqs=min(max(rows, t.data.num_validation_prompts, 1), 1024),
    )
