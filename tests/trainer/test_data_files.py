"""Data files as a user brings them: JSON Lines, JSON, Parquet and save_to_disk directories (written
with the real `datasets` library), any row shape by key mapping, bad rows counted and skipped, and
a file that cannot be used failing with InvalidDataError naming the field and the file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from asyncgrpo_trainer import data, datafiles, envs
from asyncgrpo_trainer.datafiles import InvalidDataError
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.models.tokenizer import PRINTABLE, CharTokenizer

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "docs/examples/data/gsm8k-tiny.jsonl"
MATH = REPO / "docs/examples/data/math-tiny.jsonl"
TOKENIZER = CharTokenizer(PRINTABLE)


def _load(env: str, train: Path | str, **options: Any) -> data.Prompts:
    settings: dict[str, Any] = {
        "validation_path": None,
        "prompt_key": "prompt",
        "answer_key": "answer",
        "num_validation": 0,
        "max_prompt_length": 1000,
        "seed": 0,
    }
    settings.update(options)
    return data.load_prompts(envs.build(env), TOKENIZER, train_path=str(train), **settings)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_rows_work_by_key_mapping_alone_with_the_number_after_the_marks_as_reference() -> None:
    prompts = _load("gsm8k", GSM8K, prompt_key="question")
    rows = _rows(GSM8K)
    assert [e.prompt for e in prompts.train] == [r["question"] for r in rows]
    assert prompts.train[0].answer == "29"  # "...\n#### 29"
    assert prompts.train[3].answer == "4776"  # "#### 4,776": thousands separators dropped
    assert prompts.summary(1000) is None  # every row used


def test_math_rows_work_by_key_mapping_alone_with_the_last_boxed_content_as_reference() -> None:
    prompts = _load("math", MATH, prompt_key="problem", answer_key="solution")
    answers = [e.answer for e in prompts.train]
    assert answers[0] == "\\frac{5}{6}" and answers[2] == "5\\sqrt{2}" and answers[13] == "-5"
    assert len(answers) == len(_rows(MATH))


def _as_parquet(rows: list[dict[str, Any]], tmp: Path) -> Path:
    path = tmp / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _as_saved(rows: list[dict[str, Any]], tmp: Path) -> Path:
    path = tmp / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _as_json_array(rows: list[dict[str, Any]], tmp: Path) -> Path:
    path = tmp / "train.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def _as_jsonl_named_json(rows: list[dict[str, Any]], tmp: Path) -> Path:
    return _write(tmp / "lines.json", rows)


@pytest.mark.parametrize("writer", [_as_parquet, _as_saved, _as_json_array, _as_jsonl_named_json])
def test_every_format_gives_the_examples_of_the_jsonl_file(writer: Any, tmp_path: Path) -> None:
    expected = _load("gsm8k", GSM8K, prompt_key="question").train
    path = writer(_rows(GSM8K), tmp_path)
    got = _load("gsm8k", path, prompt_key="question").train
    assert got == expected
    assert [e.row for e in got] == [e.row for e in expected] == _rows(GSM8K)  # whole rows, plain data


def test_bad_rows_are_skipped_counted_and_the_first_is_named_in_one_line(tmp_path: Path) -> None:
    rows: list[Any] = [
        {"question": "ok one", "answer": "#### 1"},
        {"question": "no answer key", "solution": "#### 2"},
        {"question": ["a", "list"], "answer": "#### 3"},
        {"question": "no marks", "answer": "three"},
        {"question": "ok two", "answer": "#### 5"},
        "not an object",
    ]
    path = _write(tmp_path / "train.jsonl", rows)
    with path.open("a") as f:
        f.write("{not json\n")
    prompts = _load("gsm8k", path, prompt_key="question")
    assert [e.answer for e in prompts.train] == ["1", "5"]
    summary = prompts.summary(1000)
    assert summary == (
        f"data.trainPath {path}: 5 bad row(s) skipped (first: line 2: has no 'answer' (its keys: question, "
        f"solution); set data.answerKey to the column that holds the reference answer); 2 of 7 rows used"
    )


def test_a_string_answer_stays_the_string_written_even_when_other_rows_hold_numbers(tmp_path: Path) -> None:
    # The datasets JSON loader turns "007" into 7 in a column of mixed types; the rows are read exactly.
    path = _write(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "007"}, {"prompt": "b", "answer": 7}])
    prompts = _load("reverse", path)
    assert [(e.prompt, e.answer) for e in prompts.train] == [("a", "007"), ("b", "7")]
    assert prompts.train[1].row == {"prompt": "b", "answer": 7}  # the row as written, for a reward function


def test_a_file_with_no_usable_row_fails_naming_the_field_the_file_and_the_first_bad_row(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "train.jsonl", [{"question": "q", "answer": "#### 1"}] * 3)
    with pytest.raises(InvalidDataError) as err:
        _load("gsm8k", path)  # promptKey left at its default, "prompt"
    assert str(err.value) == (
        f"data.trainPath {path}: no usable row of 3: the first bad row is line 1: has no 'prompt' (its keys: "
        f"answer, question); set data.promptKey to the column that holds the prompt"
    )


def test_prompts_over_max_prompt_length_are_skipped_and_counted(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": "x" * n, "answer": "1"} for n in (5, 50, 10, 60)])
    prompts = _load("reverse", path, max_prompt_length=20)  # the char tokenizer adds a BOS token
    assert [len(e.prompt) for e in prompts.train] == [5, 10]
    assert prompts.summary(20) == (
        f"data.trainPath {path}: 2 prompt(s) over data.maxPromptLength (20 tokens) skipped; 2 of 4 rows used"
    )
    with pytest.raises(InvalidDataError) as err:
        _load("reverse", path, max_prompt_length=4)
    assert str(err.value) == (
        f"data.trainPath {path}: no usable row of 4: 4 prompt(s) are longer than data.maxPromptLength "
        f"(4 tokens)"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "absent.jsonl", "data.trainPath: {path} does not exist"),
        (lambda tmp: _write(tmp / "rows.csv", []), "data.trainPath: {path} is not a data format"),
        (lambda tmp: _write(tmp / "empty.jsonl", []), "data.trainPath {path}: no rows"),
        (lambda tmp: tmp, "data.trainPath: {path} is a directory but not one written by save_to_disk"),
    ],
)
def test_a_file_that_cannot_be_used_fails_with_a_message_naming_field_and_file(
    make: Any, message: str, tmp_path: Path
) -> None:
    path = make(tmp_path)
    with pytest.raises(InvalidDataError) as err:
        _load("reverse", path)
    assert str(err.value).startswith(message.format(path=path))


def test_a_dataset_dict_directory_names_its_splits(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1=", "answer": "2"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(InvalidDataError, match=f"point data.trainPath at one of them: {tmp_path}/d/train"):
        _load("reverse", tmp_path / "d")


def test_a_corrupt_parquet_file_fails_as_invalid_data(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(InvalidDataError, match=f"data.trainPath: cannot read {path} as Parquet"):
        _load("reverse", path)


def test_without_a_validation_file_held_out_rows_of_the_training_file_are_never_trained_on() -> None:
    prompts = _load("gsm8k", GSM8K, prompt_key="question", num_validation=8, seed=3)
    again = _load("gsm8k", GSM8K, prompt_key="question", num_validation=8, seed=3)
    assert len(prompts.validation) == 8 and len(prompts.train) == 40
    assert not {e.prompt for e in prompts.validation} & {e.prompt for e in prompts.train}
    assert prompts == again  # the seed decides


def test_a_validation_file_gives_its_first_usable_rows_and_is_checked_like_the_training_file(
    tmp_path: Path,
) -> None:
    val = _write(tmp_path / "v.jsonl", [{"question": f"{i}+1=", "answer": f"#### {i + 1}"} for i in range(5)])
    prompts = _load("gsm8k", GSM8K, prompt_key="question", validation_path=str(val), num_validation=3)
    assert [e.answer for e in prompts.validation] == ["1", "2", "3"]
    assert len(prompts.train) == 48  # nothing held out of the training file
    other = _write(tmp_path / "w.jsonl", [{"q": "1+1=", "a": "2"}])
    with pytest.raises(InvalidDataError, match=f"data.validationPath {other}: no usable row of 1"):
        _load("gsm8k", GSM8K, prompt_key="question", validation_path=str(other), num_validation=3)


def test_holding_out_every_row_fails_with_the_fix(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 4)
    with pytest.raises(InvalidDataError, match=r"would all be held out .* set data\.validationPath"):
        _load("reverse", path, num_validation=4)


# --- rows as verl's and NeMo-RL's preprocessing scripts write them --------------------------------

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'


def _verl_gsm8k_row(index: int, question: str, number: str) -> dict[str, Any]:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it to train.parquet."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": number},
        "extra_info": {
            "split": "train",
            "index": index,
            "answer": f"steps\n#### {number}",
            "question": question,
        },
    }


def test_verls_gsm8k_parquet_is_used_directly_with_a_nested_answer_key(tmp_path: Path) -> None:
    rows = [_verl_gsm8k_row(0, QUESTION, "72"), _verl_gsm8k_row(1, "How many legs do 3 cats have?", "12")]
    path = _as_parquet(rows, tmp_path)
    prompts = _load("gsm8k", path, answer_key="reward_model.ground_truth")  # promptKey: prompt, the default
    text = QUESTION + INSTRUCTION
    assert prompts.train[0] == Example(text, "72", (("user", text),))
    assert [e.answer for e in prompts.train] == ["72", "12"] and prompts.summary(1000) is None
    # The tiny model's tokenizer has no chat template: a single user turn is encoded as its text.
    assert TOKENIZER.encode_prompt(prompts.train[0].model_prompt) == TOKENIZER.encode_prompt(text)
    assert dataclasses.asdict(prompts.train[0]) == {
        "prompt": text,
        "answer": "72",
        "chat": (("user", text),),
        "row": rows[0],  # verl's whole row (data_source, extra_info, ...), for a reward function
    }


def test_verls_math_parquet_is_used_directly(tmp_path: Path) -> None:
    """verl's math preprocessing stores the \\boxed{} content of the solution as ground_truth."""
    row = _verl_gsm8k_row(0, "What is 1/4 + 1/4?", "\\frac{1}{2}")
    row.update(data_source="DigitalLearningGmbH/MATH-lighteval", extra_info={"split": "train", "index": 0})
    prompts = _load("math", _as_parquet([row], tmp_path), answer_key="reward_model.ground_truth")
    assert prompts.train[0].answer == "\\frac{1}{2}"
    assert envs.build("math").score(prompts.train[0], "so \\boxed{0.5}", finished=True).correct


