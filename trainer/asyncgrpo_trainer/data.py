"""Prompt data: where the prompts come from, which rows are skipped, and the resumable loader.

Sources. data.trainPath / data.validationPath name data files (`datafiles` reads them); a row
becomes an Example through data.promptKey and data.answerKey, and the environment takes the
reference answer out of the answer text (`Environment.reference`: gsm8k the number after ####,
math the last \\boxed{}). The Example keeps the whole row (`Example.row`), which a reward function
may read. Without trainPath the environment's built-in set is used. The held-out set
is validationPath's first numValidationPrompts usable rows; without validationPath but with
trainPath, numValidationPrompts rows of the training file drawn with the job seed, which are then
never trained on; with neither, the environment's built-in validation set.

Rows as people have them. A key may be a dotted path into nested objects and lists
(`reward_model.ground_truth`, `messages.1.content`); a prompt may be text or chat messages (a list
of {role, content}, up to its last user turn: `Example.chat`, which the tokenizer renders with the
chat template); an answer may be text or a number. So the Parquet files of verl's GSM8K/MATH
preprocessing (prompt = [{role: user, ...}], reward_model = {ground_truth: "72"}) and NeMo-RL's
chat rows (messages = [user question, assistant answer]) are used as they are, by key mapping.

Skipped rows. A row without the key, with a prompt that is not non-empty text or chat messages, an
answer that is not text or a number, or without a reference answer is a bad row; a prompt longer
than data.maxPromptLength tokens (or one the tokenizer cannot encode) is skipped too. Both are
counted per source and reported once, as one line (`SourceReport.summary`), by the driver's log and
the status message. A source with no usable row fails the job at start with `InvalidDataError`,
naming the field, the file and its first bad row.

The loader yields batches of P prompts forever, reshuffling every epoch with a seed derived from
the job seed and the epoch, so its whole state is (epoch, position) and a resumed run continues
with exactly the prompts an uninterrupted run would have seen next. Only the rollout pump reads it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncgrpo_trainer import datafiles
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Environment, Example
from asyncgrpo_trainer.models.tokenizer import Chat, Tokenizer

BUILTIN_TRAIN_SIZE = 4096


@dataclass
class SourceReport:
    """What became of the rows of one source of prompts (a data file or a built-in set)."""

    source: str
    """How the user names it: `data.trainPath /data/train.jsonl`, `the built-in reverse train set`."""
    rows: int = 0
    used: int = 0
    bad: int = 0
    first_bad: str | None = None
    too_long: int = 0

    def skip(self, where: str, why: str) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = f"{where}: {why}"

    def summary(self, max_prompt_length: int) -> str | None:
        """One line on the skipped rows; None when every row was used."""
        parts = []
        if self.bad:
            parts.append(f"{self.bad} bad row(s) skipped (first: {self.first_bad})")
        if self.too_long:
            parts.append(
                f"{self.too_long} prompt(s) over data.maxPromptLength ({max_prompt_length} tokens) skipped"
            )
        if not parts:
            return None
        return f"{self.source}: {', '.join(parts)}; {self.used} of {self.rows} rows used"


@dataclass(frozen=True)
class RowMapping:
    """How a data file's row becomes an Example: data.promptKey, data.answerKey, the environment."""

    prompt_key: str
    answer_key: str
    reference: Callable[[str], str]
    """`Environment.reference`: the reference answer in the answer text, or ValueError saying why not."""

    def example(self, row: datafiles.Row) -> Example | str:
        """The row's Example, or why the row is bad."""
        try:
            if row.error is not None:
                raise _BadRowError(row.error)
            if not isinstance(row.value, Mapping):
                raise _BadRowError(
                    f"is {_kind(row.value)}, not an object with {self.prompt_key!r} and {self.answer_key!r}"
                )
            prompt, chat = _prompt(
                _lookup(row.value, self.prompt_key, "promptKey", "prompt"), self.prompt_key
            )
            answer = _answer(
                _lookup(row.value, self.answer_key, "answerKey", "reference answer"), self.answer_key
            )
            try:
                return Example(prompt, self.reference(answer), chat, plain_row(row.value))
            except ValueError as exc:
                raise _BadRowError(f"{self.answer_key!r} {exc}") from None
        except _BadRowError as exc:
            return str(exc)


