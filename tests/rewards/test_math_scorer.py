"""MATH scorer: \\boxed{} extraction and math-verify equivalence, on real MATH-500 answers."""

import json
import os
import threading

import pytest

from hybridrl.rewards import default_compute_score, known_data_sources
from hybridrl.rewards.math import compute_score, extract_boxed_answer, is_equiv, last_boxed_only_string

MATH500 = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "math500", "test.jsonl")


@pytest.fixture(scope="module")
def rows():
    if not os.path.exists(MATH500):
        pytest.skip(f"{MATH500} not found (real data lives in ../shared/data)")
    with open(MATH500) as f:
        return [json.loads(line) for line in f]


def test_last_boxed_matches_nested_braces_and_takes_the_last():
    text = r"first \boxed{1} then $\boxed{\frac{1}{\sqrt{2}}}$."
    assert last_boxed_only_string(text) == r"\boxed{\frac{1}{\sqrt{2}}}"
    assert extract_boxed_answer(text) == r"\frac{1}{\sqrt{2}}"
    assert extract_boxed_answer(r"so \fbox{7}") == "7"
    assert extract_boxed_answer(r"so $\boxed 7$ done") == "7"
    assert extract_boxed_answer(r"never closed \boxed{1 + {2}") is None
    assert extract_boxed_answer("no box, the answer is 7") is None
    assert extract_boxed_answer(r"\boxed{ }") is None


@pytest.mark.parametrize(
    "pred,gold,equal",
    [
        (r"\frac{1}{2}", "0.5", True),
        (r"\dfrac12", r"\frac{1}{2}", True),
        (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", True),
        ("6-5i", "6 - 5i", True),
        (r"2\sqrt{2}", r"\sqrt{8}", True),
        ("(1, 2)", "(2, 1)", False),
        ("3", "4", False),
        (r"\frac{14}{3}", "4.6", False),
    ],
)
def test_is_equiv(pred, gold, equal):
    assert is_equiv(pred, gold) is equal


def test_compute_score_result_and_missing_box():
    assert compute_score(r"... so it is $\boxed{\frac{1}{2}}$", "0.5") == {
        "score": 1.0,
        "acc": True,
        "pred": r"\frac{1}{2}",
    }
    assert compute_score(r"$\boxed{3}$", "4") == {"score": 0.0, "acc": False, "pred": "3"}
    assert compute_score("the answer is 4", "4") == {"score": 0.0, "acc": False, "pred": None}
    assert compute_score(r"\boxed{42}", 42, incorrect_score=-1.0)["score"] == 1.0  # numeric ground truth
    assert compute_score(r"\boxed{41}", 42, incorrect_score=-1.0)["score"] == -1.0


def test_works_off_the_main_thread():
    # math-verify's time-outs use signal.alarm, which fails off the main thread
    results = []
    worker = threading.Thread(target=lambda: results.append(compute_score(r"\boxed{\sqrt{8}}", r"2\sqrt{2}")))
    worker.start()
    worker.join()
    assert results[0]["score"] == 1.0


def test_registered_for_verl_math_data_sources():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert source in known_data_sources()
        result = default_compute_score(source, r"thus $\boxed{\frac{2}{4}}$", r"\frac12")
        assert result["score"] == 1.0


def test_reference_solutions_agree_with_answers_on_all_math500_rows(rows):
    agree = [compute_score(row["solution"], row["answer"])["score"] == 1.0 for row in rows]
    rate = sum(agree) / len(rows)
    print(f"MATH-500: the boxed answer of the reference solution scores 1 on {sum(agree)}/{len(rows)} rows")
    assert len(rows) == 500 and rate >= 0.99, [r["unique_id"] for r, ok in zip(rows, agree) if not ok]


def test_another_problems_answer_scores_zero(rows):
    # pair each solution with the next row's answer; identical answers (up to spaces) are skipped
    different = [
        (a, b)
        for a, b in zip(rows, rows[1:] + rows[:1])
        if "".join(a["answer"].split()) != "".join(b["answer"].split())
    ]
    wrong = [
        (a["unique_id"], b["answer"]) for a, b in different if compute_score(a["solution"], b["answer"])["score"] != 0.0
    ]
    print(f"MATH-500: {len(wrong)}/{len(different)} other answers accepted: {wrong}")
    assert len(different) > 490 and len(wrong) <= 0.01 * len(different), wrong