def test_nemo_rls_chat_rows_are_used_directly_the_answer_turn_left_out_of_the_prompt(tmp_path: Path) -> None:
    """NeMo-RL's GSM8K rows: the question as a user turn, the extracted answer as the assistant's."""
    rows = [
        {
            "messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "72"}],
            "task_name": "gsm8k",
        }
    ]
    path = _as_parquet(rows, tmp_path)
    for answer_key in ("messages.1.content", "messages.-1.content"):
        prompts = _load("gsm8k", path, prompt_key="messages", answer_key=answer_key)
        assert prompts.train == [Example(QUESTION, "72", (("user", QUESTION),))]


def test_numeric_answers_are_read_as_their_numbers(tmp_path: Path) -> None:
    rows: list[Any] = [
        {"prompt": "a", "answer": 72},
        {"prompt": "b", "answer": 0.5},
        {"prompt": "c", "answer": True},
        {"prompt": "d", "answer": None},
    ]
    prompts = _load("gsm8k", _write(tmp_path / "t.jsonl", rows))
    assert [(e.prompt, e.answer) for e in prompts.train] == [("a", "72"), ("b", "0.5")]
    assert "(first: line 3: 'answer' is a bool, not a string or a number)" in (prompts.summary(1000) or "")
    parquet = _as_parquet([{"prompt": "a", "answer": 72}, {"prompt": "b", "answer": 1200}], tmp_path)
    assert [e.answer for e in _load("gsm8k", parquet).train] == ["72", "1200"]  # an int64 column


