"""On-policy distillation: the reverse-KL estimators, the registry, the section and the clamps."""

import dataclasses
import math

import pytest
import torch

from hybridrl.algorithms import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError, agg_loss, kl_penalty
from hybridrl.algorithms.distillation import (
    DISTILLATION_LOSSES,
    DistillationLossConfig,
    DistillationLossSettings,
    compute_distillation_loss_reverse_kl_estimator,
    distillation_loss,
    get_distillation_loss_fn,
    get_distillation_loss_settings,
    register_distillation_loss,
)

STUDENT = torch.tensor([[-1.0, -2.0, -0.5]])
TEACHER = torch.tensor([[-2.0, -1.5, -0.5]])  # x = student - teacher = [1.0, -0.5, 0.0]
MASK = torch.ones(1, 3)


def cfg(loss_mode: str, **kw) -> DistillationLossConfig:
    kw.setdefault("use_policy_gradient", loss_mode in ("k1", "kl"))
    return DistillationLossConfig(loss_mode=loss_mode, **kw)


@pytest.mark.parametrize(
    "names, expected",
    [
        (("kl", "k1"), [1.0, -0.5, 0.0]),
        (("abs",), [1.0, 0.5, 0.0]),
        (("mse", "k2"), [0.5, 0.125, 0.0]),
        (("low_var_kl", "k3"), [math.exp(-1.0), math.exp(0.5) - 1.5, 0.0]),  # exp(-x) + x - 1
    ],
)
def test_each_estimator_equals_its_formula(names, expected):
    for name in names:
        fn = get_distillation_loss_fn(name)
        assert fn is compute_distillation_loss_reverse_kl_estimator
        losses, metrics = fn(STUDENT, TEACHER, MASK, cfg(name))
        assert torch.allclose(losses, torch.tensor([expected]), atol=1e-6)
        assert metrics["distillation/abs_loss"] == pytest.approx(sum(abs(v) for v in expected) / 3, abs=1e-6)


def test_the_estimators_are_kl_penalty_with_the_teacher_as_reference():
    torch.manual_seed(0)
    student, teacher = -torch.rand(4, 7) * 5, -torch.rand(4, 7) * 5
    for name in ("k1", "abs", "k2", "k3"):
        losses, _ = compute_distillation_loss_reverse_kl_estimator(student, teacher, torch.ones(4, 7), cfg(name))
        assert torch.equal(losses, kl_penalty(student, teacher, name))


def test_k3_is_nonnegative():
    torch.manual_seed(1)
    student, teacher = -torch.rand(64, 32) * 30, -torch.rand(64, 32) * 30
    losses, _ = compute_distillation_loss_reverse_kl_estimator(student, teacher, torch.ones(64, 32), cfg("k3"))
    assert (losses >= 0).all()


def test_teacher_log_probs_with_a_topk_dim_of_one_are_accepted():
    losses, _ = compute_distillation_loss_reverse_kl_estimator(STUDENT, TEACHER.unsqueeze(-1), MASK, cfg("k2"))
    assert torch.allclose(losses, torch.tensor([[0.5, 0.125, 0.0]]))


def test_shape_mismatch_is_one_line():
    with pytest.raises(AlgorithmInputError, match="teacher_log_probs has shape"):
        compute_distillation_loss_reverse_kl_estimator(STUDENT, TEACHER[:, :2], MASK, cfg("k3"))


