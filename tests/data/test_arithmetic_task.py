"""The generated arithmetic task: data files (determinism, disjoint splits, schema) and scorer."""

import pandas as pd
import pytest

from hybridrl.data.preprocess import arithmetic as prep
from hybridrl.rewards.arithmetic import compute_score, extract_answer


def _write(tmp_path, name, *extra):
    out = tmp_path / name
    prep.main(["--local_dir", str(out), "--train_size", "300", "--test_size", "50", *extra])
    return pd.read_parquet(out / "train.parquet"), pd.read_parquet(out / "test.parquet")


def test_same_seed_same_files_other_seed_differs(tmp_path):
    a_train, a_test = _write(tmp_path, "a", "--seed", "3")
    b_train, b_test = _write(tmp_path, "b", "--seed", "3")
    c_train, _ = _write(tmp_path, "c", "--seed", "4")
    pd.testing.assert_frame_equal(a_train, b_train)
    pd.testing.assert_frame_equal(a_test, b_test)
    assert list(a_train["extra_info"].map(lambda e: e["question"])) != list(
        c_train["extra_info"].map(lambda e: e["question"])
    )


def test_test_split_does_not_depend_on_train_size(tmp_path):
    _, small = _write(tmp_path, "s")
    out = tmp_path / "big"
    prep.main(["--local_dir", str(out), "--train_size", "900", "--test_size", "50"])
    pd.testing.assert_frame_equal(small, pd.read_parquet(out / "test.parquet"))


def test_splits_disjoint_and_sized(tmp_path):
    train, test = _write(tmp_path, "d")
    q_train = {e["question"] for e in train["extra_info"]}
    q_test = {e["question"] for e in test["extra_info"]}
    assert len(train) == 300 and len(test) == 50
    assert len(q_test) == 50  # test has no duplicates; train may repeat (small space)
    assert not q_train & q_test


def test_parquet_schema_and_answers(tmp_path):
    train, test = _write(tmp_path, "e")
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for split, df in (("train", train), ("test", test)):
        for i, row in enumerate(df.itertuples()):
            assert row.data_source == "arithmetic" and row.ability == "math"
            assert [m["role"] for m in row.prompt] == ["user"]
            assert row.extra_info["question"] in row.prompt[0]["content"]
            assert "Answer:" in row.prompt[0]["content"]
            assert row.reward_model["style"] == "rule"
            assert row.extra_info["split"] == split and row.extra_info["index"] == i
            # The ground truth is the value of the expression inside "What is ...?".
            expr = row.extra_info["question"].removeprefix("What is ").removesuffix("?")
            a, op, b = expr.split()
            a, b = int(a), int(b)
            expected = {"+": a + b, "-": a - b, "*": a * b}[op]
            assert row.reward_model["ground_truth"] == str(expected)
            assert 0 <= min(a, b) and max(a, b) <= (12 if op == "*" else 20)  # default ranges


def test_evaluate_precedence():
    assert prep.evaluate([2, 3, 4], ["+", "*"]) == 14
    assert prep.evaluate([10, 4, 3], ["-", "*"]) == -2
    assert prep.evaluate([7, 2, 5], ["-", "-"]) == 0


def test_multiplication_uses_small_factors(tmp_path):
    train, _ = _write(tmp_path, "f", "--operators", "*", "--max_factor", "30", "--max_value", "5")
    factors = [int(x) for e in train["extra_info"] for x in e["question"][8:-1].split(" * ")]
    assert max(factors) > 5 and max(factors) <= 30


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--max_value", "1", "--operators", "+-", "--test_size", "20"], "--test_size"),
        (["--max_value", "1", "--operators", "+-", "--test_size", "8", "--train_size", "5"], "training"),
        (["--min_terms", "1"], "--min_terms"),
        (["--operators", "+/"], "--operators"),
    ],
)
def test_bad_arguments_raise_one_clear_error(tmp_path, argv, key):
    with pytest.raises(prep.ArithmeticConfigError, match=key):
        prep.main(["--local_dir", str(tmp_path), *argv])


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("Answer: 42", "42", 1.0),
        ("12 + 30 = 42", "42", 1.0),
        ("Answer: 41", "42", 0.0),
        ("I think it is 40 or 41 or 42... Answer: 41", "42", 0.0),  # marked answer beats stray 42
        ("40 41 42 43", "42", 0.0),  # only the last number counts
        ("Answer: 42. (I checked 17 and 25.)", "42", 1.0),  # numbers after the mark ignored
        ("**Answer:** 12 + 30 = 42", "42", 1.0),  # after the last "=" on the line
        ("The answer is 7.", "7", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("Answer: -15", "-15", 1.0),
        ("Answer: −15", "-15", 1.0),  # unicode minus
        ("50-65=-15", "-15", 1.0),
        ("20-5", "-5", 0.0),  # subtraction, not a sign
        ("Answer: 1,000", "1000", 1.0),
        ("Answer: 1,000", "1", 0.0),
        ("Answer: 7.0", "7", 1.0),
        ("I don't know.", "7", 0.0),
        ("", "7", 0.0),
    ],
)
def test_compute_score(response, truth, score):
    assert compute_score(response, truth) == score


def test_format_score_only_when_an_answer_was_found():
    assert compute_score("Answer: 5", "6", format_score=0.1) == 0.1
    assert compute_score("no idea", "6", format_score=0.1) == 0.0
    assert compute_score("Answer: 6", "6", format_score=0.1) == 1.0


def test_extract_answer_rule():
    assert extract_answer("Answer: 3\nLater I saw 99") == "3"
    assert extract_answer("\\boxed{4} but the answer is 5") == "5"  # the later mark wins
    assert extract_answer("the answer is 5, \\boxed{4}") == "4"
    assert extract_answer("Answer: unclear, maybe 8 then 9") == "8"
    assert extract_answer("Answer: none\n so 12") == "12"  # no number after mark


def test_bad_ground_truth_raises():
    with pytest.raises(ValueError, match="ground_truth"):
        compute_score("Answer: 1", "seven")
