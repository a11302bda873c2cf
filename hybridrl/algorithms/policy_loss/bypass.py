"""Rollout correction's bypass mode: the rollout log-probs stand in for ``old_log_probs``, so the
batch needs no old-log-prob pass (two policies, ``pi_rollout`` and ``pi_theta``, instead of three).
Registered as ``loss_mode=bypass_mode``; ``algorithm.rollout_correction.loss_type`` picks the loss.

Source: "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch" (Liu et al., 2025, https://richardli.xyz/rl-collapse), verl's ``bypass_mode``.
"""

from typing import Optional

import torch

from ..errors import AlgorithmConfigError
from ..functional import Number, agg_loss, masked_mean
from ..rollout_corr import compute_rollout_correction_and_rejection_mask, rejection_settings
from .base import LossOutput, apply_rollout_is_weights, loss_config, pg_metrics, register_policy_loss
from .config import PolicyLossParams
from .vanilla import compute_policy_loss_vanilla


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> LossOutput:
    """REINFORCE with explicit importance weights: ``L_t = -sg(w_t) * A_t * log_prob_t``.

    Source: Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning" (1992); importance-weighted as in verl's bypass mode. No ratio and no
    clip: the (truncated) weights ``w = pi_theta / pi_rollout`` carry the off-policy correction;
    without weights it is the plain on-policy gradient.

    Args:
        rollout_log_prob, log_prob, advantages, response_mask: ``(bs, response_length)``;
            ``rollout_log_prob`` only feeds the ``actor/ppo_kl`` metric.
        rollout_is_weights: ``(bs, response_length)`` or None.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see :func:`agg_loss`.

    Returns:
        ``(pg_loss, metrics)``: both clip fractions 0; ``actor/ppo_kl`` is the masked mean of
        ``rollout_log_prob - log_prob``.
    """
    loss_config(config)  # type check only
    pg_losses = apply_rollout_is_weights(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(0.0, 0.0, masked_mean(rollout_log_prob - log_prob.detach(), response_mask))


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> LossOutput:
    """The bypass-mode loss (``algorithm.rollout_correction.bypass_mode=true``).

    ``old_log_prob`` holds the rollout log-probs. From the current ``log_prob`` and them, the
    weights and the rejection mask of ``config.rollout_correction`` are computed per micro batch
    (no gradient), then:

    * ``loss_type=ppo_clip``: :func:`compute_policy_loss_vanilla` with ``r = pi_theta / pi_rollout``;
      the clipped ratio already is the importance correction, so no weights are multiplied in
      (that would count it twice). Rejection still applies.
    * ``loss_type=reinforce``: :func:`compute_policy_loss_reinforce` with the weights.

    ``rollout_is_weights`` passed in are ignored (they are recomputed here from the current
    policy). The metrics add ``rollout_corr/*`` (weights, rejection, off-policy gap of
    ``pi_theta`` against ``pi_rollout``).

    Raises:
        AlgorithmConfigError: ``config.rollout_correction`` is missing.
    """
    cfg = loss_config(config)
    corr = cfg.rollout_correction
    if corr is None:
        raise AlgorithmConfigError(
            "policy_loss.loss_mode=bypass_mode needs algorithm.rollout_correction; set "
            "algorithm.rollout_correction.bypass_mode=true instead of the loss mode"
        )
    with torch.no_grad():
        weights, mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(),
            old_log_prob,
            response_mask,
            corr.rollout_is,
            corr.rollout_is_threshold,
            corr.rollout_is_batch_normalize,
            *rejection_settings(corr),
        )
    if corr.loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob,
            log_prob,
            advantages,
            mask,
            loss_agg_mode,
            cfg,
            weights,
            dp_size,
            batch_num_tokens,
            global_batch_size,
            loss_scale_factor,
        )
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            advantages,
            mask,
            loss_agg_mode,
            cfg,
            None,
            dp_size,
            batch_num_tokens,
            global_batch_size,
            loss_scale_factor,
        )
    return pg_loss, {**metrics, **corr_metrics}
