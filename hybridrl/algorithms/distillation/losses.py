"""The on-policy distillation losses the actor trains on (verl's ``distillation_loss`` and
``distillation_ppo_loss``): the per-token loss of a registered ``loss_mode``, clamped, then
either backpropagated directly or used as a reward, and added to the task's policy loss."""

from typing import Any, Dict, Optional, Tuple

import torch

from ..errors import AlgorithmInputError
from ..functional import Number, agg_loss
from ..policy_loss import PolicyLossParams, get_policy_loss_fn
from .base import DISTILLATION_LOSSES, get_distillation_loss_fn, masked_stats, zero_padding
from .config import DistillationLossConfig


def compute_distillation_loss_range(distillation_losses: torch.Tensor, response_mask: torch.Tensor) -> Dict[str, float]:
    """``distillation/loss_min`` and ``distillation/loss_max``: the smallest and largest per-token
    loss over valid tokens (before the clamp), python floats (0.0 with no valid token)."""
    stats = masked_stats(distillation_losses, response_mask, "distillation/loss")
    return {key: stats[key] for key in ("distillation/loss_min", "distillation/loss_max")}


def distillation_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[DistillationLossConfig] = None,
    loss_agg_mode: str = "token-mean",
    old_log_prob: Optional[torch.Tensor] = None,
    log_prob: Optional[torch.Tensor] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    student_topk_ids: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The distillation loss alone, as a scalar to backpropagate.

    ``d_t`` is the per-token loss of ``config.loss_mode`` (:func:`get_distillation_loss_fn`: an
    estimator of reverse KL(student || teacher) at the sampled token, or ``forward_kl_topk``),
    clamped to ``[-M, M]`` with ``M = config.loss_max_clamp`` (None: no clamp). Then:

    * ``use_policy_gradient=false``, the direct (supervised) loss of GKD (Agarwal et al. 2024,
      arXiv:2306.13649): ``agg_loss(d, response_mask, loss_agg_mode)``; the gradient flows
      through the student's log-probs inside ``d``.
    * ``use_policy_gradient=true``, distillation as RL with a dense reward (Thinking Machines,
      "On-Policy Distillation", 2025): the per-token advantage is ``A_t = -sg(d_t)`` (no discount,
      no baseline, no whitening), fed to the policy loss ``config.policy_loss_mode``
      (:func:`~hybridrl.algorithms.policy_loss.get_policy_loss_fn`) with this section's clip
      ratios. For vanilla PPO: ``max(-A_t * r_t, -A_t * clip(r_t, 1 - low, 1 + high))``,
      ``r_t = exp(log_prob - old_log_prob)``, aggregated with ``loss_agg_mode``.

    Args:
        student_log_probs, teacher_log_probs: the registered loss's inputs: ``(bs, response_length)``
            sampled-token log-probs for the estimators, ``(bs, response_length, topk)`` log-probs of
            the teacher's top-k ids for ``forward_kl_topk`` (see :mod:`.base`).
        response_mask: ``(bs, response_length)``.
        config: the section; None uses ``DistillationLossConfig()``.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see
            :func:`~hybridrl.algorithms.functional.agg_loss`.
        old_log_prob: ``(bs, response_length)`` the sampled tokens' log-probs at rollout time
            (needed with ``use_policy_gradient``).
        log_prob: ``(bs, response_length)`` the sampled tokens' log-probs now, with the gradient
            (``use_policy_gradient``; defaults to ``student_log_probs`` for the estimators).
        rollout_is_weights: ``(bs, response_length)`` rollout-correction weights for the policy loss.
        teacher_topk_ids, student_topk_ids: passed to a top-k loss (``distillation/overlap_ratio``).

    Returns:
        ``(loss, metrics)``: the scalar loss; the registered loss's metrics, ``distillation/loss``
        (the loss's value), ``distillation/loss_min`` / ``distillation/loss_max`` (before the clamp) and, with
        ``use_policy_gradient``, the policy loss's metrics renamed ``actor/x`` -> ``distillation/x``.

    Raises:
        UnknownAlgorithmError: unknown ``loss_mode`` or ``policy_loss_mode``.
        AlgorithmInputError: ``use_policy_gradient`` without ``old_log_prob`` (or, for a top-k
            loss, without ``log_prob``); shapes that do not match.
    """
    cfg = config if config is not None else DistillationLossConfig()
    loss_fn = get_distillation_loss_fn(cfg.loss_mode)
    losses, metrics = loss_fn(
        student_log_probs,
        teacher_log_probs,
        response_mask,
        cfg,
        teacher_topk_ids=teacher_topk_ids,
        student_topk_ids=student_topk_ids,
    )
    metrics.update(compute_distillation_loss_range(losses, response_mask))
    if cfg.loss_max_clamp is not None:
        losses = losses.clamp(min=-cfg.loss_max_clamp, max=cfg.loss_max_clamp)
    counts: Dict[str, Any] = dict(
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    if not cfg.use_policy_gradient:
        loss = agg_loss(losses, response_mask, loss_agg_mode, **counts)
        metrics["distillation/loss"] = float(loss.detach().item())
        return loss, metrics

    if log_prob is None and DISTILLATION_LOSSES.capabilities(cfg.loss_mode).get("use_estimator"):
        log_prob = student_log_probs
    if old_log_prob is None or log_prob is None:
        raise AlgorithmInputError(
            f"distillation_loss: use_policy_gradient=true (loss_mode={cfg.loss_mode}) needs old_log_prob "
            "and log_prob, the sampled tokens' (bs, response_length) log-probs at rollout time and now"
        )
    policy_loss_fn = get_policy_loss_fn(cfg.policy_loss_mode)
    loss, pg_metrics = policy_loss_fn(
        old_log_prob,
        log_prob,
        zero_padding(-losses.detach(), response_mask),
        response_mask,
        loss_agg_mode=loss_agg_mode,
        config=cfg.policy_loss_params(),
        rollout_is_weights=rollout_is_weights,
        **counts,
    )
    metrics.update({f"distillation/{key.split('/', 1)[-1]}": value for key, value in pg_metrics.items()})
    metrics["distillation/loss"] = float(loss.detach().item())
    return loss, metrics


def distillation_ppo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: Optional[torch.Tensor],
    response_mask: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    config: Optional[DistillationLossConfig] = None,
    loss_agg_mode: str = "token-mean",
    policy_loss_mode: str = "vanilla",
    policy_loss_config: Optional[PolicyLossParams] = None,
    student_topk_log_probs: Optional[torch.Tensor] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    student_topk_ids: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The actor's policy loss with on-policy distillation: the task's policy loss and the
    distillation loss, combined as ``distillation.distillation_loss`` says.

    With ``D`` = :func:`distillation_loss` (direct, or a policy loss on ``A_t = -sg(d_t)``)::

        use_task_rewards=true:   L = L_pg(advantages) + distillation_loss_coef * D
        use_task_rewards=false:  L = D                  (the task advantages are not used)

    ``L_pg`` is the task's policy loss ``policy_loss_mode`` (the actor's
    ``policy_loss.loss_mode``) on the task ``advantages`` with ``policy_loss_config``. With
    ``use_policy_gradient`` and the same vanilla loss and clips for both, on-policy (``r_t = 1``,
    no clip active) the gradient equals that of one policy loss on the combined advantage
    ``advantages_t - distillation_loss_coef * d_t``: the task reward plus the weighted per-token
    reverse-KL reward (Thinking Machines, "On-Policy Distillation", 2025; GKD, Agarwal et al. 2024,
    arXiv:2306.13649). The entropy and reference-KL terms stay with the actor.

    Args:
        old_log_prob, log_prob: ``(bs, response_length)`` the sampled tokens' log-probs at rollout
            time and now (``log_prob`` carries the gradient); for the estimators ``log_prob`` is
            also the student's side of ``d_t``.
        advantages: ``(bs, response_length)`` the task advantages; needed with ``use_task_rewards``.
        response_mask: ``(bs, response_length)``.
        teacher_log_probs: the teacher's sampled-token log-probs ``(bs, response_length)`` for the
            estimators, its top-k log-probs ``(bs, response_length, topk)`` for ``forward_kl_topk``.
        config: the ``distillation.distillation_loss`` section; None uses the defaults.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see
            :func:`~hybridrl.algorithms.functional.agg_loss`, for both terms.
        policy_loss_mode, policy_loss_config: the task's policy loss and its ``config=``.
        student_topk_log_probs: ``(bs, response_length, topk)`` the student's log-probs of the
            teacher's top-k ids (top-k losses).
        rollout_is_weights: ``(bs, response_length)`` rollout-correction weights, for both terms.
        teacher_topk_ids, student_topk_ids: for ``distillation/overlap_ratio``.

    Returns:
        ``(loss, metrics)``: the scalar loss; the task loss's ``actor/...`` metrics (with
        ``use_task_rewards``), the distillation metrics of :func:`distillation_loss` and
        ``distillation/loss``, the value of ``D``.

    Raises:
        AlgorithmInputError: ``use_task_rewards`` without ``advantages``; a top-k loss without
            ``student_topk_log_probs``; shapes that do not match.
        UnknownAlgorithmError: an unknown loss name.
    """
    cfg = config if config is not None else DistillationLossConfig()
    if DISTILLATION_LOSSES.capabilities(cfg.loss_mode).get("use_topk"):
        if student_topk_log_probs is None:
            raise AlgorithmInputError(
                f"distillation_ppo_loss: loss_mode={cfg.loss_mode} needs student_topk_log_probs, the student's "
                "(bs, response_length, topk) log-probs of the teacher's top-k ids"
            )
        student_log_probs = student_topk_log_probs
    else:
        student_log_probs = log_prob
    counts: Dict[str, Any] = dict(
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    distill, metrics = distillation_loss(
        student_log_probs,
        teacher_log_probs,
        response_mask,
        cfg,
        loss_agg_mode=loss_agg_mode,
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        rollout_is_weights=rollout_is_weights,
        teacher_topk_ids=teacher_topk_ids,
        student_topk_ids=student_topk_ids,
        **counts,
    )
    if not cfg.use_task_rewards:
        return distill, metrics
    if advantages is None:
        raise AlgorithmInputError(
            "distillation_ppo_loss: distillation_loss.use_task_rewards=true needs the task advantages "
            "(bs, response_length); pass them, or set use_task_rewards=false to train on the teacher alone"
        )
    policy_loss, policy_metrics = get_policy_loss_fn(policy_loss_mode)(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        config=policy_loss_config,
        rollout_is_weights=rollout_is_weights,
        **counts,
    )
    return policy_loss + cfg.distillation_loss_coef * distill, {**policy_metrics, **metrics}
