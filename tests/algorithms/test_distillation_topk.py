"""On-policy distillation: ``forward_kl_topk`` (GKD's forward KL on the teacher's top-k)."""

import math

import pytest
import torch

from hybridrl.algorithms import AlgorithmInputError
from hybridrl.algorithms.distillation import (
    DistillationLossConfig,
    compute_forward_kl_topk,
    distillation_loss,
    get_distillation_loss_fn,
)

TOPK = DistillationLossConfig(loss_mode="forward_kl_topk", use_policy_gradient=False)


def topk_inputs(student_logits, teacher_logits, k):
    """The student's log-probs of the teacher's top-k ids, the teacher's top-k log-probs, the ids."""
    teacher = torch.log_softmax(teacher_logits, dim=-1).topk(k, dim=-1)
    student = torch.log_softmax(student_logits, dim=-1).gather(-1, teacher.indices)
    return student, teacher.values, teacher.indices


def test_registered_under_verls_name():
    assert get_distillation_loss_fn("forward_kl_topk") is compute_forward_kl_topk


def test_by_hand():
    teacher = torch.log(torch.tensor([[[0.5, 0.3]]]))
    student = torch.log(torch.tensor([[[0.25, 0.25]]]))
    losses, metrics = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), TOPK)
    assert losses.item() == pytest.approx(0.5 * math.log(2.0) + 0.3 * math.log(1.2), abs=1e-6)
    assert metrics["distillation/student_mass"] == pytest.approx(0.5)
    assert metrics["distillation/teacher_mass"] == pytest.approx(0.8)


def test_zero_when_student_equals_teacher_on_the_topk():
    torch.manual_seed(0)
    teacher_logits = torch.randn(2, 5, 11)
    student_logits = teacher_logits.clone()
    student_logits[..., :] += torch.randn(2, 5, 1)  # a per-position shift: the same softmax
    student, teacher, _ = topk_inputs(student_logits, teacher_logits, k=4)
    losses, _ = compute_forward_kl_topk(student, teacher, torch.ones(2, 5), TOPK)
    assert torch.allclose(losses, torch.zeros(2, 5), atol=1e-6)


def test_gradient_flows_to_the_student_only_and_is_gkds():
    torch.manual_seed(1)
    student_logits = torch.randn(2, 3, 9, requires_grad=True)
    teacher_logits = torch.randn(2, 3, 9, requires_grad=True)
    student, teacher, ids = topk_inputs(student_logits, teacher_logits, k=3)
    cfg = DistillationLossConfig(loss_mode="forward_kl_topk", use_policy_gradient=False, log_prob_min_clamp=None)
    losses, _ = compute_forward_kl_topk(student, teacher, torch.ones(2, 3), cfg)
    assert (losses > 0).all()  # no clamp at 0 active for this draw
    losses.sum().backward()
    assert teacher_logits.grad is None
    # d/dz sum_i p_i (log p_i - log softmax(z)_i) = (sum_i p_i) softmax(z) - p (p zero off the top-k)
    p = torch.zeros(2, 3, 9).scatter(-1, ids, teacher.detach().exp())
    expected = p.sum(-1, keepdim=True) * torch.softmax(student_logits.detach(), -1) - p
    assert torch.allclose(student_logits.grad, expected, atol=1e-6)


def test_the_mask_excludes_padding():
    teacher = torch.log(torch.tensor([[[0.5, 0.3], [0.6, 0.2]]]))
    student = torch.tensor([[[math.log(0.25), math.log(0.25)], [float("nan"), float("-inf")]]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    losses, metrics = compute_forward_kl_topk(student, teacher, mask, TOPK)
    assert losses[0, 1].item() == 0.0 and torch.isfinite(losses).all()
    assert metrics["distillation/teacher_mass"] == pytest.approx(0.8)
    assert metrics["distillation/teacher_mass_max"] == pytest.approx(0.8)
    loss, _ = distillation_loss(student, teacher, mask, TOPK)
    assert loss.item() == pytest.approx(losses[0, 0].item())


def test_truncated_kl_below_zero_is_clamped_to_zero():
    # The student puts more mass than the teacher on the teacher's top-k: sum p log(p/q) < 0.
    teacher = torch.log(torch.tensor([[[0.3, 0.2]]]))
    student = torch.log(torch.tensor([[[0.6, 0.3]]]))
    losses, _ = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), TOPK)
    assert losses.item() == 0.0


def test_log_prob_min_clamp_acts():
    teacher = torch.tensor([[[math.log(0.5), float("-inf")]]])  # a padded top-k slot
    student = torch.tensor([[[math.log(0.5), -50.0]]])
    clamped = DistillationLossConfig(loss_mode="forward_kl_topk", use_policy_gradient=False, log_prob_min_clamp=-10.0)
    losses, _ = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), clamped)
    assert losses.item() == pytest.approx(0.0, abs=1e-9)  # both clamped to -10: the slot adds e^-10 * 0
    student = torch.tensor([[[math.log(0.25), -50.0]]])
    no_clamp = DistillationLossConfig(loss_mode="forward_kl_topk", use_policy_gradient=False, log_prob_min_clamp=None)
    losses, _ = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), no_clamp)
    assert losses.item() == pytest.approx(0.5 * math.log(2.0))  # the -inf slot adds 0, not NaN
    teacher = torch.tensor([[[math.log(0.5), -5.0]]])
    unclamped, _ = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), no_clamp)
    clamped_loss, _ = compute_forward_kl_topk(student, teacher, torch.ones(1, 1), clamped)
    assert unclamped.item() == pytest.approx(0.5 * math.log(2.0) + math.exp(-5.0) * 45.0, rel=1e-5)
    assert clamped_loss.item() == pytest.approx(0.5 * math.log(2.0) + math.exp(-5.0) * 5.0, rel=1e-5)


def test_overlap_ratio_and_masses():
    teacher_ids = torch.tensor([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]])
    student_ids = torch.tensor([[[3, 2, 0], [9, 9, 9], [0, 0, 0]]])
    teacher = torch.log(torch.tensor([[[0.4, 0.2, 0.1]] * 3]))
    student = torch.log(torch.tensor([[[0.1, 0.1, 0.1], [0.2, 0.2, 0.2], [0.3, 0.3, 0.3]]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = compute_forward_kl_topk(
        student, teacher, mask, TOPK, teacher_topk_ids=teacher_ids, student_topk_ids=student_ids
    )
    assert metrics["distillation/overlap_ratio"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["distillation/student_mass"] == pytest.approx((0.3 + 0.6) / 2)
    assert metrics["distillation/student_mass_min"] == pytest.approx(0.3)
    assert metrics["distillation/student_mass_max"] == pytest.approx(0.6)
    assert metrics["distillation/teacher_mass"] == pytest.approx(0.7)
    with pytest.raises(AlgorithmInputError, match="both"):
        compute_forward_kl_topk(student, teacher, mask, TOPK, teacher_topk_ids=teacher_ids)


def test_shapes_are_checked():
    with pytest.raises(AlgorithmInputError, match="student_topk_log_probs has shape"):
        compute_forward_kl_topk(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2), TOPK)
