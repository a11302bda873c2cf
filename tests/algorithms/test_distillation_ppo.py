"""On-policy distillation as a reward under a policy loss, and combined with the task's loss."""

import pytest
import torch

from hybridrl.algorithms import AlgorithmInputError, PolicyLossParams, agg_loss, compute_policy_loss_vanilla, kl_penalty
from hybridrl.algorithms.distillation import (
    DistillationLossConfig,
    compute_forward_kl_topk,
    distillation_loss,
    distillation_ppo_loss,
)

torch.manual_seed(0)
BS, T = 4, 6
MASK = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]).float()
OLD = -torch.rand(BS, T) * 2
NEW = OLD + torch.randn(BS, T) * 0.5  # ratios far from 1: the clip is active somewhere
TEACHER = -torch.rand(BS, T) * 4
ADV = torch.randn(BS, T)
CLIPS = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2)


def leaf(x):
    return x.clone().requires_grad_()


def test_pg_variant_equals_vanilla_fed_the_negative_clamped_estimator():
    cfg = DistillationLossConfig(loss_mode="k1", use_task_rewards=False, loss_max_clamp=0.5)
    log_prob = leaf(NEW)
    loss, metrics = distillation_ppo_loss(OLD, log_prob, None, MASK, TEACHER, cfg)
    reference = leaf(NEW)
    advantages = -kl_penalty(NEW, TEACHER, "k1").clamp(-0.5, 0.5) * MASK
    expected, pg_metrics = compute_policy_loss_vanilla(OLD, reference, advantages, MASK, config=CLIPS)
    assert torch.allclose(loss, expected)
    loss.backward()
    expected.backward()
    assert torch.allclose(log_prob.grad, reference.grad)
    assert pg_metrics["actor/pg_clipfrac"] > 0
    assert metrics["distillation/pg_clipfrac"] == pytest.approx(pg_metrics["actor/pg_clipfrac"])
    assert metrics["distillation/loss"] == pytest.approx(expected.item())
    for key in ("distillation/loss_min", "distillation/loss_max", "distillation/abs_loss", "distillation/ppo_kl"):
        assert key in metrics
    assert metrics["distillation/loss_max"] > 0.5  # the range is taken before the clamp


def test_the_reward_carries_no_gradient_of_its_own():
    """With use_policy_gradient the estimator is a detached reward: on-policy the gradient is
    -sum_t A_t grad log p_t / n, whatever the estimator's own gradient would be."""
    cfg = DistillationLossConfig(loss_mode="k3", use_task_rewards=False, loss_max_clamp=None)
    log_prob = leaf(OLD)
    loss, _ = distillation_ppo_loss(OLD, log_prob, None, MASK, TEACHER, cfg)
    loss.backward()
    expected = kl_penalty(OLD, TEACHER, "k3") * MASK / MASK.sum()
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)


def test_task_rewards_add_the_task_loss_and_the_weighted_distillation_loss():
    cfg = DistillationLossConfig(loss_mode="k1", distillation_loss_coef=0.3, loss_max_clamp=None)
    loss, metrics = distillation_ppo_loss(OLD, NEW, ADV, MASK, TEACHER, cfg, policy_loss_config=CLIPS)
    task, _ = compute_policy_loss_vanilla(OLD, NEW, ADV, MASK, config=CLIPS)
    distill, _ = compute_policy_loss_vanilla(OLD, NEW, -kl_penalty(NEW, TEACHER, "k1") * MASK, MASK, config=CLIPS)
    assert torch.allclose(loss, task + 0.3 * distill)
    assert "actor/pg_clipfrac" in metrics and metrics["distillation/loss"] == pytest.approx(distill.item())


def test_on_policy_the_gradient_is_that_of_the_combined_advantage():
    cfg = DistillationLossConfig(loss_mode="k1", distillation_loss_coef=0.5, loss_max_clamp=None)
    log_prob = leaf(OLD)
    loss, _ = distillation_ppo_loss(OLD, log_prob, ADV, MASK, TEACHER, cfg)
    loss.backward()
    combined = leaf(OLD)
    advantages = ADV - 0.5 * kl_penalty(OLD, TEACHER, "k1")
    expected, _ = compute_policy_loss_vanilla(OLD, combined, advantages, MASK)
    expected.backward()
    assert torch.allclose(log_prob.grad, combined.grad, atol=1e-6)


def test_direct_loss_with_task_rewards():
    cfg = DistillationLossConfig(loss_mode="k3", use_policy_gradient=False, distillation_loss_coef=2.0)
    loss, _ = distillation_ppo_loss(OLD, NEW, ADV, MASK, TEACHER, cfg, loss_agg_mode="seq-mean-token-mean")
    task, _ = compute_policy_loss_vanilla(OLD, NEW, ADV, MASK, loss_agg_mode="seq-mean-token-mean")
    direct = agg_loss(kl_penalty(NEW, TEACHER, "k3"), MASK, "seq-mean-token-mean")
    assert torch.allclose(loss, task + 2.0 * direct)


def test_without_task_rewards_the_coefficient_is_not_applied():
    cfg = DistillationLossConfig(
        loss_mode="k3", use_policy_gradient=False, use_task_rewards=False, distillation_loss_coef=5.0
    )
    loss, _ = distillation_ppo_loss(OLD, NEW, ADV, MASK, TEACHER, cfg)
    assert torch.allclose(loss, agg_loss(kl_penalty(NEW, TEACHER, "k3"), MASK, "token-mean"))


def test_missing_inputs_are_one_line():
    with pytest.raises(AlgorithmInputError, match="task advantages"):
        distillation_ppo_loss(OLD, NEW, None, MASK, TEACHER, DistillationLossConfig())
    with pytest.raises(AlgorithmInputError, match="student_topk_log_probs"):
        distillation_ppo_loss(OLD, NEW, ADV, MASK, TEACHER, DistillationLossConfig(loss_mode="forward_kl_topk"))
    with pytest.raises(AlgorithmInputError, match="old_log_prob"):
        distillation_loss(NEW, TEACHER, MASK, DistillationLossConfig(loss_mode="k1"))


def test_topk_loss_as_a_reward_uses_the_sampled_token_log_prob():
    teacher_logits, student_logits = torch.randn(BS, T, 10), torch.randn(BS, T, 10)
    teacher = torch.log_softmax(teacher_logits, -1).topk(3, dim=-1)
    student_topk = torch.log_softmax(student_logits, -1).gather(-1, teacher.indices)
    cfg = DistillationLossConfig(loss_mode="forward_kl_topk", use_task_rewards=False)
    log_prob = leaf(NEW)
    loss, metrics = distillation_ppo_loss(
        OLD, log_prob, None, MASK, teacher.values, cfg, student_topk_log_probs=student_topk
    )
    per_token, _ = compute_forward_kl_topk(student_topk, teacher.values, MASK, cfg)
    expected, _ = compute_policy_loss_vanilla(OLD, NEW, -per_token.clamp(-10.0, 10.0), MASK)
    assert torch.allclose(loss, expected)
    assert "distillation/teacher_mass" in metrics and "distillation/pg_clipfrac" in metrics
    loss.backward()
    assert log_prob.grad[MASK == 1].ne(0).any() and log_prob.grad[MASK == 0].eq(0).all()
