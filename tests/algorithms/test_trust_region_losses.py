"""sapo, dppo_tv, dppo_kl and dro against their formulas on hand-made tokens: values, gradients,
which tokens the trust region drops, and the settings they need."""

import math

import pytest
import torch

from hybridrl.algorithms import PolicyLossParams, get_policy_loss_fn
from hybridrl.algorithms.errors import AlgorithmConfigError

# one response of four tokens; probabilities chosen to sit inside / outside the trust regions
P_OLD = torch.tensor([[0.50, 0.50, 0.10, 0.90]])
P_NEW = torch.tensor([[0.60, 0.80, 0.05, 0.95]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
MASK = torch.ones(1, 4)


def _run(name, cfg, p_new=P_NEW, adv=ADV, mask=MASK, agg="token-mean"):
    log_prob = torch.log(p_new).requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(torch.log(P_OLD), log_prob, adv, mask, agg, cfg)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.item(), grad, metrics


def test_sapo_is_the_sigmoid_gate_and_matches_ppo_on_policy():
    cfg = PolicyLossParams(tau_pos=1.0, tau_neg=2.0)
    loss, grad, metrics = _run("sapo", cfg)
    r = P_NEW / P_OLD
    tau = torch.where(ADV > 0, torch.tensor(1.0), torch.tensor(2.0))
    gate = torch.sigmoid(tau * (r - 1)) * 4 / tau
    assert loss == pytest.approx(float((-gate * ADV).mean()), rel=1e-5)  # one sequence: seq-mean-token-mean
    # dL/dlogp = -A * f'(r) * r / T, with f'(r) = 4 sigma(1 - sigma)
    sig = torch.sigmoid(tau * (r - 1))
    assert torch.allclose(grad, -ADV * 4 * sig * (1 - sig) * r / 4, atol=1e-6)
    _, on_policy_grad, _ = _run("sapo", cfg, p_new=P_OLD)
    assert torch.allclose(on_policy_grad, -ADV / 4, atol=1e-6)  # f'(1) = 1: the plain policy gradient
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_dppo_tv_drops_tokens_whose_probability_moved_too_far():
    cfg = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    loss, grad, metrics = _run("dppo_tv", cfg)
    # moved: +0.1 (A>0, kept), +0.3 (A>0, > 0.2: dropped), -0.05 (A<0, kept), +0.05 (A<0, kept)
    keep = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    r = P_NEW / P_OLD
    assert torch.allclose(grad, -ADV * r * keep / 4, atol=1e-6)
    assert loss == pytest.approx(float((-ADV * r * torch.log(P_NEW) * keep).mean()), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)


def test_dppo_truncates_the_ratio_weight_at_clip_ratio_c():
    cfg = PolicyLossParams(clip_ratio_low=0.9, clip_ratio_high=0.9, clip_ratio_c=1.2)
    _, grad, metrics = _run("dppo_tv", cfg)
    r = (P_NEW / P_OLD).clamp(max=1.2)
    assert torch.allclose(grad, -ADV * r / 4, atol=1e-6)  # 0.8 / 0.5 = 1.6 -> 1.2
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)


def test_dppo_kl_bounds_the_binary_kl_in_the_advantage_direction():
    cfg = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=3.0)
    _, grad, _ = _run("dppo_kl", cfg)
    p, q = P_NEW, P_OLD
    kl = q * torch.log(q / p) + (1 - q) * torch.log((1 - q) / (1 - p))
    up = p > q
    keep = torch.where(ADV > 0, (kl <= 0.05) | ~up, (kl <= 0.05) | up).float()
    assert keep.tolist() == [[1.0, 0.0, 1.0, 1.0]]  # 0.5 -> 0.8 has KL_b 0.19: dropped
    assert torch.allclose(grad, -ADV * (p / q) * keep / 4, atol=1e-6)


def test_dro_is_the_policy_gradient_minus_a_quadratic_pull_back():
    cfg = PolicyLossParams(dro_beta=0.5)
    loss, grad, _ = _run("dro", cfg)
    log_ratio = torch.log(P_NEW / P_OLD)
    assert loss == pytest.approx(float(-(torch.log(P_NEW) * ADV - 0.25 * log_ratio**2).mean()), rel=1e-5)
    assert torch.allclose(grad, -(ADV - 0.5 * log_ratio) / 4, atol=1e-6)


def test_dro_needs_its_beta_at_start_up_and_in_the_loss():
    from hybridrl.workers.actor import build_policy_loss_config
    from tests.tiny_models import ppo_section

    with pytest.raises(AlgorithmConfigError, match=r"loss_mode=dro needs policy_loss.dro_beta"):
        ppo_section("actor_rollout_ref.actor", {"policy_loss": {"loss_mode": "dro"}})  # the section's rule
    section = ppo_section("actor_rollout_ref.actor", {"policy_loss": {"loss_mode": "dro", "dro_beta": 0.1}})
    assert build_policy_loss_config(section).dro_beta == 0.1
    with pytest.raises(AlgorithmConfigError, match=r"loss_mode=dro needs policy_loss.dro_beta"):
        PolicyLossParams(loss_mode="dro")
    with pytest.raises(AlgorithmConfigError, match=r"dro_beta=None must be > 0"):
        _run("dro", PolicyLossParams())


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_sapo_temperatures_must_be_positive(tau):
    with pytest.raises(AlgorithmConfigError, match=r"actor_rollout_ref.actor.tau_pos=.* must be > 0"):
        PolicyLossParams(tau_pos=tau)


def test_masked_tokens_change_nothing():
    for name, cfg in (
        ("sapo", PolicyLossParams()),
        ("dppo_tv", PolicyLossParams()),
        ("dppo_kl", PolicyLossParams()),
        ("dro", PolicyLossParams(dro_beta=0.5)),
    ):
        mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
        garbage = P_NEW.clone()
        garbage[0, 3] = 0.001
        a = _run(name, cfg, mask=mask)
        b = _run(name, cfg, p_new=garbage, mask=mask)
        assert a[0] == pytest.approx(b[0]) and torch.allclose(a[1][:, :3], b[1][:, :3]), name
        assert math.isfinite(a[0])
