"""gspo, gpg, clip_cov, kl_cov, geo_mean, cispo: hand-computed values and gradients, and the
properties that tell each loss apart from PPO's."""

import logging
import math

import pytest
import torch

import hybridrl.algorithms.policy_loss as policy_loss
from hybridrl.algorithms import (
    PolicyLossParams,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
)

e = math.exp


def _leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def _t(values):
    return torch.tensor(values, dtype=torch.float32)


def _grad(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def test_gspo_hand_values_sequence_ratio_and_gradient():
    # Row 0: log-ratios 0.1, 0.3 -> s = e^0.2 = 1.221, A = +1. Row 1: one valid token,
    # log-ratio -0.2 -> s = e^-0.2, A = -1; its padded token holds a wild log-prob.
    old = _t([[0.0, 0.0], [0.0, 0.0]])
    logp = _leaf([[0.1, 0.3], [-0.2, 50.0]])
    adv = _t([[1.0, 1.0], [-1.0, -1.0]])
    mask = _t([[1, 1], [1, 0]])
    cfg = PolicyLossParams(clip_ratio_low=0.3, clip_ratio_high=0.3)  # [0.7, 1.3]: nothing clipped
    loss, m = compute_policy_loss_gspo(old, logp, adv, mask, "seq-mean-token-mean", cfg)
    assert loss.item() == pytest.approx((-e(0.2) + e(-0.2)) / 2, rel=1e-6)
    # token t of row i: -A_i * s_i / |y_i| / n_rows; the gradient ignores the other tokens' ratios
    expected = _t([[-e(0.2) / 4, -e(0.2) / 4], [e(-0.2) / 2, 0.0]])
    assert torch.allclose(_grad(loss, logp), expected, atol=1e-6)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx(-(0.1 + 0.3 - 0.2) / 3, rel=1e-5)

    # clip 0.2: row 0's 1.221 > 1.2 is clipped (constant -1.2, no gradient) on both its tokens
    loss, m = compute_policy_loss_gspo(old, logp, adv, mask, "seq-mean-token-mean", PolicyLossParams())
    assert loss.item() == pytest.approx((-1.2 + e(-0.2)) / 2, rel=1e-6)
    assert torch.allclose(_grad(loss, logp)[0], torch.zeros(2))
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)


def test_gspo_with_equal_token_ratios_equals_vanilla_seq_mean_token_mean(caplog, monkeypatch):
    monkeypatch.setattr(policy_loss.base, "_LOGGED_FIXED_AGG", set())  # the note is logged once per process
    torch.manual_seed(0)
    seq_log_ratio = (torch.rand(5, 1) - 0.5) * 0.6  # ratios in [e^-0.3, e^0.3]: no dual clip
    old = torch.randn(5, 7) - 2.0
    mask = (torch.rand(5, 7) > 0.3).float()
    mask[:, 0] = 1
    adv = torch.randn(5, 1).expand(5, 7).contiguous()
    cfg = PolicyLossParams(clip_ratio_low=0.1, clip_ratio_high=0.15)
    results = []
    for fn, mode in ((compute_policy_loss_vanilla, "seq-mean-token-mean"), (compute_policy_loss_gspo, "token-mean")):
        logp = (old + seq_log_ratio).requires_grad_(True)
        with caplog.at_level(logging.WARNING, logger="hybridrl.algorithms.policy_loss"):
            loss, m = fn(old, logp, adv, mask, mode, cfg)
        results.append((loss.item(), _grad(loss, logp), m["actor/pg_clipfrac"]))
    (v_loss, v_grad, v_frac), (g_loss, g_grad, g_frac) = results
    assert 0 < v_frac < 1  # some sequences clipped, some not: both branches compared
    assert g_loss == pytest.approx(v_loss, rel=1e-5)
    assert torch.allclose(g_grad, v_grad, atol=1e-6)
    assert g_frac == pytest.approx(v_frac)
    # gspo ignored token-mean (always seq-mean-token-mean) and said so
    assert "'gspo' aggregates as seq-mean-token-mean" in caplog.text


