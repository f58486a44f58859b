"""Data files: the rows of a JSON Lines, JSON or Parquet file, or of a datasets save_to_disk directory.

`read_rows` yields each row with where it is (`line 7`, `row 7`) so that a bad row can be named.
Which format a path holds is decided by what it is: a directory is a save_to_disk directory, and
a file by its suffix (.jsonl, .json, .parquet). A .json file holds one JSON array of rows; one that
does not start with `[` is read as JSON Lines, as many .json files in the wild are.

Parquet files and save_to_disk directories are read with the `datasets` library, in memory (its
cache goes to a temporary directory that is removed at once, so a read-only home is fine). JSON
and JSON Lines are parsed with the standard library, one row at a time: the `datasets` JSON loader
(5.2) stores a column whose rows mix types (a string answer in one row, a number in another) as
JSON and parses the strings back, so the answer "007" of a good row came back as the number 7.
Reading the rows exactly keeps a bad row bad and a good row good.

Every failure to read is `InvalidDataError`, whose message names the field and the file; the
driver exits with `exitcodes.INVALID_DATA` on it, which the operator reports as InvalidData and
never retries.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json", ".parquet")
FORMATS = (
    "a JSON Lines (.jsonl), JSON (.json) or Parquet (.parquet) file, or a directory written by save_to_disk"
)


class InvalidDataError(ValueError):
    """The job's data (or its reward function) cannot be used; the message names the field and file."""


@dataclass(frozen=True)
class Row:
    """One row as read, and where it is in its file (`line 7` of JSON Lines, `row 7` otherwise)."""

    where: str
    value: Any
    """A mapping for a well-formed row; anything else (a list, a number) is a bad row."""
    error: str | None = None
    """Why the row could not be read at all (a JSON Lines line that is not JSON)."""


def read_rows(path: str, field: str) -> Iterator[Row]:
    """Each row of the file or directory at `path`, which `field` names; see the module docstring."""
    p = Path(path)
    if not p.exists():
        raise InvalidDataError(f"{field}: {path} does not exist (is the data volume mounted there?)")
    if p.is_dir():
        yield from _saved_dataset(p, field)
    elif p.suffix == ".parquet":
        yield from _parquet(p, field)
    elif p.suffix in (".jsonl", ".json"):
        yield from _json(p, field)
    else:
        raise InvalidDataError(f"{field}: {path} is not a data format the trainer reads; use {FORMATS}")


def _json(p: Path, field: str) -> Iterator[Row]:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidDataError(f"{field}: cannot read {p}: {exc}") from exc
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidDataError(f"{field}: {p} is not valid JSON: {exc}") from exc
        for n, row in enumerate(rows, 1):
            yield Row(f"row {n}", row)
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield Row(f"line {n}", json.loads(line))
        except json.JSONDecodeError as exc:  # one bad line is a bad row, not a bad file
            yield Row(f"line {n}", None, f"not valid JSON ({exc})")


def _datasets() -> Any:
    """The datasets library, imported on first use: seconds of imports (pyarrow, pandas) that only
    jobs reading Parquet or save_to_disk data pay."""
    import datasets  # noqa: PLC0415

    datasets.disable_progress_bars()
    return datasets


def _parquet(p: Path, field: str) -> Iterator[Row]:
    datasets = _datasets()
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-datasets-") as cache:
        try:
            table = datasets.Dataset.from_parquet(str(p), cache_dir=cache, keep_in_memory=True)
        except Exception as exc:  # pyarrow and datasets raise many types for a corrupt file
            raise InvalidDataError(
                f"{field}: cannot read {p} as Parquet: {type(exc).__name__}: {exc}"
            ) from exc
    yield from _dataset_rows(table)


def _saved_dataset(p: Path, field: str) -> Iterator[Row]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(p), keep_in_memory=True)
    except FileNotFoundError as exc:
        raise InvalidDataError(
            f"{field}: {p} is a directory but not one written by save_to_disk (no dataset_info.json); "
            f"use {FORMATS}"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(f"{p}/{name}" for name in loaded)
        raise InvalidDataError(
            f"{field}: {p} holds several splits (a DatasetDict); point {field} at one of them: {splits}"
        )
    yield from _dataset_rows(loaded)


def _dataset_rows(table: Any) -> Iterator[Row]:
    for n, row in enumerate(table, 1):
        yield Row(f"row {n}", row)
