"""The generated code-writing task: data files (determinism, disjoint splits, schema) and its tests
checked against solutions written here, run in the sandbox."""

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import TASKS
from hybridrl.data.preprocess import code_tasks as prep
from hybridrl.rewards import default_compute_score

# Independent solutions: template name -> (parameters, body with {c}).
SOLUTIONS = {
    "add": ("x", "x + {c}"),
    "subtract": ("x", "x - {c}"),
    "multiply": ("x", "x * {c}"),
    "divide": ("x", "x // {c}"),
    "remainder": ("x", "x % {c}"),
    "power": ("x", "x ** {c}"),
    "greater_than": ("x", "x > {c}"),
    "square": ("x", "x * x"),
    "is_even": ("x", "x % 2 == 0"),
    "absolute": ("x", "abs(x)"),
    "add_pair": ("a, b", "a + b"),
    "larger": ("a, b", "max(a, b)"),
    "smaller": ("a, b", "min(a, b)"),
    "total": ("xs", "sum(xs)"),
    "count": ("xs", "len(xs)"),
    "largest": ("xs", "max(xs)"),
    "count_value": ("xs", "xs.count({c})"),
    "contains": ("xs", "{c} in xs"),
    "reverse": ("s", "s[::-1]"),
    "shout": ("s", "s.upper()"),
    "first_char": ("s", "s[0]"),
    "repeat": ("s", "s * {c}"),
}


def solution(row):
    name, c = row["extra_info"]["template"], row["extra_info"]["constant"]
    params, body = SOLUTIONS[name]
    return f"```python\ndef {name}({params}):\n    return {body.format(c=c)}\n```"


def records(path):
    """Rows as written (pandas would turn the nullable int ``constant`` into a float)."""
    return pq.read_table(path).to_pylist()


def _write(tmp_path, name, *extra):
    out = tmp_path / name
    prep.main(["--local_dir", str(out), "--train_size", "200", "--test_size", "40", *extra])
    return pd.read_parquet(out / "train.parquet"), pd.read_parquet(out / "test.parquet")


def test_every_template_has_a_solution_here():
    assert set(SOLUTIONS) == {t.name for t in prep.TEMPLATES}


def test_same_seed_same_files_other_seed_differs(tmp_path):
    a_train, a_test = _write(tmp_path, "a", "--seed", "3")
    b_train, b_test = _write(tmp_path, "b", "--seed", "3")
    c_train, _ = _write(tmp_path, "c", "--seed", "4")
    pd.testing.assert_frame_equal(a_train, b_train)
    pd.testing.assert_frame_equal(a_test, b_test)
    assert list(a_train["reward_model"]) != list(c_train["reward_model"])


def test_test_split_does_not_depend_on_train_size(tmp_path):
    _, small = _write(tmp_path, "s")
    out = tmp_path / "big"
    prep.main(["--local_dir", str(out), "--train_size", "500", "--test_size", "40"])
    pd.testing.assert_frame_equal(small, pd.read_parquet(out / "test.parquet"))


def test_splits_disjoint_and_every_template_trained(tmp_path):
    train, test = _write(tmp_path, "d")
    test_keys = [(e["template"], e["constant"]) for e in test["extra_info"]]
    assert len(train) == 200 and len(test) == 40 and len(set(test_keys)) == 40
    assert not {(e["template"], e["constant"]) for e in train["extra_info"]} & set(test_keys)
    # at the largest test split, training still sees every template
    train, _ = prep.generate_rows(300, prep.MAX_TEST_SIZE, 3, seed=0)
    assert {r["extra_info"]["template"] for r in train} == set(SOLUTIONS)


@pytest.mark.slow
def test_rows_schema_and_tests_are_right(tmp_path):
    """A correct function scores 1 on every row; a constant function never passes every case."""
    _write(tmp_path, "e", "--num_tests", "4")
    rows = records(tmp_path / "e" / "train.parquet")[:60] + records(tmp_path / "e" / "test.parquet")
    for row in rows:
        assert (row["data_source"], row["ability"]) == ("code_tasks", "code")
        gt = json.loads(row["reward_model"]["ground_truth"])
        assert gt["fn_name"] == row["extra_info"]["template"] and len(gt["inputs"]) == len(gt["outputs"]) == 4
        assert f"`{gt['fn_name']}(" in row["prompt"][0]["content"] and "```python" in row["prompt"][0]["content"]
        assert len({json.dumps(o) for o in gt["outputs"]}) > 1
        result = default_compute_score(row["data_source"], solution(row), row["reward_model"]["ground_truth"])
        assert result["score"] == 1.0, (row["extra_info"], result["reason"])


@pytest.mark.slow
def test_partial_credit_for_a_half_right_function(tmp_path):
    _, test = _write(tmp_path, "f")
    row = next(r for r in test.to_dict("records") if r["extra_info"]["template"] in ("add", "subtract", "multiply"))
    gt = json.loads(row["reward_model"]["ground_truth"])
    first = gt["inputs"][0][0]
    program = f"def {gt['fn_name']}(x):\n    return {gt['outputs'][0]} if x == {first} else None"
    result = default_compute_score("code_tasks", program, row["reward_model"]["ground_truth"])
    assert result["score"] == pytest.approx(gt["inputs"].count([first]) / len(gt["inputs"]))


def test_registered_as_preprocess_task():
    assert TASKS["code_tasks"] == "hybridrl.data.preprocess.code_tasks"


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--test_size", str(prep.MAX_TEST_SIZE + 1)], "--test_size"),
        (["--num_tests", "0"], "--num_tests"),
        (["--train_size", "-1"], "--train_size"),
    ],
)
def test_bad_arguments_raise_one_clear_error(tmp_path, argv, key):
    with pytest.raises(DataError, match=key):
        prep.main(["--local_dir", str(tmp_path), *argv])
