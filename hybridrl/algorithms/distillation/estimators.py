"""The sampled-token reverse-KL estimators as distillation losses (``loss_mode`` ``kl``/``k1``,
``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``): hybridrl's KL estimators of
:func:`~hybridrl.algorithms.kl.kl_penalty`, with the teacher in the reference's place."""

from typing import Dict, Optional, Tuple

import torch

from ..errors import AlgorithmConfigError
from ..kl import KL_PENALTY_REGISTRY, kl_penalty
from .base import DistillationLossSettings, check_shapes, register_distillation_loss, zero_padding
from .config import SECTION, DistillationLossConfig

ESTIMATOR_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@register_distillation_loss(DistillationLossSettings(names=ESTIMATOR_NAMES, use_estimator=True))
def compute_distillation_loss_reverse_kl_estimator(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[DistillationLossConfig] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    student_topk_ids: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Per-token reverse KL(student || teacher), estimated from the sampled token alone.

    The student samples ``y_t ~ pi_S(. | s_t)``; with ``x_t = log pi_S(y_t | s_t) - log pi_T(y_t | s_t)``
    (J. Schulman, "Approximating KL Divergence", 2020; the estimators of
    :func:`~hybridrl.algorithms.kl.kl_penalty`, named by ``config.loss_mode``)::

        kl / k1:          x_t                      (unbiased, can be < 0)
        abs:              |x_t|
        mse / k2:         x_t**2 / 2
        low_var_kl / k3:  exp(-x_t) + x_t - 1      (unbiased, >= 0; -x_t clamped to [-20, 20],
                                                     the result to [-10, 10])

    Since ``E_{y ~ pi_S}[x_t] = KL(pi_S || pi_T)`` at ``s_t``, ``-k1`` is the per-token reward of
    on-policy distillation (Thinking Machines, "On-Policy Distillation", 2025): the student is
    penalised where it puts mass the teacher does not, on states it reaches itself (GKD, Agarwal
    et al. 2024, arXiv:2306.13649).

    Args:
        student_log_probs: ``(bs, response_length)`` log-prob of the sampled token under the
            student (may carry the gradient).
        teacher_log_probs: ``(bs, response_length)`` (or ``(..., 1)``) the same token's log-prob
            under the teacher.
        response_mask: ``(bs, response_length)``, 1 on response tokens.
        config: ``loss_mode`` picks the estimator; None uses ``DistillationLossConfig()`` (k3).
        teacher_topk_ids, student_topk_ids: not used (the registry's common signature).

    Returns:
        ``(distillation_losses, metrics)``: the ``(bs, response_length)`` estimate, 0 on padding;
        ``distillation/abs_loss``: the mean of ``|loss|`` over valid tokens (k1's mean can hide
        large errors of both signs).

    Raises:
        AlgorithmConfigError: ``config.loss_mode`` is not a KL estimator.
        AlgorithmInputError: shapes differ from ``response_mask``'s.
    """
    cfg = config if config is not None else DistillationLossConfig()
    if cfg.loss_mode not in KL_PENALTY_REGISTRY:
        raise AlgorithmConfigError(
            f"{SECTION}.loss_mode={cfg.loss_mode!r} is not a sampled-token KL estimator; use one of "
            f"{', '.join(ESTIMATOR_NAMES)}"
        )
    if teacher_log_probs.dim() == response_mask.dim() + 1 and teacher_log_probs.shape[-1] == 1:
        teacher_log_probs = teacher_log_probs.squeeze(-1)
    check_shapes(
        "compute_distillation_loss_reverse_kl_estimator",
        tuple(response_mask.shape),
        student_log_probs=student_log_probs,
        teacher_log_probs=teacher_log_probs,
    )
    losses = kl_penalty(student_log_probs, teacher_log_probs.detach(), cfg.loss_mode)
    losses = zero_padding(losses, response_mask)
    valid = losses.detach()[response_mask.bool()]
    abs_loss = valid.abs().float().mean().item() if valid.numel() else 0.0
    return losses, {"distillation/abs_loss": abs_loss}