def test_a_missing_nested_key_or_a_bad_chat_is_a_bad_row_saying_where_it_stopped(tmp_path: Path) -> None:
    rows: list[Any] = [
        {"prompt": "ok", "reward_model": {"ground_truth": "1"}},
        {"prompt": "no truth", "reward_model": {"style": "rule"}},
        {"prompt": [{"role": "system", "content": "be brief"}], "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}},
        {"prompt": ["a", "list"], "reward_model": {"ground_truth": "1"}},
        {
            "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two turns"}],
            "reward_model": {"ground_truth": "1"},
        },
    ]
    path = _write(tmp_path / "t.jsonl", rows)
    prompts = _load("gsm8k", path, answer_key="reward_model.ground_truth")
    assert [e.prompt for e in prompts.train] == ["ok"]
    summary = prompts.summary(1000) or ""
    assert (
        "5 bad row(s) skipped (first: line 2: has no 'reward_model.ground_truth' ('reward_model' holds keys: "
        "style); set data.answerKey to the column (a dotted path for a nested one) that holds the reference "
        "answer)"
    ) in summary
    reasons = [
        data.RowMapping("prompt", "reward_model.ground_truth", str).example(datafiles.Row("r", row))
        for row in rows[2:5]
    ]
    assert reasons == [
        "'prompt' has no user turn (roles: system)",
        "'prompt' item 0 is not a chat message ({role, content}, both strings); got a dict",
        "'prompt' item 0 is not a chat message ({role, content}, both strings); got a str",
    ]
    # Two turns need a chat template, which the tiny model's tokenizer has not.
    with pytest.raises(ValueError, match=r"chat messages of 2 turns \(system, user\) need a chat template"):
        TOKENIZER.encode_prompt((("system", "be brief"), ("user", "two turns")))
