"""`asyncgrpo make-tiny-checkpoint DIR`: a small random Hugging Face checkpoint made on this machine.

Tests, the CPU example and the vLLM CPU runs need a real checkpoint directory of each supported
family without downloading one. This writes one with transformers' own classes (`save_pretrained`
of a randomly initialised Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM), a byte-level BPE
tokenizer trained offline with the `tokenizers` library on a small built-in corpus (digits are
single tokens, as in Qwen's and Llama's tokenizers), the family's chat template and special tokens
(ChatML for Qwen, header/eot tokens for Llama 3), and generation_config.json with the EOS ids.
So the directory has the shape of the real thing, only small: what loads it loads Qwen2.5-0.5B.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Specials:
    """A family's special tokens: (bos or None, eos, pad, chat end-of-turn, the rest)."""

    bos: str | None
    eos: str
    pad: str
    end_of_turn: str
    others: tuple[str, ...]
    template: str

    @property
    def all(self) -> list[str]:
        tokens = [self.bos] if self.bos else []
        return list(dict.fromkeys([*tokens, self.eos, self.pad, self.end_of_turn, *self.others]))


QWEN = Specials(None, "<|endoftext|>", "<|endoftext|>", "<|im_end|>", ("<|im_start|>",), QWEN_TEMPLATE)
LLAMA = Specials(
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|finetune_right_pad_id|>",
    "<|eot_id|>",
    ("<|start_header_id|>", "<|end_header_id|>"),
    LLAMA_TEMPLATE,
)
SPECIALS = {"qwen2": QWEN, "qwen3": QWEN, "llama": LLAMA}


def corpus() -> list[str]:
    """Text the BPE merges are learned from: digits, letters, arithmetic and instruction words."""
    words = [
        *("what", "is", "the", "answer", "reverse", "digits", "of", "number", "plus", "minus", "times"),
        *("sum", "add", "each", "one", "to", "question", "solve", "final", "put", "in", "boxed"),
        *("step", "because", "therefore", "so", "we", "get", "total", "result"),
    ]
    lines = [" ".join(words[i : i + 6]) for i in range(0, len(words), 3)]
    lines += [f"{a} + {b} = {a + b}" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    lines += [string.ascii_letters, string.punctuation, string.digits * 3]
    return lines * 4


def train_tokenizer(family: str, vocab_size: int) -> Any:
    """A transformers fast tokenizer: byte-level BPE, single-digit tokens, the family's specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    sp = SPECIALS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=sp.all,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    if sp.bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{sp.bos} $A", special_tokens=[(sp.bos, tok.token_to_id(sp.bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=sp.bos,
        eos_token=sp.end_of_turn,
        pad_token=sp.pad,
        chat_template=sp.template,
        additional_special_tokens=[t for t in sp.all if t not in {sp.bos, sp.end_of_turn, sp.pad}],
    )


def hf_config(
    family: str,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_positions: int,
    tie_word_embeddings: bool,
    token_ids: dict[str, int | list[int] | None],
) -> Any:
    """The transformers config of a tiny model of `family` (its family's distinctive settings on)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config  # noqa: PLC0415

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie_word_embeddings,
        **token_ids,
    }
    qwen_rope = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if family == "qwen2":
        return Qwen2Config(rope_parameters=qwen_rope, **common)
    if family == "qwen3":
        return Qwen3Config(head_dim=hidden_size // num_heads, rope_parameters=qwen_rope, **common)
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": max_positions // 4,
        "rope_theta": 500_000.0,
    }
    return LlamaConfig(rope_parameters=scaling, **common)


def make_tiny_checkpoint(
    out_dir: str | Path,
    *,
    family: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_positions: int = 512,
    vocab_size: int = 384,
    model_vocab_size: int | None = None,
    tie_word_embeddings: bool = True,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """Write a random checkpoint of `family` with its tokenizer to `out_dir`; returns the path.

    The model's vocabulary is the tokenizer's rounded up to a multiple of 64, as real checkpoints
    pad it (ids past the tokenizer's exist in the model and are never produced by the tokenizer),
    or `model_vocab_size` rows (e.g. Qwen2.5's 151,936, for benchmarks at a real model's shape).
    head_dim = hidden_size / num_heads should be at least 32 for vLLM's CPU attention.
    """
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: PLC0415

    if family not in SPECIALS:
        raise ValueError(f"family {family!r}: choose one of {sorted(SPECIALS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(family, vocab_size)
    sp = SPECIALS[family]
    token_id = tokenizer.convert_tokens_to_ids
    token_ids: dict[str, int | list[int] | None] = {
        "bos_token_id": token_id(sp.bos) if sp.bos else None,
        "eos_token_id": [token_id(sp.end_of_turn), token_id(sp.eos)],
        "pad_token_id": token_id(sp.pad),
    }
    config = hf_config(
        family,
        vocab_size=model_vocab_size or -(-len(tokenizer) // 64) * 64,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        token_ids=token_ids,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))  # type: ignore[no-untyped-call]
    if family == "qwen2":  # random q/k/v biases, so the bias path is exercised, not all zeros
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("_proj.bias"):
                    param.normal_(std=0.02)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig(**{k: v for k, v in token_ids.items() if v is not None})  # type: ignore[no-untyped-call]
    generation.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="asyncgrpo make-tiny-checkpoint",
        description="Write a small random Hugging Face checkpoint (model, BPE tokenizer, chat template).",
    )
    parser.add_argument("dir", help="output directory")
    parser.add_argument("--family", choices=sorted(SPECIALS), default="qwen2")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--max-positions", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=384, help="BPE vocabulary (specials included)")
    parser.add_argument(
        "--model-vocab-size", type=int, default=None, help="embedding rows (default: the tokenizer's, padded)"
    )
    parser.add_argument("--untied", action="store_true", help="a separate output head (default: tied)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warm-start",
        nargs="?",
        const="reverse",
        metavar="TASK",
        help="then teach it by supervised fine-tuning (1-4 minutes on 2 threads; progress on stderr), "
        "so that GRPO has a signal: `reverse` (the default) 3- and 5-digit reversal, for 4-digit "
        "reversal (docs/examples/pretrained-cpu.yaml); `calculator` conversations that rarely call "
        "the calculator tool (docs/guides/environments.md, the calculator's job)",
    )
    parser.add_argument(
        "--warm-start-steps", type=int, help="fine-tuning steps of 64 examples (default: the task's)"
    )
    ns = parser.parse_args(argv)
    if ns.warm_start:
        from asyncgrpo_trainer.warm_start import tasks, warm_start  # noqa: PLC0415  (torch training)

        if ns.warm_start not in tasks():  # before the checkpoint is written
            parser.error(f"--warm-start {ns.warm_start!r}: choose one of {', '.join(sorted(tasks()))}")
    out = make_tiny_checkpoint(
        ns.dir,
        family=ns.family,
        hidden_size=ns.hidden_size,
        num_layers=ns.layers,
        num_heads=ns.heads,
        num_kv_heads=ns.kv_heads,
        intermediate_size=ns.intermediate_size,
        max_positions=ns.max_positions,
        vocab_size=ns.vocab_size,
        model_vocab_size=ns.model_vocab_size,
        tie_word_embeddings=not ns.untied,
        dtype=ns.dtype,
        seed=ns.seed,
    )
    made: dict[str, Any] = {"checkpoint": str(out), "family": ns.family}
    if ns.warm_start:
        checked = warm_start(out, ns.warm_start, steps=ns.warm_start_steps, seed=ns.seed, log=sys.stderr)
        made["warm_start"] = {"task": ns.warm_start, **checked}
    print(json.dumps(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
