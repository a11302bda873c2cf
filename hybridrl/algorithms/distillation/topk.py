"""``forward_kl_topk``: GKD's forward KL(teacher || student) on the teacher's top-k next tokens."""

from typing import Dict, Optional, Tuple

import torch

from ..errors import AlgorithmInputError
from .base import DistillationLossSettings, check_shapes, masked_stats, register_distillation_loss, zero_padding
from .config import DistillationLossConfig


def topk_overlap_ratio(
    teacher_topk_ids: torch.Tensor, student_topk_ids: torch.Tensor, response_mask: torch.Tensor
) -> float:
    """Mean over valid positions of ``|T_t & S_t| / k``: the fraction of the teacher's top-k ids
    ``T_t`` that are also among the student's own top-k ids ``S_t`` (0.0 with no valid position).

    Args:
        teacher_topk_ids, student_topk_ids: ``(bs, response_length, k)`` token ids.
        response_mask: ``(bs, response_length)``.
    """
    shared = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(dim=-1)
    ratio = shared.float().sum(dim=-1) / teacher_topk_ids.shape[-1]
    valid = ratio[response_mask.bool()]
    return valid.mean().item() if valid.numel() else 0.0


@register_distillation_loss(DistillationLossSettings(names="forward_kl_topk", use_topk=True))
def compute_forward_kl_topk(
    student_topk_log_probs: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[DistillationLossConfig] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    student_topk_ids: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Per-token forward KL(teacher || student) restricted to the teacher's top-k next tokens.

    Source: GKD, "On-Policy Distillation of Language Models: Learning from Self-Generated
    Mistakes", Agarwal et al. 2024, arXiv:2306.13649 (the divergence is taken at the student's own
    states, the responses it sampled). At position ``t`` let ``T_t`` be the teacher's ``k`` most
    likely next-token ids, ``log p_i`` the teacher's and ``log q_i`` the student's log-prob of id
    ``i`` (each a full-vocabulary log-softmax, gathered at ``T_t``), both clamped from below at
    ``c = config.log_prob_min_clamp`` (None: no clamp)::

        L_t = max(0, sum_{i in T_t} p_i * (log p_i - log q_i)),   p_i = exp(max(log p_i, c))

    The teacher's top-k mass is below 1, so the truncated sum can be negative: it is clamped at 0
    (no gradient there). The gradient flows only into the student's log-probs
    (``-sum_i p_i * grad log q_i``: the student raises its probability on the teacher's likely
    tokens); the teacher's are detached. A teacher log-prob of ``-inf`` (a padded top-k slot)
    contributes 0.

    Args:
        student_topk_log_probs: ``(bs, response_length, k)`` the student's log-probs of the
            teacher's top-k ids (carries the gradient).
        teacher_topk_log_probs: ``(bs, response_length, k)`` the teacher's top-k log-probs.
        response_mask: ``(bs, response_length)``.
        config: ``log_prob_min_clamp``; None uses ``DistillationLossConfig()`` (-10.0).
        teacher_topk_ids: ``(bs, response_length, k)`` the teacher's top-k ids, and
        student_topk_ids: ``(bs, response_length, k)`` the student's own top-k ids: both given,
            ``distillation/overlap_ratio`` is reported.

    Returns:
        ``(distillation_losses, metrics)``: ``L_t`` in fp32, 0 on padding, and over valid
        positions (python floats):

        * ``distillation/student_mass`` (and ``_min`` / ``_max``): ``sum_{i in T_t} q_i``, the
          student's probability on the teacher's top-k ids (before the clamp);
        * ``distillation/teacher_mass`` (and ``_min`` / ``_max``): ``sum_{i in T_t} p_i``, the
          probability the teacher's top-k covers (before the clamp);
        * ``distillation/overlap_ratio`` (with both ids): mean of ``|T_t & S_t| / k``, the share
          of the teacher's top-k that is in the student's top-k ``S_t``.

    Raises:
        AlgorithmInputError: shapes differ from ``(bs, response_length, k)``, or only one of the
            two id tensors is given.
    """
    cfg = config if config is not None else DistillationLossConfig()
    expected = tuple(response_mask.shape) + tuple(teacher_topk_log_probs.shape[-1:])
    what = "compute_forward_kl_topk"
    check_shapes(what, expected, student_topk_log_probs=student_topk_log_probs)
    check_shapes(what, expected, teacher_topk_log_probs=teacher_topk_log_probs)
    if (teacher_topk_ids is None) != (student_topk_ids is None):
        raise AlgorithmInputError(
            f"{what}: give both teacher_topk_ids and student_topk_ids (for distillation/overlap_ratio) or neither"
        )

    log_q = student_topk_log_probs.float()
    log_p = teacher_topk_log_probs.detach().float()
    mask = response_mask.bool()
    metrics = masked_stats(log_q.detach().exp().sum(-1), mask, "distillation/student_mass")
    metrics.update(masked_stats(log_p.exp().sum(-1), mask, "distillation/teacher_mass"))
    if teacher_topk_ids is not None and student_topk_ids is not None:
        check_shapes(what, expected, teacher_topk_ids=teacher_topk_ids, student_topk_ids=student_topk_ids)
        metrics["distillation/overlap_ratio"] = topk_overlap_ratio(teacher_topk_ids, student_topk_ids, mask)

    if cfg.log_prob_min_clamp is not None:
        log_q = log_q.clamp_min(cfg.log_prob_min_clamp)
        log_p = log_p.clamp_min(cfg.log_prob_min_clamp)
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    losses = terms.sum(dim=-1).clamp_min(0.0)
    return zero_padding(losses, mask), metrics