def plain_row(value: Mapping[Any, Any]) -> dict[str, Any]:
    """The row as JSON data (`Example.row`): objects with text keys, lists, text, numbers, booleans
    and null; anything else (the dates or bytes a Parquet column may hold) as its text. So a reward
    function gets the same types whichever file format the row came from, and checkpoints hold plain
    data."""
    return {str(k): _plain(v) for k, v in value.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return plain_row(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


class _BadRowError(Exception):
    """Why a row cannot become an Example."""


def _lookup(row: Mapping[Any, Any], key: str, field: str, what: str) -> Any:
    """row[key], or along a dotted path: `reward_model.ground_truth` (a nested object, as verl's
    files hold it), `messages.1.content` (a list index, as NeMo-RL's chat rows hold the answer).
    A column whose own name has dots is found first."""
    if key in row:
        return row[key]
    value: Any = row
    walked: list[str] = []
    for part in key.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and _index(part, len(value)) is not None:
            value = value[int(part)]
        else:
            if isinstance(value, Mapping):
                found = f"keys: {', '.join(sorted(str(k) for k in value)) or 'none'}"
            elif isinstance(value, list):
                found = f"a list of {len(value)}"
            else:
                found = _kind(value)
            where = f"{'.'.join(walked)!r} holds {found}" if walked else f"its {found}"
            path = " (a dotted path for a nested one)" if "." in key else ""
            raise _BadRowError(
                f"has no {key!r} ({where}); set data.{field} to the column{path} that holds the {what}"
            )
        walked.append(part)
    return value


def _index(part: str, length: int) -> int | None:
    """`part` as an index into a list of `length` (negative from the end), or None."""
    try:
        i = int(part)
    except ValueError:
        return None
    return i if -length <= i < length else None


def _prompt(value: Any, key: str) -> tuple[str, Chat]:
    """(text, chat) of a prompt: a non-empty string, or chat messages (a list of {role, content}).
    Turns after the last user turn are dropped: in NeMo-RL's rows the assistant turn that follows
    the question is its reference answer, not part of the prompt."""
    if isinstance(value, str):
        if not value.strip():
            raise _BadRowError(f"{key!r} is empty")
        return value, ()
    if not isinstance(value, list) or not value:
        raise _BadRowError(
            f"{key!r} is {_kind(value)}, not a string or chat messages (a list of {{role, content}})"
        )
    turns: list[tuple[str, str]] = []
    for n, message in enumerate(value):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise _BadRowError(
                f"{key!r} item {n} is not a chat message ({{role, content}}, both strings); got "
                f"{_kind(message)}"
            )
        turns.append((message["role"], message["content"]))
    users = [n for n, (role, _) in enumerate(turns) if role == "user"]
    if not users:
        raise _BadRowError(f"{key!r} has no user turn (roles: {', '.join(r for r, _ in turns)})")
    chat = tuple(turns[: users[-1] + 1])
    if not chat[-1][1].strip():
        raise _BadRowError(f"{key!r} ends with an empty user turn")
    return chat[-1][1], chat


def _answer(value: Any, key: str) -> str:
    """The answer text: a non-empty string, or a number (written as Python writes it: 72, 0.5)."""
    if isinstance(value, str):
        if not value.strip():
            raise _BadRowError(f"{key!r} is empty")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _BadRowError(f"{key!r} is {value}, not a finite number")
        return str(value)
    raise _BadRowError(f"{key!r} is {_kind(value)}, not a string or a number")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    name = type(value).__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def fits(
    examples: list[tuple[str, Example]],
    tokenizer: Tokenizer,
    max_prompt_length: int,
    report: SourceReport,
) -> list[Example]:
    """Examples whose prompt encodes within max_prompt_length tokens; the others are counted in
    `report` (too long, or a bad row when the tokenizer cannot encode the prompt)."""
    out: list[Example] = []
    for where, example in examples:
        try:
            length = len(tokenizer.encode_prompt(example.model_prompt))
        except ValueError as exc:  # the tiny model's character tokenizer has a fixed alphabet
            report.skip(where, f"the prompt cannot be tokenized: {exc}")
            continue
        if length > max_prompt_length:
            report.too_long += 1
        else:
            out.append(example)
    report.used = len(out)
    return out


@dataclass
class PromptLoader:
    """Endless, seeded, resumable batches of `batch_size` prompts; see the module docstring."""

    examples: list[Example]
    batch_size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    position: int = 0
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.examples:
            raise ValueError("no training prompts (all longer than data.maxPromptLength?)")
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[Example]:
        return [self.next_example() for _ in range(self.batch_size)]

    def next_example(self) -> Example:
        """The next prompt (a batch's, or the replacement of a dropped group)."""
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        example = self.examples[self._order[self.position]]
        self.position += 1
        return example

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)


@dataclass(frozen=True)
class Prompts:
    """The training and held-out examples of a job, and what was skipped on the way."""

    train: list[Example]
    validation: list[Example]
    reports: list[SourceReport]

    def summary(self, max_prompt_length: int) -> str | None:
        """Every source's skipped rows in one line (the driver logs it and /progress serves it)."""
        lines = [s for r in self.reports if (s := r.summary(max_prompt_length)) is not None]
        return "; ".join(lines) or None


def load_prompts(
    env: Environment,
    tokenizer: Tokenizer,
    *,
    train_path: str | None,
    validation_path: str | None,
    prompt_key: str,
    answer_key: str,
    num_validation: int,
    max_prompt_length: int,
    seed: int,
) -> Prompts:
    """The job's prompts from its data files or the environment's built-in sets (module docstring);
    InvalidDataError when a file is missing, unreadable or has no usable row."""
    mapping = RowMapping(prompt_key, answer_key, env.reference)

    def from_file(path: str, field: str) -> tuple[list[Example], SourceReport]:
        report = SourceReport(f"data.{field} {path}")
        rows: list[tuple[str, Example]] = []
        for row in datafiles.read_rows(path, f"data.{field}"):
            report.rows += 1
            example = mapping.example(row)
            if isinstance(example, Example):
                rows.append((row.where, example))
            else:
                report.skip(row.where, example)
        usable = fits(rows, tokenizer, max_prompt_length, report)
        if not usable:
            raise InvalidDataError(_no_usable_row(report, max_prompt_length))
        return usable, report

    def builtin(split: str, count: int) -> tuple[list[Example], SourceReport]:
        report = SourceReport(f"the built-in {env.name} {split} set")
        examples = env.builtin_examples(split=split, count=count, seed=seed)
        report.rows = len(examples)
        usable = fits(
            [(f"prompt {i}", e) for i, e in enumerate(examples, 1)], tokenizer, max_prompt_length, report
        )
        if examples and not usable:
            raise InvalidDataError(_no_usable_row(report, max_prompt_length))
        return usable, report

    reports: list[SourceReport] = []
    if train_path:
        train, report = from_file(train_path, "trainPath")
        reports.append(report)
    else:
        train, report = builtin("train", BUILTIN_TRAIN_SIZE)
        reports.append(report)
    if num_validation == 0:
        val: list[Example] = []
    elif validation_path:
        val, report = from_file(validation_path, "validationPath")
        val = val[:num_validation]
        reports.append(report)
    elif train_path:
        train, val = _hold_out(train, num_validation, seed, train_path)
    else:
        val, report = builtin("validation", num_validation)
        reports.append(report)
    return Prompts(train, val, reports)


def _hold_out(
    examples: list[Example], count: int, seed: int, path: str
) -> tuple[list[Example], list[Example]]:
    """(train, validation): `count` examples drawn with the seed are held out, in file order."""
    if count >= len(examples):
        raise InvalidDataError(
            f"data.trainPath {path}: its {len(examples)} usable row(s) would all be held out for validation "
            f"(data.numValidationPrompts {count}, no data.validationPath); set data.validationPath or "
            f"lower numValidationPrompts"
        )
    held = set(random.Random(f"{seed}-validation").sample(range(len(examples)), count))
    train = [e for i, e in enumerate(examples) if i not in held]
    return train, [e for i, e in enumerate(examples) if i in held]


def _no_usable_row(report: SourceReport, max_prompt_length: int) -> str:
    if report.rows == 0:
        return f"{report.source}: no rows"
    why = []
    if report.first_bad is not None:
        why.append(f"the first bad row is {report.first_bad}")
    if report.too_long:
        why.append(
            f"{report.too_long} prompt(s) are longer than data.maxPromptLength ({max_prompt_length} tokens)"
        )
    return f"{report.source}: no usable row of {report.rows}: {'; '.join(why)}"
