"""Evaluation metrics: pass@k against brute force, majority vote, bootstrap intervals."""

import itertools
import math

import numpy as np
import pytest

from hybridrl.trainer.run.eval_metrics import (
    bootstrap_ci,
    compute_eval_metrics,
    default_k_list,
    majority_vote,
    pass_at_k,
)


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n responses (the first c correct) holding a correct one."""
    outcomes = [i < c for i in range(n)]
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_enumeration_of_all_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    # 1 - C(n-c, k)/C(n, k) with exact integers; the product form must agree without overflow
    n, c, k = 200, 3, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 1, 0), (4, 5, 2), (4, -1, 2)])
def test_pass_at_k_rejects_out_of_range(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_vote_hand_cases():
    assert majority_vote(["a", "b", "a", None], [1.0, 0.0, 1.0, 0.0]) == 1.0
    assert majority_vote(["b", "a", "a"], [0.0, 1.0, 1.0]) == 1.0
    assert majority_vote(["b", "a", "a", "b"], [0.0, 1.0, 1.0, 0.0]) == 0.0  # tie: first seen wins
    # None does not vote: two None beat nothing
    assert majority_vote([None, None, "x"], [0.0, 0.0, 0.7]) == 0.7
    assert majority_vote([None, None], [0.3, 0.0]) == 0.3
    with pytest.raises(ValueError):
        majority_vote(["a"], [1.0, 0.0])


def test_default_k_list():
    assert default_k_list(1) == [1]
    assert default_k_list(4) == [1, 2, 4]
    assert default_k_list(5) == [1, 2, 4, 5]
    assert default_k_list(16) == [1, 2, 4, 8, 16]


def test_bootstrap_ci_width_matches_normal_theory():
    # 400 Bernoulli(1/2) prompts: the 95% interval of the mean is about +-1.96*sqrt(.25/400) = +-0.049
    values = np.array([0.0, 1.0] * 200)
    low, high = bootstrap_ci(values, n_resamples=2000, confidence=0.95, seed=1)
    assert low < 0.5 < high
    assert high - low == pytest.approx(2 * 1.96 * 0.025, rel=0.15)
    low90, high90 = bootstrap_ci(values, n_resamples=2000, confidence=0.90, seed=1)
    assert low < low90 and high90 < high


def test_bootstrap_ci_of_constant_is_the_constant_and_rows_are_independent():
    values = np.stack([np.full(50, 0.3), np.linspace(0, 1, 50)])
    ci = bootstrap_ci(values, n_resamples=200)
    assert ci.shape == (2, 2)
    assert ci[0] == pytest.approx([0.3, 0.3])
    assert ci[1, 0] < 0.5 < ci[1, 1]
    np.testing.assert_array_equal(ci, bootstrap_ci(values, n_resamples=200))  # seeded


def test_compute_eval_metrics_hand_computed():
    scores = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0]])
    correct = scores >= 1.0
    preds = [["5", "3", "3", "5"], ["1", "1", "2", None]]
    out = compute_eval_metrics(scores, correct, preds, n_resamples=100)
    assert list(out) == ["mean@4", "pass@1", "pass@2", "pass@4", "maj@4", "best@4"]
    assert out["mean@4"]["value"] == pytest.approx((0.5 + 0.125) / 2)
    assert out["pass@1"]["value"] == pytest.approx(0.25)  # c/n = 2/4 and 0/4
    assert out["pass@2"]["value"] == pytest.approx((1 - 1 / 6) / 2)  # 1 - C(2,2)/C(4,2)
    assert out["pass@4"]["value"] == pytest.approx(0.5)
    assert out["maj@4"]["value"] == pytest.approx(0.5)  # tie "5"/"3": "5" seen first (1.0); "1" (0.0)
    assert out["best@4"]["value"] == pytest.approx(0.75)
    for m in out.values():
        assert m["ci_low"] <= m["value"] <= m["ci_high"]


def test_compute_eval_metrics_without_preds_and_with_k_list():
    scores = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    out = compute_eval_metrics(scores, scores > 0, None, k_list=[2, 1, 8], n_resamples=50)
    assert list(out) == ["mean@2", "pass@1", "pass@2", "best@2"]  # k=8 > N left out, no maj
    assert out["pass@2"]["value"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        compute_eval_metrics(scores, scores[:, :1] > 0)
