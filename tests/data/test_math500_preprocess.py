"""MATH-500 preprocess: verl's row format from the real jsonl file, its errors, and scoring."""

import json
import os

import pandas as pd
import pytest

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import TASKS, math500
from hybridrl.rewards import default_compute_score

MATH500_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "math500")


@pytest.fixture(scope="module")
def math500_dir():
    if not os.path.isfile(os.path.join(MATH500_DIR, "test.jsonl")):
        pytest.skip(f"{MATH500_DIR}/test.jsonl not found (real data lives in ../shared/data)")
    return MATH500_DIR


def test_writes_verl_rows_from_real_jsonl(math500_dir, tmp_path):
    assert math500.main(["--input_dir", math500_dir, "--local_dir", str(tmp_path), "--size", "12"]) is None
    df = pd.read_parquet(tmp_path / "test.parquet")
    with open(os.path.join(math500_dir, "test.jsonl")) as f:
        source = [json.loads(next(f)) for _ in range(12)]
    assert len(df) == 12 and not os.path.exists(tmp_path / "test.parquet.tmp")
    row, first = df.iloc[0], source[0]
    assert row["data_source"] == "HuggingFaceH4/MATH-500" and row["ability"] == "math"
    assert list(row["prompt"]) == [
        {
            "role": "user",
            "content": first["problem"] + " Let's think step by step and output the final answer within \\boxed{}.",
        }
    ]
    assert dict(row["reward_model"]) == {"style": "rule", "ground_truth": first["answer"]}
    extra = dict(row["extra_info"])
    assert (extra["split"], extra["index"], extra["unique_id"], extra["level"]) == (
        "test",
        0,
        first["unique_id"],
        first["level"],
    )
    assert list(df["extra_info"].map(lambda e: e["index"])) == list(range(12))
    # the data source routes to the MATH scorer: each reference solution earns full marks
    for _, r in df.iterrows():
        result = default_compute_score(r["data_source"], r["extra_info"]["solution"], r["reward_model"]["ground_truth"])
        assert result["score"] == 1.0, r["extra_info"]["unique_id"]


def test_registered_as_preprocess_task():
    assert TASKS["math500"] == "hybridrl.data.preprocess.math500"


def test_missing_input_file_names_flag_and_path(tmp_path):
    with pytest.raises(SystemExit) as exc:
        math500.main(["--input_dir", str(tmp_path), "--local_dir", str(tmp_path / "out")])
    msg = str(exc.value.code)
    assert "--input_dir" in msg and str(tmp_path / "test.jsonl") in msg


def test_bad_lines_name_file_and_line(tmp_path):
    good = json.dumps({"problem": "p", "solution": r"\boxed{1}", "answer": "1"})
    (tmp_path / "a.jsonl").write_text(good + "\nnot json\n")
    with pytest.raises(DataError, match=r"a\.jsonl:2: not valid JSON"):
        math500.read_jsonl(str(tmp_path / "a.jsonl"))
    (tmp_path / "b.jsonl").write_text(good + "\n" + json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:2: expected an object with keys problem, solution, answer"):
        math500.read_jsonl(str(tmp_path / "b.jsonl"))
