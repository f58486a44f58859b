"""The cross-field invariants CEL can express, each written once (asyncgrpo_api.expressions).

`violations` is how asyncgrpo_api.rules checks them (so the webhook, `asyncgrpo validate` and the
trainer do); asyncgrpo_api.admissionpolicy prints the same table as the chart's
ValidatingAdmissionPolicy, so the API server refuses a job that breaks one of them even while no
webhook replica answers. The other rules (GPU layouts, the batch over the policy pool, names,
quantities, pod templates, the truncation bounds, which read a nullable field) stay in rules.py.

Each invariant is the condition under which a job breaks it, the field the finding names, and its
message; P = numPromptsPerStep, N = numGenerationsPerPrompt, S = maxStalenessVersions
(docs/guides/async-modes.md says why each one exists).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncgrpo_api.expressions import Expr, Field, evaluate, render

TRAINER = "trainer"


def _t(path: str) -> Field:
    return Field(f"{TRAINER}.{path}")


P = _t("grpo.numPromptsPerStep")
N = _t("grpo.numGenerationsPerPrompt")
S = _t("asyncRL.maxStalenessVersions")
OVER_SAMPLING = _t("asyncRL.overSampling")
FORCE_IN_ORDER = _t("asyncRL.forceInOrder")
BUFFER = _t("asyncRL.maxBufferedRollouts")
CHUNK = _t("asyncRL.minGroupsForStreamingTrain")
STALL_TIMEOUT = _t("asyncRL.stallTimeoutSeconds")
ROLLOUT_TIMEOUT = _t("asyncRL.rolloutTimeoutSeconds")
GLOBAL_BATCH = _t("policy.trainGlobalBatchSize")
POLICY_BACKEND = _t("policy.backend")
TOKEN_BUDGET = _t("policy.maxTokensPerMicroBatch")
SHARDING = _t("policy.sharding.strategy")
ACTIVATION_CHECKPOINTING = _t("policy.activationCheckpointing")
DYNAMIC_SAMPLING = _t("grpo.dynamicSampling")
OVERLONG_PENALTY = _t("grpo.overlongPenaltyTokens")
SEQUENCE_LEVEL = _t("loss.sequenceLevelImportanceRatios")
TRUNCATION = _t("loss.truncatedImportanceSamplingType")
TOKEN_LEVEL = _t("loss.tokenLevelLoss")
CONSTANT_NORMALIZER = _t("loss.constantNormalizer")
GENERATION_BACKEND = _t("generation.backend")
TOP_P = _t("generation.topP")
TOP_K = _t("generation.topK")
MAX_NEW_TOKENS = _t("generation.maxNewTokens")
MODEL_SOURCE = _t("model.source")
MODEL_PATH = _t("model.path")
MAX_SEQUENCE = _t("model.maxSequenceLength")
HIDDEN = _t("model.tiny.hiddenSize")
HEADS = _t("model.tiny.numHeads")
KV_HEADS = _t("model.tiny.numKvHeads")
CHAT_TEMPLATE = _t("data.chatTemplate")
SYSTEM_PROMPT = _t("data.systemPrompt")
MAX_PROMPT = _t("data.maxPromptLength")
TRAIN_PATH = _t("data.trainPath")
PROMPT_KEY = _t("data.promptKey")
ANSWER_KEY = _t("data.answerKey")
ENV_NAME = _t("env.name")
ENV_FUNCTION = _t("env.function")
ENV_CLASS = _t("env.class")
REWARD_MODEL_PATH = _t("rewardModel.path")
"""Set exactly when rewardModel is (path is its one required field)."""
JUDGE_TEMPLATE = _t("rewardModel.template")
MAX_TURNS = _t("env.maxTurns")
TURN_TOKENS = _t("env.maxTokensPerTurn")

GENERATION_REPLICAS = Field("cluster.generationWorkers.replicas")
GENERATION_MIN = Field("cluster.generationWorkers.minReplicas")
GENERATION_MAX = Field("cluster.generationWorkers.maxReplicas")

CAPACITY = P * (S + 1)
SAMPLES = P * N
TINY = MODEL_SOURCE.eq("tiny")
MEGATRON = POLICY_BACKEND.eq("megatron")
BUILTIN_PROMPT_SETS = ("reverse", "math", "calculator")
MULTI_TURN_ENVS = ("calculator",)
"""The built-in environments whose rollouts are conversations (env.maxTurns applies to them)."""
"""Environments that ship prompts, so that a job without data.trainPath has something to train on."""
SINGLE_TURN = ~ENV_CLASS.is_set() & ~ENV_NAME.is_in(MULTI_TURN_ENVS)
REWARD_FUNCTION = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
"""env.function: a dotted module path, a colon, a function name (what importlib can resolve)."""


@dataclass(frozen=True)
class Invariant:
    """One rule: the job breaks it when `broken` is true; the finding names `field` (below spec)."""

    name: str
    """A CEL identifier: the name of the policy's variable for it."""
    field: str
    broken: Expr
    message: Sequence[str | Expr]

    @property
    def path(self) -> str:
        return f"spec.{self.field}"


