"""qa_em: Search-R1's exact-match reward for open-domain QA."""

import numpy as np
import pytest

from hybridrl.rewards import default_compute_score, get_scorer
from hybridrl.rewards.qa_em import (
    QAGroundTruthError,
    compute_score_em,
    compute_score_subem,
    em_check,
    extract_solution,
    normalize_answer,
    subem_check,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Beatles!", "beatles"),
        ("An apple a day", "apple day"),
        ("U.S.A.", "usa"),
        ("theatre", "theatre"),  # articles are removed as whole words only
        ("  Paris,\tFrance \n", "paris france"),
        ("the-the", "thethe"),  # punctuation goes first, then "thethe" is no article
        ("Rock 'n' Roll", "rock n roll"),
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_em_and_subem_differ_on_longer_answers():
    gold = ["The Beatles", "Beatles"]
    assert em_check("the beatles.", gold)
    assert not em_check("The Beatles, in 1963", gold)
    assert subem_check("The Beatles, in 1963", gold)
    assert not subem_check("Beatle", gold)
    # compute_* see the same difference through the <answer> tag
    response = "<think>...</think><answer>The Beatles, in 1963</answer>"
    assert compute_score_em(response, {"target": gold}) == 0.0
    assert compute_score_subem(response, {"target": gold}) == 1.0


def test_last_answer_tag_wins():
    response = "<answer> Paris </answer> no wait <search>x</search> <answer>\nLyon\n</answer>"
    assert extract_solution(response) == "Lyon"
    assert compute_score_em(response, {"target": ["Lyon"]}) == 1.0
    assert compute_score_em(response, {"target": ["Paris"]}, format_score=0.2) == 0.2


def test_no_answer_tag_scores_zero_even_with_format_score():
    for response in ["Paris", "<answer>Paris", "<answer></ answer>", ""]:
        assert extract_solution(response) is None
        assert compute_score_em(response, {"target": ["Paris"]}, format_score=0.3) == 0.0
        assert compute_score_subem(response, ["Paris"], format_score=0.3) == 0.0


def test_format_score_and_score_values():
    right, wrong = "<answer>Paris</answer>", "<answer>Rome</answer>"
    assert compute_score_em(right, "Paris", format_score=0.1, score=2.0) == 2.0
    assert compute_score_em(wrong, "Paris", format_score=0.1, score=2.0) == 0.1
    assert compute_score_em(wrong, "Paris") == 0.0
    assert compute_score_em("<answer></answer>", "Paris", format_score=0.1) == 0.1  # tagged, empty


def test_ground_truth_shapes():
    response = "<answer>December 1972</answer>"
    for gt in (
        {"target": ["14 December 1972 UTC", "December 1972"]},
        ["December 1972"],
        "December 1972",
        {"target": np.array(["x", "December 1972"], dtype=object)},
        ("december 1972",),
    ):
        assert compute_score_em(response, gt) == 1.0, gt
    for bad in (None, {"answers": ["x"]}, 3):
        with pytest.raises(QAGroundTruthError, match="qa_em ground_truth"):
            compute_score_em(response, bad)


@pytest.mark.parametrize("source", ["nq", "hotpotqa", "bamboogle", "searchR1_nq", "searchR1_2wikimultihopqa"])
def test_registered_for_search_r1_data_sources(source):
    assert get_scorer(source) is compute_score_em
    gt = {"target": ["James I"]}
    assert default_compute_score(source, "<answer>james i.</answer>", gt, extra_info={"index": 0}) == 1.0
    assert default_compute_score(source, "<answer>James II</answer>", gt) == 0.0