def test_gspo_and_geo_mean_agree_when_nothing_is_clipped():
    # Both are -A_i * exp(mean_t log-ratio) per sequence with gradient -A_i * s_i / |y_i| per
    # token; they differ only in how they clip (sequence ratio vs token log-ratios).
    torch.manual_seed(1)
    old = torch.randn(4, 6) - 2.0
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1
    adv = torch.randn(4, 1).expand(4, 6).contiguous()
    shift = 0.3 * torch.randn(4, 6)
    cfg = PolicyLossParams(clip_ratio_low=5.0, clip_ratio_high=5.0)
    out = []
    for fn in (compute_policy_loss_gspo, compute_policy_loss_geo_mean):
        logp = (old + shift).requires_grad_(True)
        loss, _ = fn(old, logp, adv, mask, "seq-mean-token-mean", cfg)
        out.append((loss.item(), _grad(loss, logp)))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-5)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-6)


def test_gpg_hand_values_gradient_is_minus_advantage_over_tokens():
    old = _t([[5.0, 5.0, 5.0]])  # no ratio in GPG: old_log_prob only feeds ppo_kl
    logp = _leaf([[-1.0, -2.0, -0.5]])
    adv = _t([[2.0, 1.0, 7.0]])
    mask = _t([[1, 1, 0]])
    loss, m = compute_policy_loss_gpg(old, logp, adv, mask)
    assert loss.item() == pytest.approx((2.0 * 1.0 + 1.0 * 2.0) / 2)
    assert torch.allclose(_grad(loss, logp), _t([[-2.0 / 2, -1.0 / 2, 0.0]]))
    assert m["actor/pg_clipfrac"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx((6.0 + 7.0) / 2)


# One row of 4 valid tokens: A = [2, 1, -1, -1] (mean 0.25), log_prob = [0, -4, 0, -4] (mean -2),
# so cov = (A - 0.25) * (log_prob + 2) = [3.5, -1.5, -2.5, 2.5]; band (1, 5) holds tokens 0 and 3.
COV_ADV = [[2.0, 1.0, -1.0, -1.0, 9.0]]
COV_LOGP = [[0.0, -4.0, 0.0, -4.0, 3.0]]
COV_MASK = [[1, 1, 1, 1, 0]]


def _clip_cov(old_shift, clip_cov_ratio):
    logp = _leaf(COV_LOGP)
    old = logp.detach() - _t([old_shift])
    cfg = PolicyLossParams(clip_cov_ratio=clip_cov_ratio, clip_cov_lb=1.0, clip_cov_ub=5.0)
    loss, m = compute_policy_loss_clip_cov(old, logp, _t(COV_ADV), _t(COV_MASK), config=cfg)
    return loss, m, _grad(loss, logp)


def test_clip_cov_removes_exactly_the_selected_tokens():
    # ratio 1 everywhere; 50% of 4 tokens = 2 may go: both candidates (0 and 3) are removed
    loss, m, grad = _clip_cov([0.0] * 5, 0.5)
    assert loss.item() == pytest.approx((0.0 - 1.0 + 1.0 + 0.0) / 4)
    assert torch.allclose(grad, _t([[0.0, -0.25, 0.25, 0.0, 0.0]]))
    assert m["actor/clip_cov_frac"] == pytest.approx(0.5) and m["actor/pg_clipfrac"] == 0.0

    # token 0 now has ratio 2 with A > 0: PPO clips it (value -2 * 1.2), so it is no candidate
    loss, m, grad = _clip_cov([math.log(2.0), 0.0, 0.0, 0.0, 0.0], 0.5)
    assert loss.item() == pytest.approx((-2.4 - 1.0 + 1.0 + 0.0) / 4, rel=1e-6)
    assert torch.allclose(grad, _t([[0.0, -0.25, 0.25, 0.0, 0.0]]))
    assert m["actor/clip_cov_frac"] == pytest.approx(0.25) and m["actor/pg_clipfrac"] == pytest.approx(0.25)


def test_clip_cov_random_pick_is_one_candidate_and_follows_the_seed():
    # 25% of 4 tokens = 1: one of the two candidates, drawn with torch's global generator
    picks = set()
    for seed in range(12):
        torch.manual_seed(seed)
        loss, m, grad = _clip_cov([0.0] * 5, 0.25)
        removed = tuple((grad[0, :4] == 0).nonzero().flatten().tolist())
        assert removed in ((0,), (3,)) and m["actor/clip_cov_frac"] == pytest.approx(0.25)
        assert loss.item() == pytest.approx({(0,): 1.0 / 4, (3,): -2.0 / 4}[removed])
        torch.manual_seed(seed)
        assert _clip_cov([0.0] * 5, 0.25)[0].item() == loss.item()
        picks.add(removed)
    assert picks == {(0,), (3,)}


def _kl_cov(kl_cov_ratio, ppo_kl_coef):
    logp = _leaf(COV_LOGP)
    shift = _t([[0.1, 0.2, -0.1, 0.3, 0.0]])
    cfg = PolicyLossParams(kl_cov_ratio=kl_cov_ratio, ppo_kl_coef=ppo_kl_coef)
    loss, m = compute_policy_loss_kl_cov(logp.detach() - shift, logp, _t(COV_ADV), _t(COV_MASK), config=cfg)
    return loss, m, _grad(loss, logp)


def test_kl_cov_hand_values_penalty_on_the_top_token():
    # log-ratios [0.1, 0.2, -0.1, 0.3]; no clipping: -A * e^lr; top 25% (1 token) by cov = token 0
    loss, m, grad = _kl_cov(0.25, 0.5)
    surrogate = -2 * e(0.1) - e(0.2) + e(-0.1) + e(0.3)
    assert loss.item() == pytest.approx((surrogate + 0.5 * 0.1) / 4, rel=1e-6)
    expected = _t([[(-2 * e(0.1) + 0.5) / 4, -e(0.2) / 4, e(-0.1) / 4, e(0.3) / 4, 0.0]])
    assert torch.allclose(grad, expected, atol=1e-6)
    assert m["actor/kl_cov_frac"] == pytest.approx(0.25)


def test_kl_cov_penalty_only_on_the_top_tokens():
    # top 50% by cov = tokens 0 (3.5) and 3 (2.5): the penalty gradient coef * sign(lr) / N there only
    _, _, no_penalty = _kl_cov(0.5, 0.0)
    _, m, grad = _kl_cov(0.5, 0.8)
    assert torch.allclose(grad - no_penalty, _t([[0.8 / 4, 0.0, 0.0, 0.8 / 4, 0.0]]), atol=1e-6)
    assert m["actor/kl_cov_frac"] == pytest.approx(0.5)


def test_geo_mean_hand_values_log_space_clipping():
    # log-space clip [-0.4, 0.4]. Row 0 (A=+1): lr [0.6, -0.2] -> upper clip on token 0 ->
    # mean(0.4, -0.2) = 0.1. Row 1 (A=-1): lr [-0.6, 0.2] -> lower clip -> mean(-0.4, 0.2) = -0.1.
    # Row 2 (A=+1): lr -0.6 is below the range but A > 0 only clips above: kept. Its pad is ignored.
    old = torch.zeros(3, 2)
    logp = _leaf([[0.6, -0.2], [-0.6, 0.2], [-0.6, 9.0]])
    adv = _t([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    mask = _t([[1, 1], [1, 1], [1, 0]])
    cfg = PolicyLossParams(clip_ratio_low=0.4, clip_ratio_high=0.4)
    loss, m = compute_policy_loss_geo_mean(old, logp, adv, mask, "seq-mean-token-mean", cfg)
    assert loss.item() == pytest.approx((-e(0.1) + e(-0.1) - e(-0.6)) / 3, rel=1e-6)
    expected = _t([[0.0, -e(0.1) / 6], [0.0, e(-0.1) / 6], [-e(-0.6) / 3, 0.0]])
    assert torch.allclose(_grad(loss, logp), expected, atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)


def test_cispo_hand_values_gradient_flows_through_clipped_tokens():
    # ratios e^0.5 = 1.65 (weight clipped to 1.2) and e^-1 (no lower bound: clip_ratio_low=10)
    old = _t([[-2.0, -2.0, -2.0]])
    adv = _t([[2.0, -3.0, 100.0]])
    mask = _t([[1, 1, 0]])
    cfg = PolicyLossParams(clip_ratio_low=10.0, clip_ratio_high=0.2)
    logp = _leaf([[-1.5, -3.0, -1.0]])
    loss, m = compute_policy_loss_cispo(old, logp, adv, mask, config=cfg)
    assert loss.item() == pytest.approx(-(1.2 * 2 * -1.5 + e(-1) * -3 * -3.0) / 2, rel=1e-6)
    assert torch.allclose(_grad(loss, logp), _t([[-1.2 * 2 / 2, e(-1) * 3 / 2, 0.0]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    # PPO gives the clipped token 0 no gradient at all
    logp = _leaf([[-1.5, -3.0, -1.0]])
    vanilla, _ = compute_policy_loss_vanilla(old, logp, adv, mask, config=cfg)
    assert _grad(vanilla, logp)[0, 0].item() == 0.0