CAPACITY_FORMULA: tuple[str | Expr, ...] = (
    "numPromptsPerStep x (maxStalenessVersions + 1) = ", P, " x ", S + 1, " = ", CAPACITY,
)  # fmt: skip
SAMPLES_FORMULA: tuple[str | Expr, ...] = (
    "numPromptsPerStep x numGenerationsPerPrompt = ", P, " x ", N, " = ", SAMPLES,
)  # fmt: skip
_MEGATRON_FILTERS = (
    "top-p / top-k sampling needs the policy to score pi_old under the same filter for the importance "
    "weight, which the megatron backend does not do; sample unfiltered (topP 1, topK unset) or use "
    "policy.backend torch",
)

INVARIANTS: tuple[Invariant, ...] = (
    # --- cluster: the elastic generation fleet (docs/guides/job-lifecycle.md#elastic-generation) ---
    Invariant(
        "generationMinAboveReplicas",
        GENERATION_MIN.path,
        GENERATION_MIN.is_set() & GENERATION_MIN.gt(GENERATION_REPLICAS),
        (
            "(",
            GENERATION_MIN,
            ") must be at most replicas (",
            GENERATION_REPLICAS,
            "): the fleet starts at replicas and shrinks no lower than minReplicas; lower minReplicas or "
            "raise replicas",
        ),
    ),
    Invariant(
        "generationMaxBelowReplicas",
        GENERATION_MAX.path,
        GENERATION_MAX.is_set() & GENERATION_MAX.lt(GENERATION_REPLICAS),
        (
            "(",
            GENERATION_MAX,
            ") must be at least replicas (",
            GENERATION_REPLICAS,
            "): the fleet starts at replicas and grows no higher than maxReplicas; raise maxReplicas or "
            "lower replicas",
        ),
    ),
    # --- async_rl: the knob table (docs/guides/async-modes.md) ---
    Invariant(
        "syncModeOverSampled",
        OVER_SAMPLING.path,
        S.eq(0) & OVER_SAMPLING,
        (
            "must be false when maxStalenessVersions is 0: sync mode dispatches exactly one batch per "
            "trainer version, which over-sampling bypasses. Set overSampling: false, or set "
            "maxStalenessVersions >= 1 for asynchronous training",
        ),
    ),
    Invariant(
        "inOrderOverSampled",
        FORCE_IN_ORDER.path,
        FORCE_IN_ORDER.is_set() & FORCE_IN_ORDER & OVER_SAMPLING,
        (
            "cannot be true when overSampling is true: each dispatched batch must map to exactly one "
            "step. Set forceInOrder: false (streaming, over-sampled) or overSampling: false (exact "
            "batch-to-step matching)",
        ),
    ),
    Invariant(
        "bufferNotExact",
        BUFFER.path,
        BUFFER.is_set() & ~OVER_SAMPLING & BUFFER.ne(CAPACITY),
        (
            "must equal ",
            *CAPACITY_FORMULA,
            " when overSampling is false; got ",
            BUFFER,
            ". Set it to ",
            CAPACITY,
            " or leave it unset",
        ),
    ),
    Invariant(
        "bufferBelowCapacity",
        BUFFER.path,
        BUFFER.is_set() & OVER_SAMPLING & BUFFER.lt(CAPACITY),
        (
            "must be at least ",
            *CAPACITY_FORMULA,
            " when overSampling is true, or a step could starve; ",
            "got ",
            BUFFER,
            ". Raise it to ",
            CAPACITY,
            " or more",
        ),
    ),
    Invariant(
        "streamingChunkAboveStep",
        CHUNK.path,
        CHUNK.is_set() & CHUNK.gt(P),
        (
            "must be at most numPromptsPerStep (",
            P,
            "): a step trains on ",
            P,
            " prompt groups, so a ",
            "larger chunk could never fill; got ",
            CHUNK,
            ". Set it to ",
            P,
            " or less",
        ),
    ),
    Invariant(
        "globalBatchNotADivisor",
        GLOBAL_BATCH.path,
        GLOBAL_BATCH.is_set() & (GLOBAL_BATCH.gt(SAMPLES) | (SAMPLES % GLOBAL_BATCH).ne(0)),
        (
            "must divide ",
            *SAMPLES_FORMULA,
            " (each RL step is ",
            SAMPLES,
            " / trainGlobalBatchSize ",
            "optimizer steps); got ",
            GLOBAL_BATCH,
            ". Use a divisor of ",
            SAMPLES,
            ", or leave it unset ",
            "for one optimizer step per RL step",
        ),
    ),
    Invariant(
        "miniBatchesOnMegatron",
        GLOBAL_BATCH.path,
        GLOBAL_BATCH.is_set() & GLOBAL_BATCH.lt(SAMPLES) & (SAMPLES % GLOBAL_BATCH).eq(0) & MEGATRON,
        (
            "below P x N = ",
            SAMPLES,
            " (PPO mini-batches) runs on the torch policy backend; the megatron ",
            "backend takes one optimizer step per RL step. Leave it unset or use policy.backend torch",
        ),
    ),
    Invariant(
        "watchdogBeforeRolloutTimeout",
        STALL_TIMEOUT.path,
        ROLLOUT_TIMEOUT.is_set() & STALL_TIMEOUT.le(ROLLOUT_TIMEOUT),
        (
            "must be greater than rolloutTimeoutSeconds, or the watchdog fires before a slow rollout can "
            "time out and retry",
        ),
    ),
    # --- DAPO's sampling and reward shaping ---
    Invariant(
        "dynamicSamplingOneSample",
        DYNAMIC_SAMPLING.path,
        DYNAMIC_SAMPLING & N.lt(2),
        (
            "needs numGenerationsPerPrompt >= 2: a group of one sample always has equal rewards (zero "
            "advantage), so dynamic sampling would drop every group; raise numGenerationsPerPrompt or "
            "set dynamicSampling false",
        ),
    ),
    Invariant(
        "overlongPenaltyAboveMaxNewTokens",
        OVERLONG_PENALTY.path,
        OVERLONG_PENALTY.is_set() & OVERLONG_PENALTY.gt(MAX_NEW_TOKENS),
        (
            "must be at most generation.maxNewTokens (",
            MAX_NEW_TOKENS,
            "): the penalty band is the last ",
            "overlongPenaltyTokens tokens below the length limit; got ",
            OVERLONG_PENALTY,
            ". Set it to ",
            MAX_NEW_TOKENS,
            " or less, or raise generation.maxNewTokens",
        ),
    ),
    # --- loss variants (NeMo-RL refuses the same combinations) ---
    Invariant(
        "sequenceRatiosWithSequenceMask",
        SEQUENCE_LEVEL.path,
        SEQUENCE_LEVEL & TRUNCATION.eq("seq-mask-tis"),
        (
            "cannot be combined with truncatedImportanceSamplingType seq-mask-tis, which masks sequences "
            "but weights tokens; use tis or icepop (they then act on the sequence's weight) or set this "
            "false",
        ),
    ),
    Invariant(
        "sequenceRatiosWithTokenLoss",
        SEQUENCE_LEVEL.path,
        SEQUENCE_LEVEL & TOKEN_LEVEL,
        (
            "needs tokenLevelLoss false: GSPO averages each sequence's loss over its tokens, then over "
            "sequences; set loss.tokenLevelLoss false",
        ),
    ),
    Invariant(
        "constantNormalizerWithoutTokenLoss",
        CONSTANT_NORMALIZER.path,
        CONSTANT_NORMALIZER & ~TOKEN_LEVEL,
        (
            "needs tokenLevelLoss true: Dr. GRPO sums the loss over tokens and divides by samples x "
            "generation.maxNewTokens, which replaces the per-sequence means; set loss.tokenLevelLoss true",
        ),
    ),
    Invariant("megatronTopP", TOP_P.path, MEGATRON & TOP_P.lt(1.0), _MEGATRON_FILTERS),
    Invariant("megatronTopK", TOP_K.path, MEGATRON & TOP_P.ge(1.0) & TOP_K.is_set(), _MEGATRON_FILTERS),
    # --- the model and sequence lengths ---
    Invariant(
        "pretrainedWithoutPath",
        MODEL_PATH.path,
        MODEL_SOURCE.eq("pretrained") & ~MODEL_PATH.is_set(),
        (
            "is required when source is pretrained: the directory of a Hugging Face checkpoint, e.g. "
            "under storage.models.mountPath",
        ),
    ),
    Invariant(
        "chatTemplateOnTinyModel",
        CHAT_TEMPLATE.path,
        TINY & CHAT_TEMPLATE.is_set() & CHAT_TEMPLATE,
        (
            "must not be true with model.source tiny: the tiny model's character tokenizer has no chat "
            "template; remove it or use a pretrained checkpoint",
        ),
    ),
    Invariant(
        "systemPromptWithoutTemplate",
        SYSTEM_PROMPT.path,
        SYSTEM_PROMPT.is_set() & (TINY | (CHAT_TEMPLATE.is_set() & ~CHAT_TEMPLATE)),
        (
            "is only used inside a chat template (model.source pretrained, data.chatTemplate not false); "
            "remove it or enable the template",
        ),
    ),
    Invariant(
        "vllmOnTinyModel",
        GENERATION_BACKEND.path,
        GENERATION_BACKEND.eq("vllm") & TINY,
        (
            "vllm serves Hugging Face checkpoints: set model.source pretrained and model.path (make a tiny "
            "one with `asyncgrpo make-tiny-checkpoint DIR`), or use backend torch for the tiny model",
        ),
    ),
    Invariant(
        "headsSplitHidden",
        HEADS.path,
        TINY & (HIDDEN % HEADS).ne(0),
        ("must divide hiddenSize (", HIDDEN, "); got ", HEADS),
    ),
    Invariant(
        "kvHeadsSplitHeads",
        KV_HEADS.path,
        TINY & (HEADS % KV_HEADS).ne(0),
        ("must divide numHeads (", HEADS, "); got ", KV_HEADS),
    ),
    Invariant(
        "sequenceTooLong",
        MAX_NEW_TOKENS.path,
        (MAX_PROMPT + MAX_NEW_TOKENS).gt(MAX_SEQUENCE),
        (
            "data.maxPromptLength + generation.maxNewTokens = ",
            MAX_PROMPT,
            " + ",
            MAX_NEW_TOKENS,
            " = ",
            MAX_PROMPT + MAX_NEW_TOKENS,
            " exceeds model.maxSequenceLength (",
            MAX_SEQUENCE,
            "); lower ",
            "one of them or raise maxSequenceLength",
        ),
    ),
    Invariant(
        "tokenBudgetBelowLongestRow",
        TOKEN_BUDGET.path,
        TOKEN_BUDGET.is_set() & TOKEN_BUDGET.lt(MAX_PROMPT + MAX_NEW_TOKENS),
        (
            "must hold the longest row, data.maxPromptLength + generation.maxNewTokens = ",
            MAX_PROMPT + MAX_NEW_TOKENS,
            " tokens; got ",
            TOKEN_BUDGET,
            ". Raise it, or lower maxPromptLength or maxNewTokens",
        ),
    ),
    Invariant(
        "megatronTokenBudget",
        TOKEN_BUDGET.path,
        MEGATRON & TOKEN_BUDGET.is_set(),
        (
            "packs rows for the torch policy backend only; the megatron backend counts micro-batches in "
            "rows (trainMicroBatchSize): unset it or use policy.backend torch",
        ),
    ),
    # --- the torch backend's memory layout ---
    Invariant(
        "fsdpOnMegatron",
        SHARDING.path,
        MEGATRON & SHARDING.eq("fsdp"),
        (
            "fsdp shards the torch policy backend's model; the megatron backend splits its model with "
            "policy.megatron.tensorParallelSize instead: set strategy none, or use policy.backend torch",
        ),
    ),
    Invariant(
        "activationCheckpointingOnMegatron",
        ACTIVATION_CHECKPOINTING.path,
        MEGATRON & ACTIVATION_CHECKPOINTING,
        (
            "recomputes activations in the torch policy backend only; the megatron backend keeps them: "
            "set it false, or use policy.backend torch",
        ),
    ),
    # --- data and rewards (what only the files show fails the driver with InvalidData) ---
    Invariant(
        "promptsWithoutData",
        TRAIN_PATH.path,
        ~ENV_CLASS.is_set() & ~ENV_NAME.is_in(BUILTIN_PROMPT_SETS) & ~TRAIN_PATH.is_set(),
        (
            "is required with env.name ",
            ENV_NAME,
            ", which has no built-in prompt set: point it at a ",
            "JSONL, JSON or Parquet file (or a save_to_disk directory) on a volume",
        ),
    ),
    Invariant(
        "answerKeyIsPromptKey",
        ANSWER_KEY.path,
        PROMPT_KEY.eq(ANSWER_KEY),
        ("must differ from promptKey (both '", PROMPT_KEY, "'): the prompt would be its own answer"),
    ),
    Invariant(
        "rewardFunctionShape",
        ENV_FUNCTION.path,
        ENV_FUNCTION.is_set() & ~ENV_FUNCTION.matches(REWARD_FUNCTION),
        (
            'must be "package.module:function" (a module importable in the trainer image, a colon, a ',
            "function name); got '",
            ENV_FUNCTION,
            "'",
        ),
    ),
    Invariant(
        "twoRewardSources",
        ENV_FUNCTION.path,
        ENV_FUNCTION.is_set() & REWARD_MODEL_PATH.is_set(),
        (
            "cannot be set together with rewardModel (",
            REWARD_MODEL_PATH,
            "): each would be the reward trained on; remove env.function or rewardModel",
        ),
    ),
    Invariant(
        "judgeTemplateWithoutResponse",
        JUDGE_TEMPLATE.path,
        JUDGE_TEMPLATE.is_set() & ~JUDGE_TEMPLATE.matches(r"^[\s\S]*\{response\}[\s\S]*$"),
        (
            "must name {response}, which is replaced by the response to judge (and {prompt}, {reference} "
            "by the prompt and the reference answer); without it the judge never sees the response",
        ),
    ),
    Invariant(
        "environmentClassShape",
        ENV_CLASS.path,
        ENV_CLASS.is_set() & ~ENV_CLASS.matches(REWARD_FUNCTION),
        (
            'must be "package.module:Class" (a module importable in the trainer image, a colon, the name of ',
            "an Environment subclass); got '",
            ENV_CLASS,
            "'",
        ),
    ),
    Invariant(
        "environmentNamedTwice",
        ENV_NAME.path,
        ENV_CLASS.is_set() & ENV_NAME.ne("reverse"),
        (
            "must be left unset (its default, reverse) with env.class ('",
            ENV_CLASS,
            "'), which is the environment; remove one of the two",
        ),
    ),
    Invariant(
        "turnsOfSingleTurnEnvironment",
        MAX_TURNS.path,
        MAX_TURNS.is_set() & SINGLE_TURN,
        (
            "applies to multi-turn environments only (env.name calculator, or an env.class), and env.name ",
            ENV_NAME,
            " answers in one turn; remove it",
        ),
    ),
    Invariant(
        "turnTokensOfSingleTurnEnvironment",
        TURN_TOKENS.path,
        TURN_TOKENS.is_set() & SINGLE_TURN,
        (
            "applies to multi-turn environments only (env.name calculator, or an env.class), and env.name ",
            ENV_NAME,
            " answers in one turn (generation.maxNewTokens bounds it); remove it",
        ),
    ),
    Invariant(
        "turnTokensOverResponse",
        TURN_TOKENS.path,
        TURN_TOKENS.is_set() & TURN_TOKENS.gt(MAX_NEW_TOKENS),
        (
            "(",
            TURN_TOKENS,
            ") must be at most generation.maxNewTokens (",
            MAX_NEW_TOKENS,
            "), which bounds the whole conversation after the prompt; lower it or raise maxNewTokens",
        ),
    ),
)


def violations(spec: Mapping[str, Any]) -> Iterator[tuple[Invariant, str]]:
    """The invariants `spec` breaks, each with its message. `spec` is the job's spec as a dict with
    every default filled in (`job.spec.model_dump(mode="json", by_alias=True)`)."""
    for invariant in INVARIANTS:
        if evaluate(invariant.broken, spec):
            yield invariant, render(invariant.message, spec)
