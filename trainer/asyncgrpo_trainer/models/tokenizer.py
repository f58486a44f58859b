"""Tokenizers: what the trainer needs from one, and the character-level tokenizer of the tiny model.

`Tokenizer` is the whole contract the rollout side, validation and the data loader use: prompts
go in as text and come out as token ids ready for generation (a chat template, a system prompt and
a beginning-of-sequence token applied as the model expects), responses come back as text for the
reward. The tiny model's `CharTokenizer` is built locally from an alphabet: one token per character
plus three specials. A small alphabet matters for learning from random weights, because a random
policy then emits a plausible character often enough for the reward to have signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Tokenizer(Protocol):
    """What the trainer asks of a tokenizer (the tiny model's or a checkpoint's own)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Tokens that end a response (generation stops on any of them)."""
        ...

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt as the model is given it (template, system prompt, BOS applied)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of response ids up to the first end-of-sequence token; special tokens dropped."""
        ...


PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)


@dataclass(frozen=True)
class CharTokenizer:
    """Maps characters of `alphabet` to ids 3.. ; ids 0, 1, 2 are pad, bos and eos."""

    alphabet: str
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("alphabet has repeated characters")
        object.__setattr__(self, "_index", {ch: i + len(SPECIALS) for i, ch in enumerate(self.alphabet)})

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.alphabet)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; characters outside the alphabet are an error, not silently dropped."""
        try:
            ids = [self._index[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer alphabet") from None
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` up to the first eos; specials are dropped."""
        chars: list[str] = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= len(SPECIALS):
                chars.append(self.alphabet[i - len(SPECIALS)])
        return "".join(chars)


PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"
