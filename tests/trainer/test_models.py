"""Real checkpoints in and out: every supported family against the `transformers` implementation.

Each test family is a tiny random checkpoint written by `make_tiny_checkpoint` (transformers'
own `save_pretrained` and a BPE tokenizer trained offline), so what is compared is the loader, the
network, both torch generation paths and the policy's log-probs against transformers on the very
same files: logits within 1e-4 in float32, identical greedy generations. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from transformers import AutoModelForCausalLM

from asyncgrpo_trainer import checkpoint, export
from asyncgrpo_trainer.algorithms import losses
from asyncgrpo_trainer.backends import generation, policy, sampling
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.directory import CONFIG, GENERATION_CONFIG, INDEX, WEIGHTS, InvalidModelError
from asyncgrpo_trainer.models.tiny_checkpoint import make_tiny_checkpoint
from asyncgrpo_trainer.models.tokenizer import CheckpointTokenizer

VARIANTS = {
    # family, tied embeddings, dtype on disk
    "qwen2-tied": ("qwen2", True, "float32"),
    "qwen2-untied-bf16": ("qwen2", False, "bfloat16"),
    "qwen3-tied": ("qwen3", True, "float32"),
    "llama3-untied": ("llama", False, "float32"),
}
PROMPTS = ["What is 12 + 34?", "reverse 5678", "7"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        name: make_tiny_checkpoint(root / name, family=fam, tie_word_embeddings=tied, dtype=dtype, seed=i)
        for i, (name, (fam, tied, dtype)) in enumerate(VARIANTS.items())
    }


def _build(path: Path, dtype: str = "float32") -> tuple[recipe.ModelBuild, CheckpointTokenizer]:
    return recipe.pretrained_build(
        str(path), max_sequence_length=128, dtype=dtype, seed=0, chat_template=None, system_prompt=None
    )


def _reference(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_transformers_in_float32(checkpoints: dict[str, Path], variant: str) -> None:
    build, tok = _build(checkpoints[variant])
    ours, ref = build.instantiate().eval(), _reference(checkpoints[variant])
    for text in PROMPTS:
        ids = torch.tensor([tok.encode_prompt(text)])
        with torch.no_grad():
            diff = (ours(ids)[0] - ref(ids).logits).abs().max().item()
        assert diff <= 1e-4, (variant, text, diff)


def test_a_bfloat16_checkpoint_trains_in_the_dtype_the_job_asks_for(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["qwen2-untied-bf16"]
    build, tok = _build(path, dtype="bfloat16")
    model = build.instantiate()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ids = torch.tensor([tok.encode_prompt(PROMPTS[0])])
    with torch.no_grad():
        ours, theirs = model(ids)[0].float(), _reference(path, torch.bfloat16)(ids).logits.float()
    assert (ours - theirs).abs().max().item() <= 2e-2  # bf16 rounding of the same computation


def _hf_greedy(path: Path, prompt: list[int], eos: tuple[int, ...], n: int) -> list[int]:
    ref = _reference(path)
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=list(eos),
            pad_token_id=eos[0],
        )
    tokens: list[int] = out[0, len(prompt) :].tolist()
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return tokens[:end]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("engine", ["per-group", "batched"])
def test_greedy_generations_equal_transformers_generate(
    checkpoints: dict[str, Path], variant: str, engine: generation.Engine
) -> None:
    path = checkpoints[variant]
    build, tok = _build(path)
    worker = generation.TorchGenerationWorker(build, device="cpu", engine=engine, collect_seconds=0.0)
    greedy = sampling.SamplingParams(max_new_tokens=16, temperature=0.0)
    for text in PROMPTS:
        prompt = tok.encode_prompt(text)
        out = asyncio.run(worker.generate(prompt, 1, greedy, seed=0))
        assert out.response_ids[0] == _hf_greedy(path, prompt, build.eos_ids, 16), (variant, engine, text)


def _policy(build: recipe.ModelBuild) -> policy.TorchPolicyWorker:
    optim = policy.OptimConfig(
        learning_rate=1e-2,
        weight_decay=0.0,
        max_grad_norm=1.0,
        warmup_steps=0,
        micro_batch_size=4,
        logprob_batch_size=4,
        temperature=1.0,
    )
    return policy.TorchPolicyWorker(build, optim, losses.LossConfig(), rank=0, world_size=1, device="cpu")


@pytest.mark.parametrize("variant", ["qwen2-tied", "llama3-untied"])
def test_policy_logprobs_equal_transformers(checkpoints: dict[str, Path], variant: str) -> None:
    path = checkpoints[variant]
    build, tok = _build(path)
    worker = _policy(build)
    rows = [(tok.encode_prompt(t), tok.encode_prompt(PROMPTS[-1])[-3:]) for t in PROMPTS]
    with torch.no_grad():
        ours, mask = worker.logprobs(worker.model, rows, worker.device)
    ref = _reference(path)
    for i, (prompt, response) in enumerate(rows):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = F.log_softmax(ref(ids).logits[0].float(), dim=-1)
        expected = torch.stack([logp[len(prompt) - 1 + j, t] for j, t in enumerate(response)])
        assert torch.allclose(ours[i, : len(response)], expected, atol=1e-4)
        assert mask[i].sum() == len(response)


def _one_step(worker: policy.TorchPolicyWorker, tok: CheckpointTokenizer) -> None:
    rows = [
        policy.TrainRow(tok.encode_prompt(t), [5, 6, 7][: i + 1], [-1.0] * (i + 1), advantage=1.0 - i)
        for i, t in enumerate(PROMPTS)
    ]
    worker.train_chunk(rows)
    worker.finish_step()


@pytest.mark.parametrize("variant", ["qwen2-tied", "qwen3-tied", "llama3-untied"])
def test_a_trained_checkpoint_reloads_in_transformers_with_the_policys_logits(
    checkpoints: dict[str, Path], variant: str, tmp_path: Path
) -> None:
    build, tok = _build(checkpoints[variant])
    worker = _policy(build)
    _one_step(worker, tok)  # the weights now differ from the source checkpoint
    tmp = checkpoint.begin(tmp_path / "ckpt", 1)
    assert worker.save(str(tmp)) == {}
    step = checkpoint.commit(tmp, 1, {}, keep_last=1, meta={"model": build.to_json()})
    ids = torch.tensor([tok.encode_prompt(PROMPTS[0])])
    with torch.no_grad():
        trained = worker.model(ids)[0]
        source = _reference(checkpoints[variant])(ids).logits
    assert (trained - source).abs().max().item() > 1e-3  # the step changed the model
    for directory in (step / checkpoint.HF_DIR, export.export(tmp_path / "ckpt", tmp_path / "exported")):
        reloaded = _reference(directory)
        with torch.no_grad():
            assert (reloaded(ids).logits - trained).abs().max().item() <= 1e-4, directory
        assert CheckpointTokenizer(str(directory)).encode_prompt(PROMPTS[0]) == ids[0].tolist()
        config = json.loads((directory / CONFIG).read_text())
        assert config["tie_word_embeddings"] == build.config.tie_word_embeddings


def test_a_sharded_checkpoint_loads_like_a_single_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    source = checkpoints["llama3-untied"]
    sharded = tmp_path / "sharded"
    _reference(source).save_pretrained(sharded, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(source / name, sharded / name)
    assert (sharded / INDEX).is_file() and not (sharded / WEIGHTS).exists()
    a, _ = _build(source)
    b, _ = _build(sharded)
    sa, sb = a.instantiate().state_dict(), b.instantiate().state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_prompts_use_the_chat_template_with_the_system_prompt_and_stop_at_any_eos(
    checkpoints: dict[str, Path],
) -> None:
    path = str(checkpoints["qwen2-tied"])
    plain = CheckpointTokenizer(path, chat_template=False)
    chat = CheckpointTokenizer(path, system_prompt="Answer briefly.")
    assert chat.chat_template and not plain.chat_template
    rendered = chat._tok.decode(chat.encode_prompt("2+2?"))
    turns = ("system\nAnswer briefly.", "user\n2+2?")
    assert rendered == "".join(f"<|im_start|>{t}<|im_end|>\n" for t in turns) + "<|im_start|>assistant\n"
    assert plain._tok.decode(plain.encode_prompt("2+2?")) == "2+2?"
    im_end, endoftext = chat._tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert set(chat.eos_ids) == {im_end, endoftext}  # generation_config.json names both
    four = plain.encode_prompt("4")
    assert chat.decode([*four, im_end, *four]) == "4"
    assert chat.decode([*four, endoftext, *four]) == "4"


def test_a_chat_prompt_is_rendered_by_the_template_its_own_system_turn_before_the_system_prompt(
    checkpoints: dict[str, Path],
) -> None:
    path = str(checkpoints["qwen2-tied"])
    chat = CheckpointTokenizer(path, system_prompt="Answer briefly.")

    def rendered(prompt: Any) -> str:
        return str(chat._tok.decode(chat.encode_prompt(prompt)))

    def turns(*texts: str) -> str:
        return "".join(f"<|im_start|>{t}<|im_end|>\n" for t in texts) + "<|im_start|>assistant\n"

    assert rendered((("user", "2+2?"),)) == rendered("2+2?")  # one user turn is the text prompt
    own = (("system", "Think first."), ("user", "2+2?"))
    assert rendered(own) == turns("system\nThink first.", "user\n2+2?")  # not two system turns
    plain = CheckpointTokenizer(path, chat_template=False)
    assert plain._tok.decode(plain.encode_prompt((("user", "2+2?"),))) == "2+2?"
    with pytest.raises(ValueError, match="need a chat template"):
        plain.encode_prompt(own)


def test_llama_prompts_start_with_one_bos(checkpoints: dict[str, Path]) -> None:
    tok = CheckpointTokenizer(str(checkpoints["llama3-untied"]))
    bos = tok._tok.bos_token_id
    for chat in (True, False):
        ids = CheckpointTokenizer(str(checkpoints["llama3-untied"]), chat_template=chat).encode_prompt("hi")
        assert ids[0] == bos and ids.count(bos) == 1


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_unusable_checkpoints_fail_with_the_file_and_the_fix(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(InvalidModelError, match=r"does not exist: spec.trainer.model.path"):
        _build(tmp_path / "nowhere")
    gpt2 = _copy(checkpoints["qwen2-tied"], tmp_path / "gpt2")
    config = json.loads((gpt2 / CONFIG).read_text())
    (gpt2 / CONFIG).write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(InvalidModelError, match=r"config.json: model_type 'gpt2' is not a supported family"):
        _build(gpt2)
    dynamic = _copy(checkpoints["qwen2-tied"], tmp_path / "dynamic")
    scaled = {**config, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}}
    (dynamic / CONFIG).write_text(json.dumps(scaled))
    with pytest.raises(InvalidModelError, match=r"rope type 'dynamic' is not supported"):
        _build(dynamic)
    no_weights = _copy(checkpoints["qwen2-tied"], tmp_path / "no-weights")
    (no_weights / WEIGHTS).unlink()
    with pytest.raises(InvalidModelError, match=r"holds neither model.safetensors nor"):
        _build(no_weights)
    wider = _copy(checkpoints["qwen2-tied"], tmp_path / "wider")
    (wider / CONFIG).write_text(json.dumps({**config, "intermediate_size": 256}))
    build, _ = _build(wider)
    with pytest.raises(
        InvalidModelError, match=r"model.safetensors: .* has shape .*, config.json gives .*256"
    ):
        build.instantiate()
    no_eos = _copy(checkpoints["qwen2-tied"], tmp_path / "no-eos")
    (no_eos / GENERATION_CONFIG).unlink()
    tok_config = json.loads((no_eos / "tokenizer_config.json").read_text())
    (no_eos / "tokenizer_config.json").write_text(json.dumps({**tok_config, "eos_token": None}))
    with pytest.raises(InvalidModelError, match=r"names an end-of-sequence token"):
        _build(no_eos)
    with pytest.raises(InvalidModelError, match=r"maxSequenceLength 1024 exceeds the checkpoint's"):
        recipe.pretrained_build(
            str(checkpoints["qwen2-tied"]),
            max_sequence_length=1024,
            dtype="float32",
            seed=0,
            chat_template=None,
            system_prompt=None,
        )
