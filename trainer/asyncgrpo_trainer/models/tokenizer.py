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
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from asyncgrpo_trainer.models.directory import GENERATION_CONFIG, InvalidModelError, read_json

Chat = tuple[tuple[str, str], ...]
"""A prompt given as chat messages: (role, content) turns, ending with a user turn."""
Prompt = str | Chat
"""A prompt as a data row gives it: text, or chat messages (`envs.base.Example.model_prompt`)."""


def plain_text(prompt: Prompt) -> str:
    """The text of a prompt for a tokenizer without a chat template: the text itself, or the content
    of a chat's only turn when that is a user turn; ValueError otherwise, since turns and roles
    cannot be written without a template."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and prompt[0][0] == "user":
        return prompt[0][1]
    roles = ", ".join(role for role, _ in prompt)
    raise ValueError(
        f"chat messages of {len(prompt)} turns ({roles}) need a chat template, and this tokenizer is used "
        "without one (the tiny model's, or data.chatTemplate false); give one user turn or a checkpoint "
        "with a chat template"
    )


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

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt as the model is given it (template, system prompt, BOS applied);
        ValueError when it cannot be encoded (a bad row)."""
        ...

    def encode_turn(self, role: str, content: str) -> list[int]:
        """Token ids of one more turn of a conversation (`conversation`): appended after the
        policy's turn, which ended with its end-of-sequence token, they close that turn as the chat
        template does, write `content` as a `role` turn and open the policy's next turn."""
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

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.encode(plain_text(prompt))

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; characters outside the alphabet are an error, not silently dropped."""
        try:
            ids = [self._index[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer alphabet") from None
        return [self.bos_id, *ids] if add_bos else ids

    def encode_turn(self, role: str, content: str) -> list[int]:
        """The characters of `content`: without a chat template a turn is its text (the role is
        the environment's to spell out in `content` when the task needs one)."""
        return self.encode(content, add_bos=False)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` up to the first eos; specials are dropped."""
        chars: list[str] = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= len(SPECIALS):
                chars.append(self.alphabet[i - len(SPECIALS)])
        return "".join(chars)


TURN_MARK = "\u2063turn\u2063"
"""A placeholder content that no template alters, to find where an assistant turn's text ends."""

PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"


class CheckpointTokenizer:
    """A checkpoint's own tokenizer (transformers AutoTokenizer over the directory's files).

    Prompts go through the tokenizer's chat template when `chat_template` is true (None: when the
    tokenizer has one), as one user turn (or the row's own chat messages) after an optional system
    turn (data.systemPrompt, unless the messages start with their own), with the generation prompt
    appended; otherwise the text is encoded with the tokenizer's own special tokens (a BOS where
    the family adds one). A response ends at any of `eos_ids`: the ids generation_config.json names
    plus the tokenizer's EOS token. The tokenizer is loaded lazily in each process, so the object
    pickles as its settings (Ray ships it to the controller and the workers).
    """

    def __init__(
        self,
        directory: str,
        *,
        chat_template: bool | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.directory = directory
        self.system_prompt = system_prompt
        tok = self._tok
        has_template = bool(getattr(tok, "chat_template", None))
        if chat_template and not has_template:
            raise InvalidModelError(
                f"spec.trainer.data.chatTemplate is true but the tokenizer in {directory} has no chat "
                "template; set chatTemplate: false"
            )
        self.chat_template = has_template if chat_template is None else chat_template
        eos = generation_eos_ids(directory)
        if tok.eos_token_id is not None:
            eos.append(int(tok.eos_token_id))
        if not eos:
            raise InvalidModelError(
                f"{directory}: neither generation_config.json nor the tokenizer names an end-of-sequence "
                "token, so a response could never end; add eos_token_id to generation_config.json"
            )
        self._eos = tuple(dict.fromkeys(eos))
        pad = tok.pad_token_id
        self._pad = int(pad) if pad is not None else self._eos[0]
        self._vocab = len(tok)

    @cached_property
    def _tok(self) -> Any:
        from transformers import AutoTokenizer  # noqa: PLC0415  (heavy; only pretrained jobs need it)

        try:
            return AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise InvalidModelError(f"{self.directory}: the tokenizer files do not load: {exc}") from None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_tok"}

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if not self.chat_template:
            return list(self._tok(plain_text(prompt), add_special_tokens=True)["input_ids"])
        turns = (("user", prompt),) if isinstance(prompt, str) else prompt
        messages = [{"role": role, "content": content} for role, content in turns]
        if self.system_prompt and messages[0]["role"] != "system":  # a row's own system turn wins
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        rendered = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self._tok(rendered, add_special_tokens=False)["input_ids"])

    def encode_response(self, text: str) -> list[int]:
        """The ids of `text` as the model writes it after the prompt: no special tokens, no EOS."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode_turn(self, role: str, content: str) -> list[int]:
        """The chat template's rendering of a `role` turn after an assistant turn, with the
        generation prompt, less what the policy already wrote: the template's text after the
        assistant's content starts with the end-of-turn token the policy's turn ended with, and the
        rest (the newline after it, the new turn, the next assistant header) is encoded here.
        Without a chat template the turn is its plain text."""
        if not self.chat_template:
            return self.encode_response(content)
        before = [{"role": "user", "content": "?"}, {"role": "assistant", "content": TURN_MARK}]
        after = [*before, {"role": role, "content": content}]
        base = self._tok.apply_chat_template(before, tokenize=False)
        full = self._tok.apply_chat_template(after, tokenize=False, add_generation_prompt=True)
        closing = base[base.rindex(TURN_MARK) + len(TURN_MARK) :]
        if not full.startswith(base):
            raise ValueError(
                f"the chat template renders a {role!r} turn by rewriting the turns before it, so a "
                "conversation cannot be extended turn by turn; use a template that appends turns"
            )
        eos_text = next((t for t in (self._tok.eos_token, self._tok.decode(list(self._eos[:1]))) if t), "")
        text = closing.removeprefix(eos_text) + full[len(base) :]
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        end = next((i for i, t in enumerate(ids) if t in self._eos), len(ids))
        return str(self._tok.decode(list(ids[:end]), skip_special_tokens=True))


def generation_eos_ids(directory: str) -> list[int]:
    """The end-of-sequence ids generation_config.json names (an int or a list; none without it)."""
    path = Path(directory) / GENERATION_CONFIG
    if not path.is_file():
        return []
    eos = read_json(path).get("eos_token_id")
    values = eos if isinstance(eos, list) else [eos]
    return [int(v) for v in values if isinstance(v, int)]
