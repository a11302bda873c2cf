"""GSM8K scorer on real reference solutions from ../shared/data/gsm8k/test.jsonl."""

import json
import os

import pytest

from hybridrl.rewards.gsm8k import GSM8KMethodError, compute_score, extract_solution

GSM8K_TEST = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "gsm8k", "test.jsonl")


@pytest.fixture(scope="module")
def rows():
    if not os.path.exists(GSM8K_TEST):
        pytest.skip(f"{GSM8K_TEST} not found (real data lives in ../shared/data)")
    with open(GSM8K_TEST) as f:
        return [json.loads(line) for line in f]


def _final_number(answer: str) -> str:
    # the data set's own convention: the final answer follows "#### "
    return answer.split("#### ")[-1].strip()


def test_reference_solutions_score_full_marks(rows):
    for row in rows:
        gt = _final_number(row["answer"]).replace(",", "")  # what preprocessing writes
        assert compute_score(row["answer"], gt) == 1.0, row["answer"]
        # the raw value with commas ("1,450,000") is accepted as ground truth too
        assert compute_score(row["answer"], _final_number(row["answer"])) == 1.0


def test_corrupted_number_gets_format_score(rows):
    for row in rows[:200]:
        gt = _final_number(row["answer"]).replace(",", "")
        wrong = str(int(gt) + 1)
        corrupted = row["answer"].rsplit("#### ", 1)[0] + "#### " + wrong
        assert compute_score(corrupted, gt, format_score=0.1) == 0.1
        assert compute_score(corrupted, gt, format_score=0.1, score=2.0) == 0.1
        assert compute_score(row["answer"], gt, format_score=0.1, score=2.0) == 2.0


def test_flexible_vs_strict_without_marker(rows):
    # first test row: "... She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"
    without_marker = rows[0]["answer"].rsplit("\n#### ", 1)[0]
    assert "####" not in without_marker
    assert extract_solution(without_marker, "strict") is None
    assert compute_score(without_marker, "18", method="strict", format_score=0.5) == 0.0
    assert extract_solution(without_marker, "flexible") == "18"
    assert compute_score(without_marker, "18", method="flexible") == 1.0


def test_extract_strict_takes_last_marker_and_cleans():
    assert extract_solution("#### 3\nwait, no\n#### 1,234", "strict") == "1234"
    assert extract_solution("#### -7", "strict") == "-7"
    assert extract_solution("so #### 18.", "strict") == "18"  # sentence-ending dot
    assert extract_solution("#### $18", "strict") is None  # verl's regex needs a digit after "#### "
    assert extract_solution("no answer here", "strict") is None


def test_extract_flexible_skips_lone_dots():
    assert extract_solution("It costs 1,450,000 dollars. ...", "flexible") == "1450000"
    assert extract_solution("2 apples and 3.5 pears . .", "flexible") == "3.5"
    assert extract_solution("no digits .", "flexible") is None


def test_numeric_equality_and_no_answer():
    assert compute_score("#### 18.0", "18") == 1.0
    assert compute_score("#### 18", 18) == 1.0  # ground truth given as a number
    assert compute_score("I don't know", "18", format_score=0.1) == 0.0


def test_unknown_method_is_a_clear_error():
    with pytest.raises(GSM8KMethodError, match="strict.*flexible"):
        compute_score("#### 1", "1", method="lenient")
