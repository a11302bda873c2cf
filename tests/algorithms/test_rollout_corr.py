"""Off-policy diagnostics (rollout_corr/ metrics) against their definitions on small hand-made
batches: identical policies give zero divergence; a known per-token shift gives the closed forms."""

import math

import pytest
import torch

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.rollout_corr import compute_offpolicy_metrics


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 5, generator=gen) * 4
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    return old, mask


def test_the_same_policy_has_no_divergence():
    old, mask = _batch()
    m = compute_offpolicy_metrics(old, old.clone(), mask)
    for key in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token", "chi2_seq"):
        assert m[f"rollout_corr/{key}"] == pytest.approx(0.0, abs=1e-12), key
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(1.0)
    assert m["rollout_corr/training_ppl"] == pytest.approx(m["rollout_corr/rollout_ppl"])


def test_a_constant_shift_gives_the_closed_forms():
    """rollout = old - d on every token: log rho = d, so kl = -d, k3 = e^d - d - 1,
    chi2_token = e^{2d} - 1, each row's log-ppl differs by +d, chi2_seq = mean(e^{2 d L}) - 1."""
    old, mask = _batch(1)
    d = 0.1
    m = compute_offpolicy_metrics(old, old - d, mask)
    assert m["rollout_corr/kl"] == pytest.approx(-d)
    assert m["rollout_corr/k3_kl"] == pytest.approx(math.exp(d) - d - 1)
    assert m["rollout_corr/chi2_token"] == pytest.approx(math.exp(2 * d) - 1)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(d) and m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(d)
    assert m["rollout_corr/log_ppl_diff_max"] == pytest.approx(d) == m["rollout_corr/log_ppl_diff_min"]
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(math.exp(-d))
    lengths = mask.sum(-1).double()
    assert m["rollout_corr/chi2_seq"] == pytest.approx(float(torch.exp(2 * d * lengths).mean() - 1))
    training_ppl = torch.exp(-(old * mask).sum(-1) / lengths).mean()
    assert m["rollout_corr/training_ppl"] == pytest.approx(float(training_ppl))


def test_padding_and_empty_rows_are_left_out():
    old, mask = _batch(2)
    rollout = old - 0.2
    rollout_padded = torch.where(mask.bool(), rollout, torch.full_like(rollout, -50.0))  # garbage under padding
    with_empty = compute_offpolicy_metrics(
        torch.cat([old, old[:1]]),
        torch.cat([rollout_padded, rollout[:1] - 9]),
        torch.cat([mask, torch.zeros_like(mask[:1])]),
    )
    assert with_empty == pytest.approx(compute_offpolicy_metrics(old, rollout, mask))
    assert compute_offpolicy_metrics(old, rollout, torch.zeros_like(mask)) == {}


def test_shapes_must_agree():
    old, mask = _batch()
    with pytest.raises(AlgorithmInputError, match=r"compute_offpolicy_metrics: shapes differ"):
        compute_offpolicy_metrics(old, old[:, :4], mask)
