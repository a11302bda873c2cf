import math

import pytest
import torch

from hybridrl.algorithms import (
    KL_PENALTY_REGISTRY,
    AdaptiveKLController,
    AlgorithmConfigError,
    FixedKLController,
    UnknownAlgorithmError,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-2.0, -1.5]])  # x = logp - ref = [1.0, -0.5]


@pytest.mark.parametrize(
    "names, expected",
    [
        (("kl", "k1"), [1.0, -0.5]),
        (("abs",), [1.0, 0.5]),
        (("mse", "k2"), [0.5, 0.125]),
        # k3 = exp(-x) + x - 1
        (("low_var_kl", "k3"), [math.exp(-1.0), math.exp(0.5) - 1.5]),
    ],
)
def test_kl_forms_by_hand(names, expected):
    for name in names:
        assert torch.allclose(kl_penalty(LOGP, REF, name), torch.tensor([expected]), atol=1e-6)


def test_k3_is_clamped_and_nonnegative():
    out = kl_penalty(torch.tensor([[-40.0, 0.0]]), torch.tensor([[0.0, -40.0]]), "k3")
    assert out[0, 0].item() == 10.0  # huge ratio clamped to 10
    assert 0.0 <= out[0, 1].item() <= 40.0


def test_kl_unknown_name():
    with pytest.raises(UnknownAlgorithmError, match="kl_loss_type") as e:
        kl_penalty(LOGP, REF, "k4")
    assert "algorithm.kl_penalty" in str(e.value) and "low_var_kl" in str(e.value)
    assert "k3" in KL_PENALTY_REGISTRY


def test_adaptive_controller_moves_towards_target():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    ctl.update(current_kl=2.0, n_steps=10)  # error clipped to +0.2 -> x1.02
    assert ctl.value == pytest.approx(0.102)
    ctl = AdaptiveKLController(0.1, 1.0, 100)
    ctl.update(current_kl=0.5, n_steps=10)  # error -0.5 clipped to -0.2 -> x0.98
    assert ctl.value == pytest.approx(0.098)
    ctl = AdaptiveKLController(0.1, 1.0, 100)
    ctl.update(current_kl=1.1, n_steps=10)  # error 0.1 -> x1.01
    assert ctl.value == pytest.approx(0.101)


def test_fixed_controller_and_factory():
    ctl = get_kl_controller("fixed", 0.05)
    assert isinstance(ctl, FixedKLController)
    ctl.update(10.0, 100)
    assert ctl.value == 0.05
    ctl = get_kl_controller("adaptive", 0.05, target_kl=6.0, horizon=10000)
    assert isinstance(ctl, AdaptiveKLController)
    with pytest.raises(AlgorithmConfigError, match="algorithm.kl_ctrl.type"):
        get_kl_controller("pid", 0.05)
    with pytest.raises(AlgorithmConfigError, match="algorithm.kl_ctrl.target_kl"):
        get_kl_controller("adaptive", 0.05)


def test_apply_kl_penalty_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = torch.zeros(2, 3)
    ref = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -0.5, float("nan")]])  # k1 = [1,1,1], [.5,.5,-]
    ctl = AdaptiveKLController(0.1, target_kl=0.5, horizon=20)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctl, kl_penalty="kl")
    expected = torch.tensor([[-0.1, -0.1, 0.9], [-0.05, 0.95, 0.0]])
    assert torch.allclose(rewards, expected)
    # mean of per-sequence means: (1 + 0.5) / 2 (a token mean would be 0.8)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.75)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # error clip(0.75/0.5 - 1) = 0.2, n_steps = bs = 2 -> x(1 + 0.2*2/20)
    assert ctl.value == pytest.approx(0.1 * 1.02)
