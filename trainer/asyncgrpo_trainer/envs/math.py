"""Math answers for real models, checked by math-verify: \\boxed{}, fractions, LaTeX and numbers.

The reference answer of a data row is the content of the last \\boxed{} of its answer text (a
MATH solution), or the whole text when it has none (a column that holds only the answer). A
response is correct when math-verify finds it equivalent to the reference: it extracts the
response's answer (a \\boxed{} first, else the last LaTeX or plain expression) and compares
numbers, fractions and expressions symbolically (so 0.5, 1/2, \\frac{2}{4} are all equal). The
reward is 1.0 or 0.0, and a response cut at maxNewTokens is wrong. The built-in prompt set is
generated word problems so that a job with env math runs without a dataset volume; real runs point
data.trainPath at a file.

math-verify guards each parse and comparison with a SIGALRM deadline (MATH_VERIFY_SECONDS), which
works only on a process's main thread: the reward actors score there. Elsewhere (a thread of a test
or a tool) the deadline is off, and the reward pool's env.timeoutSeconds is the bound. A parse or
comparison that times out or raises is `MathVerifyError`, a failed scoring call (retried, then the
group dropped), never a wrong answer: a 0 for an answer the checker could not settle would be
trained on as if the policy had been wrong. A reference answer is parsed once and cached only when
the parse succeeded, so one timed-out parse does not fail every later group of that prompt.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from asyncgrpo_trainer.envs.base import Environment, Example, Score
from asyncgrpo_trainer.models.tokenizer import PRINTABLE

_T = TypeVar("_T")
INSTRUCTION = " Put the final answer in \\boxed{}."


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text`, braces balanced; None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


MATH_VERIFY_SECONDS = 5
"""math-verify's own deadline per parse and per comparison (its default)."""


def _deadline() -> int | None:
    return MATH_VERIFY_SECONDS if threading.current_thread() is threading.main_thread() else None


@functools.cache
def _math_verify() -> Any:
    """math-verify, imported on first use: sympy and its LaTeX parser take seconds to import, which
    only the processes that score math pay (not the driver, the controller or the torch workers)."""
    import math_verify  # noqa: PLC0415

    # Its warning that a disabled deadline is the caller's job (off the main thread): it is, here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


class MathVerifyError(RuntimeError):
    """math-verify timed out or raised while parsing or comparing: this call could not score."""


def _checked(what: str, call: Callable[[], _T]) -> _T:
    """`call` (a math-verify parse or verify with raise_on_error) with its timeout, a BaseException
    there, and its errors turned into MathVerifyError naming `what` it was doing."""
    from math_verify.errors import TimeoutException  # noqa: PLC0415  (imported with math-verify)

    try:
        return call()
    except TimeoutException as exc:
        raise MathVerifyError(f"math-verify timed out {what} (after {MATH_VERIFY_SECONDS}s)") from exc
    except Exception as exc:
        raise MathVerifyError(f"math-verify failed {what}: {type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=4096)
def _parsed_reference(reference: str) -> list[Any]:
    # A reference is an answer, not prose: parsed as LaTeX in math mode ("\\frac{1}{2}", "5\\sqrt{2}").
    # lru_cache keeps only returned values: a parse that raised is tried again by the next call.
    what = f"parsing the reference answer {reference[:60]!r}"
    mv = _math_verify()
    parsed: list[Any] = _checked(
        what, lambda: mv.parse(f"${reference}$", parsing_timeout=_deadline(), raise_on_error=True)
    )
    if not parsed:
        raise MathVerifyError(f"math-verify found no answer {what}")
    return parsed


def answers_match(response: str, reference: str) -> bool:
    """Whether math-verify finds the answer of `response` equivalent to `reference`; MathVerifyError
    when it could not tell (module docstring)."""
    mv = _math_verify()
    predicted = _checked(
        "parsing the response", lambda: mv.parse(response, parsing_timeout=_deadline(), raise_on_error=True)
    )
    gold = _parsed_reference(reference)
    return bool(
        _checked(
            f"comparing the response with {reference[:60]!r}",
            lambda: mv.verify(gold, predicted, timeout_seconds=_deadline(), raise_on_error=True),
        )
    )


class MathEnvironment(Environment):
    """Exact-answer math with \\boxed{} extraction; see the module docstring."""

    name = "math"
    alphabet = PRINTABLE

    def builtin_examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        rng = random.Random(f"{seed}-{split}-math")
        out: list[Example] = []
        parity = 0 if split == "train" else 1
        while len(out) < count:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            if ((a + b) % 7 == 0 and parity == 0) or ((a + b) % 7 != 0 and parity == 1):
                continue
            kind = rng.choice(("sum", "product", "difference"))
            if kind == "sum":
                out.append(Example(f"What is {a} plus {b}?{INSTRUCTION}", str(a + b)))
            elif kind == "product":
                out.append(Example(f"What is {a} times {b}?{INSTRUCTION}", str(a * b)))
            else:
                out.append(Example(f"What is {a} minus {b}?{INSTRUCTION}", str(a - b)))
        return out

    def reference(self, answer: str) -> str:
        boxed = last_boxed(answer)
        if boxed is not None and boxed.strip():
            return boxed.strip()
        if "\\boxed" in answer:
            raise ValueError("has a \\boxed{} that is empty or not closed")
        return answer.strip()

    def score(self, example: Example, response: str, *, finished: bool) -> Score:
        correct = finished and answers_match(response, example.answer)
        return Score(1.0 if correct else 0.0, correct)
