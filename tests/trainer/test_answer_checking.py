"""The verifiable rewards for real models: math answers by math-verify, GSM8K by the final number,
and the reference answer each takes out of a data file's answer text."""

from __future__ import annotations

import pytest

from asyncgrpo_api import invariants
from asyncgrpo_trainer import envs
from asyncgrpo_trainer.envs import math as math_env
from asyncgrpo_trainer.envs.base import Example, Score


@pytest.mark.parametrize(
    ("response", "reference", "correct"),
    [
        ("so \\boxed{42}.", "42", True),
        ("The answer is $\\frac{2}{4}$", "\\frac{1}{2}", True),  # fractions compare by value
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{1,000}", "1000", True),
        ("\\boxed{\\frac{\\sqrt2}{2}}", "\\frac{\\sqrt{2}}{2}", True),  # LaTeX spellings
        ("\\boxed{1+x^2}", "x^2+1", True),  # expressions compare symbolically
        ("\\boxed{5\\sqrt{2}}", "5\\sqrt{2}", True),
        ("we get 42", "42", True),  # no box: math-verify takes the last expression
        ("\\boxed{41}", "42", False),
        ("\\boxed{4", "4", False),  # an unclosed box is no answer
        ("", "42", False),
    ],
)
def test_math_checks_answer_equivalence_with_math_verify(
    response: str, reference: str, correct: bool
) -> None:
    score = envs.build("math").score(Example("q", reference), response, finished=True)
    assert score == Score(1.0 if correct else 0.0, correct)


def test_a_math_response_cut_at_max_new_tokens_is_wrong() -> None:
    assert envs.build("math").score(Example("q", "42"), "\\boxed{42}", finished=False) == Score(0.0, False)


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("We add.\\n$1 + 1 = \\boxed{2}$, and then \\boxed{\\frac{a}{b}}.", "\\frac{a}{b}"),  # the last box
        ("\\boxed{\\frac{5}{6}}", "\\frac{5}{6}"),  # nested braces are balanced
        ("\\frac{1}{2}", "\\frac{1}{2}"),  # a column holding only the answer
    ],
)
def test_the_math_reference_is_the_last_boxed_content_of_the_answer_text(answer: str, reference: str) -> None:
    assert envs.build("math").reference(answer) == reference


def test_a_math_answer_with_an_unclosed_box_is_a_bad_row() -> None:
    with pytest.raises(ValueError, match="empty or not closed"):
        envs.build("math").reference("so \\boxed{12")
    assert math_env.last_boxed("\\boxed{\\frac{a}{b}} x") == "\\frac{a}{b}"


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("Ava has 23 + 6 = <<23+6=29>>29 apples.\n#### 29", "29"),
        ("#### 4,776", "4776"),
        ("#### $1,200.", "1200"),
        ("#### 1.50", "1.5"),
        ("#### -3", "-3"),
        ("42", "42"),  # a column holding only the answer
    ],
)
def test_the_gsm8k_reference_is_the_number_after_the_marks(answer: str, reference: str) -> None:
    assert envs.build("gsm8k").reference(answer) == reference


@pytest.mark.parametrize("answer", ["no number here", "#### x", "#### 1e5", "reasoning, then 42"])
def test_a_gsm8k_answer_without_a_final_number_is_a_bad_row(answer: str) -> None:
    with pytest.raises(ValueError, match="has no final number"):
        envs.build("gsm8k").reference(answer)


@pytest.mark.parametrize(
    ("response", "correct"),
    [
        ("12 * 398 = 4776 dollars.\n#### 4776", True),
        ("The answer is 4,776.", True),
        ("$4,776.00 in total", True),
        ("\\boxed{4776}", True),
        ("4776 is wrong, it is 4777", False),  # the final number counts
        ("no number", False),
    ],
)
def test_gsm8k_compares_the_final_number_of_the_response(response: str, correct: bool) -> None:
    score = envs.build("gsm8k").score(Example("q", "4776"), response, finished=True)
    assert score == Score(1.0 if correct else 0.0, correct)


def test_the_environments_admission_lets_run_without_a_data_file_are_those_with_prompts() -> None:
    for name in envs.REGISTRY:
        env = envs.build(name)
        if name in invariants.BUILTIN_PROMPT_SETS:
            assert env.builtin_examples(split="train", count=4, seed=0)
        else:
            with pytest.raises(ValueError, match=r"set data\.trainPath"):
                env.builtin_examples(split="train", count=4, seed=0)


def _parse_fails_on(monkeypatch: pytest.MonkeyPatch, text: str, error: BaseException) -> list[str]:
    """math-verify's extraction raises `error` for `text` (as its SIGALRM deadline or a sympy error
    would), inside math-verify's own parse wrapper; returns the texts parsed, in order."""
    from math_verify import parser  # noqa: PLC0415

    real, parsed = parser.extract_target_from_pred, []

    def extract(pred: str, *args: object, **kwargs: object) -> object:
        parsed.append(pred)
        if pred == text:
            raise error
        return real(pred, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(parser, "extract_target_from_pred", extract)
    return parsed


def _timeout() -> BaseException:
    from math_verify.errors import TimeoutException  # noqa: PLC0415

    return TimeoutException("deadline")


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("\\boxed{42}", _timeout(), "math-verify timed out parsing the response"),
        (
            "\\boxed{42}",
            RecursionError("too deep"),
            "math-verify failed parsing the response: RecursionError",
        ),
        ("$42$", _timeout(), "math-verify timed out parsing the reference answer '42'"),
    ],
)
def test_a_math_verify_timeout_or_error_fails_the_call_instead_of_scoring_0(
    monkeypatch: pytest.MonkeyPatch, text: str, error: BaseException, message: str
) -> None:
    """A failed call is retried and then its group dropped (the reward pool); a 0 would be trained on."""
    math_env._parsed_reference.cache_clear()
    _parse_fails_on(monkeypatch, text, error)
    with pytest.raises(math_env.MathVerifyError, match=message):
        envs.build("math").score(Example("q", "42"), "\\boxed{42}", finished=True)


def test_a_math_verify_comparison_timeout_fails_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from math_verify import grader  # noqa: PLC0415

    def stuck(*args: object, **kwargs: object) -> bool:
        raise _timeout()

    monkeypatch.setattr(grader, "sympy_expr_eq", stuck)
    with pytest.raises(math_env.MathVerifyError, match="math-verify timed out comparing"):
        envs.build("math").score(Example("q", "x^2+1"), "\\boxed{1+x^2}", finished=True)


def test_a_reference_that_failed_to_parse_is_parsed_again_by_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    math_env._parsed_reference.cache_clear()
    _parse_fails_on(monkeypatch, "$17$", _timeout())
    env = envs.build("math")
    with pytest.raises(math_env.MathVerifyError):
        env.score(Example("q", "17"), "\\boxed{17}", finished=True)
    monkeypatch.undo()  # the deadline is met this time
    assert env.score(Example("q", "17"), "\\boxed{17}", finished=True) == Score(1.0, True)  # not cached
