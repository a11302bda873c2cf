"""GSM8K preprocess: verl's row format from the real jsonl files, and its errors."""

import json
import os

import pandas as pd
import pytest

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import gsm8k


def test_extract_solution_removes_commas_and_keeps_sign():
    assert gsm8k.extract_solution("so 1000+200 = 1,200\n#### 1,200") == "1200"
    assert gsm8k.extract_solution("#### -3.5") == "-3.5"
    assert gsm8k.extract_solution("no final line") is None


def test_writes_verl_rows_from_real_jsonl(gsm8k_dir, tmp_path):
    assert (
        gsm8k.main(["--input_dir", gsm8k_dir, "--local_dir", str(tmp_path), "--train_size", "5", "--test_size", "3"])
        is None
    )
    train = pd.read_parquet(tmp_path / "train.parquet")
    test = pd.read_parquet(tmp_path / "test.parquet")
    assert len(train) == 5 and len(test) == 3
    with open(os.path.join(gsm8k_dir, "train.jsonl")) as f:
        first = json.loads(f.readline())
    row = train.iloc[0]
    assert row["data_source"] == "openai/gsm8k"
    assert row["ability"] == "math"
    assert list(row["prompt"]) == [
        {
            "role": "user",
            "content": first["question"] + ' Let\'s think step by step and output the final answer after "####".',
        }
    ]
    assert dict(row["reward_model"]) == {"style": "rule", "ground_truth": "72"}  # "#### 72" in the file
    assert dict(row["extra_info"]) == {
        "split": "train",
        "index": 0,
        "answer": first["answer"],
        "question": first["question"],
    }
    assert list(test["extra_info"].map(lambda e: e["index"])) == [0, 1, 2]
    assert set(test["extra_info"].map(lambda e: e["split"])) == {"test"}


def test_missing_input_file_names_flag_and_path(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(SystemExit) as exc:
        gsm8k.main(["--input_dir", str(tmp_path), "--local_dir", str(tmp_path / "out")])
    msg = str(exc.value.code)
    assert "--input_dir" in msg and str(tmp_path / "test.jsonl") in msg


def test_bad_json_line_names_file_and_line(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2: not valid JSON"):
        gsm8k.read_jsonl(str(tmp_path / "x.jsonl"))


def test_answer_without_final_number_is_an_error():
    with pytest.raises(DataError, match="train example 4.*####"):
        gsm8k.make_row("q", "no answer here", "train", 4)


def test_without_input_dir_and_without_datasets_says_pass_input_dir(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(SystemExit) as exc:
        gsm8k.main(["--local_dir", str(tmp_path)])
    assert "--input_dir" in str(exc.value.code)
