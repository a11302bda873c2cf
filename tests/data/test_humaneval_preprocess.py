"""HumanEval preprocess: verl rows from the real file; every reference solution passes in the sandbox."""

import gzip
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import TASKS, humaneval
from hybridrl.rewards import default_compute_score

HUMANEVAL = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "humaneval", "HumanEval.jsonl.gz"
)


@pytest.fixture(scope="module")
def problems():
    if not os.path.isfile(HUMANEVAL):
        pytest.skip(f"{HUMANEVAL} not found (real data lives in ../shared/data)")
    with gzip.open(HUMANEVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def rows(problems, tmp_path_factory):
    out = tmp_path_factory.mktemp("humaneval")
    assert humaneval.main(["--input", HUMANEVAL, "--local_dir", str(out)]) is None
    return pd.read_parquet(out / "test.parquet")


def test_writes_verl_rows(rows, problems):
    assert len(rows) == len(problems) == 164
    assert list(rows.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for i, (row, problem) in enumerate(zip(rows.itertuples(), problems)):
        assert (row.data_source, row.ability) == ("humaneval", "code")
        [message] = list(row.prompt)
        assert message["role"] == "user" and problem["prompt"] in message["content"]
        assert "```python" in message["content"]
        assert row.reward_model["style"] == "rule"
        assert json.loads(row.reward_model["ground_truth"]) == {
            "test_code": problem["test"],
            "entry_point": problem["entry_point"],
            "prefix": problem["prompt"],
        }
        extra = row.extra_info
        assert (extra["index"], extra["task_id"], extra["split"]) == (i, problem["task_id"], "test")


def _score_all(rows, make_response):
    def score(row):
        return default_compute_score(
            row["data_source"], make_response(row), row["reward_model"]["ground_truth"], row["extra_info"]
        )

    with ThreadPoolExecutor(max_workers=4) as pool:  # the work is in sandbox subprocesses
        return list(pool.map(score, rows.to_dict("records")))


@pytest.mark.slow
def test_every_canonical_solution_scores_one(rows, problems):
    """prompt + canonical_solution as the response: 164 of 164 pass."""
    by_id = {p["task_id"]: p for p in problems}
    results = _score_all(
        rows, lambda r: by_id[r["extra_info"]["task_id"]]["prompt"] + r["extra_info"]["canonical_solution"]
    )
    failed = [
        (r["extra_info"]["task_id"], res["reason"])
        for r, res in zip(rows.to_dict("records"), results)
        if res["score"] != 1.0
    ]
    assert not failed
    assert all(res["passed"] == res["total"] == 1 for res in results)


@pytest.mark.slow
def test_wrong_and_empty_programs_score_zero(rows):
    stub = _score_all(
        rows,
        lambda r: (
            f"```python\ndef {json.loads(r['reward_model']['ground_truth'])['entry_point']}"
            "(*args):\n    return None\n```"
        ),
    )
    assert all(res["score"] == 0.0 and res["reason"] for res in stub)
    empty = _score_all(rows, lambda r: "")
    assert all(res["score"] == 0.0 and "empty" in res["reason"] for res in empty)


def test_registered_as_preprocess_task():
    assert TASKS["humaneval"] == "hybridrl.data.preprocess.humaneval"


def test_missing_input_file_names_flag_and_path(tmp_path):
    with pytest.raises(SystemExit) as exc:
        humaneval.main(["--input", str(tmp_path / "nope.jsonl.gz"), "--local_dir", str(tmp_path)])
    assert "--input" in str(exc.value.code) and "nope.jsonl.gz" in str(exc.value.code)


def test_bad_lines_name_file_and_line(tmp_path):
    good = json.dumps(dict.fromkeys(humaneval.FIELDS, "x"))
    (tmp_path / "a.jsonl").write_text(good + "\nnot json\n")
    with pytest.raises(DataError, match=r"a\.jsonl:2: not valid JSON"):
        humaneval.read_problems(str(tmp_path / "a.jsonl"))
    (tmp_path / "b.jsonl").write_text(good + "\n" + json.dumps({"task_id": "t"}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:2: expected an object with string keys task_id"):
        humaneval.read_problems(str(tmp_path / "b.jsonl"))
    (tmp_path / "c.jsonl.gz").write_text(good)  # named .gz, not gzip
    with pytest.raises(DataError, match=r"--input: cannot read .*c\.jsonl\.gz"):
        humaneval.read_problems(str(tmp_path / "c.jsonl.gz"))


@pytest.mark.slow
def test_eval_job_reports_pass_at_k_of_code_rows(rows, problems, tmp_path):
    """`hybridrl eval` on generate-style rows: a right and a wrong response per prompt."""
    from hybridrl.config import load_config
    from hybridrl.trainer.main_eval import run_eval

    head = rows.head(6).copy()
    right = [problems[i]["prompt"] + problems[i]["canonical_solution"] for i in range(6)]
    head["responses"] = [[ok, "```python\nprint('no')\n```"] if i % 3 else [ok, ok] for i, ok in enumerate(right)]
    head.to_parquet(tmp_path / "gen.parquet", index=False)
    report = run_eval(
        load_config([f"data.path={tmp_path / 'gen.parquet'}", "metrics.bootstrap_samples=50"], config_name="evaluation")
    )
    metrics = report["data_sources"]["humaneval"]["metrics"]
    correct = [2 if i % 3 == 0 else 1 for i in range(6)]  # per prompt, of 2
    assert metrics["pass@1"]["value"] == pytest.approx(sum(correct) / 12)
    assert metrics["pass@2"]["value"] == 1.0