def test_the_mask_excludes_padding():
    student = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("-inf"), -3.0]])
    teacher = torch.tensor([[-2.0, -1.5, -1.0], [-0.7, -1.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    losses, metrics = compute_distillation_loss_reverse_kl_estimator(student, teacher, mask, cfg("k2"))
    assert torch.isfinite(losses).all()
    assert losses[mask == 0].eq(0).all()
    expected = [0.5, 0.125, 0.5 * 0.2**2]
    assert metrics["distillation/abs_loss"] == pytest.approx(sum(expected) / 3, abs=1e-6)
    loss, metrics = distillation_loss(student, teacher, mask, cfg("k2"))
    assert loss.item() == pytest.approx(sum(expected) / 3, abs=1e-6)
    assert metrics["distillation/loss_max"] == pytest.approx(0.5)
    assert metrics["distillation/loss_min"] == pytest.approx(0.02, abs=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_direct_loss_is_the_estimator_aggregated(mode):
    torch.manual_seed(2)
    student = (-torch.rand(3, 5) * 3).requires_grad_()
    teacher = -torch.rand(3, 5) * 3
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    loss, _ = distillation_loss(student, teacher, mask, cfg("k3"), loss_agg_mode=mode)
    assert torch.allclose(loss, agg_loss(kl_penalty(student, teacher, "k3"), mask, mode))
    loss.backward()
    assert student.grad[mask == 0].eq(0).all() and student.grad[mask == 1].ne(0).all()


def test_loss_max_clamp_clamps_after_the_range_metrics():
    student, teacher = torch.tensor([[0.0, -1.0]]), torch.tensor([[-10.0, -1.5]])  # k2 = [50, 0.125]
    mask = torch.ones(1, 2)
    loss, metrics = distillation_loss(student, teacher, mask, cfg("k2", loss_max_clamp=10.0))
    assert loss.item() == pytest.approx((10.0 + 0.125) / 2)
    assert metrics["distillation/loss_max"] == pytest.approx(50.0)
    loss, _ = distillation_loss(student, teacher, mask, cfg("k2", loss_max_clamp=None))
    assert loss.item() == pytest.approx((50.0 + 0.125) / 2)


def test_registry_unknown_name_is_one_line_with_the_known_names():
    with pytest.raises(UnknownAlgorithmError) as info:
        get_distillation_loss_fn("forward_kl")
    message = str(info.value)
    assert "\n" not in message
    assert "distillation.distillation_loss.loss_mode='forward_kl'" in message
    for name in ("k1", "k3", "low_var_kl", "forward_kl_topk"):
        assert name in message


def test_registry_settings_and_a_custom_loss():
    assert get_distillation_loss_settings("k3").use_estimator
    assert get_distillation_loss_settings("forward_kl_topk").use_topk
    with pytest.raises(AlgorithmConfigError, match="exactly one"):
        DistillationLossSettings(names="x", use_topk=True, use_estimator=True)

    @register_distillation_loss(DistillationLossSettings(names=("test_zero",), use_estimator=True))
    def zero(student_log_probs, teacher_log_probs, response_mask, config=None, **_):
        return torch.zeros_like(student_log_probs), {}

    try:
        assert get_distillation_loss_fn("test_zero") is zero
        loss, _ = distillation_loss(STUDENT, TEACHER, MASK, cfg("test_zero", use_policy_gradient=False))
        assert loss.item() == 0.0
        with pytest.raises(UnknownAlgorithmError, match="already registered"):
            register_distillation_loss(DistillationLossSettings(names="k3", use_estimator=True))(zero)
    finally:
        DISTILLATION_LOSSES.unregister("test_zero")


def test_section_defaults_are_verls():
    c = DistillationLossConfig()
    assert (c.loss_mode, c.topk, c.use_task_rewards, c.distillation_loss_coef) == ("k3", 128, True, 1.0)
    assert (c.loss_max_clamp, c.log_prob_min_clamp, c.use_policy_gradient) == (10.0, -10.0, True)
    assert (c.policy_loss_mode, c.clip_ratio, c.clip_ratio_low, c.clip_ratio_high) == ("vanilla", 0.2, 0.2, 0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.loss_mode = "k1"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_mode": "k1", "use_policy_gradient": False}, "does not depend on the teacher"),
        ({"loss_max_clamp": 0.0}, "loss_max_clamp"),
        ({"log_prob_min_clamp": 1.0}, "log_prob_min_clamp"),
        ({"topk": 0}, "topk"),
        ({"distillation_loss_coef": -1.0}, "distillation_loss_coef"),
        ({"clip_ratio_low": 0}, "clip_ratio_low"),
    ],
)
def test_section_rules(kwargs, match):
    with pytest.raises(AlgorithmConfigError, match=match):
        DistillationLossConfig(**kwargs)


def test_estimator_refuses_a_topk_loss_mode():
    with pytest.raises(AlgorithmConfigError, match="not a sampled-token KL estimator"):
        compute_distillation_loss_reverse_kl_estimator(STUDENT, TEACHER, MASK, cfg("forward_kl_topk"))
