"""Reading job files: YAML documents in, manifests or clear errors out.

Shared by `asyncgrpo validate`, `render` and `run`, so a file that does not parse is reported the
same way by every command.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Document:
    """One YAML document of a file, or the reason it could not be read."""

    source: str
    index: int
    manifest: dict[str, Any] | None
    error: str | None = None

    @property
    def label(self) -> str:
        """'file.yaml' or 'file.yaml#2' for the second document of a stream."""
        return self.source if self.index == 0 else f"{self.source}#{self.index + 1}"


def read_documents(path: Path) -> Iterator[Document]:
    """Every non-empty YAML document of a file; unreadable files yield one error document."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        yield Document(source, 0, None, f"cannot read file: {exc}")
        return
    try:
        loaded = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        yield Document(source, 0, None, f"not valid YAML: {_yaml_problem(exc)}")
        return
    if not loaded:
        yield Document(source, 0, None, "file holds no YAML document")
    for index, doc in enumerate(loaded):
        if isinstance(doc, dict):
            yield Document(source, index, doc)
        else:
            yield Document(
                source, index, None, f"expected a mapping (an AsyncGRPOJob), got {type(doc).__name__}"
            )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return problem
