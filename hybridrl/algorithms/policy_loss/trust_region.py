"""Policy losses with a soft or divergence-based trust region instead of PPO's ratio clip:
``sapo``, ``dppo_tv``, ``dppo_kl`` and ``dro`` (verl's names, ``policy_loss.loss_mode``).

Same signature and metrics as :func:`~hybridrl.algorithms.policy_loss.vanilla.compute_policy_loss_vanilla`.
Tensors are ``(bs, response_length)``, log-probs in nats; ``log_prob`` carries the gradient.
"""

from typing import Optional

import torch

from ..errors import AlgorithmConfigError
from ..functional import Number, agg_loss, masked_mean
from .base import (
    LossOutput,
    apply_rollout_is_weights,
    loss_config,
    note_fixed_aggregation,
    pg_metrics,
    register_policy_loss,
    token_log_ratio,
)
from .config import PolicyLossParams


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> LossOutput:
    """SAPO: a smooth sigmoid gate on the ratio instead of a hard clip (``loss_mode=sapo``).

    Source: "Soft Adaptive Policy Optimization", arXiv 2511.20347. With
    ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and ``tau = tau_pos`` where ``A > 0``,
    else ``tau_neg``::

        f(r) = sigmoid(tau * (r - 1)) * 4 / tau          (f'(1) = 1: the PPO gradient on policy)
        L_t  = -f(r_t) * A_t

    The gradient ``A * f'(r) * r`` fades smoothly as ``r`` leaves 1 rather than dropping to 0 at
    a clip bound; ``tau_neg > tau_pos`` damps negative updates faster. Always aggregated as
    ``seq-mean-token-mean`` (as the paper and verl; another ``loss_agg_mode`` is logged once).

    Returns:
        ``(pg_loss, metrics)``: both clip fractions 0, ``actor/ppo_kl`` as vanilla.
    """
    cfg = loss_config(config)
    note_fixed_aggregation("sapo", loss_agg_mode, "seq-mean-token-mean")
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    tau = torch.where(
        advantages > 0, torch.full_like(advantages, cfg.tau_pos), torch.full_like(advantages, cfg.tau_neg)
    )
    gates = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    pg_losses = apply_rollout_is_weights(-gates * advantages, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, "seq-mean-token-mean", dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(0.0, 0.0, masked_mean(-log_ratio, response_mask))


def _dppo_loss(
    divergence_ok: torch.Tensor,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode,
    cfg: PolicyLossParams,
    rollout_is_weights,
    *global_counts,
) -> LossOutput:
    """The DPPO surrogate given the trust-region mask ``divergence_ok`` (bool, per token);
    ``global_counts`` are :func:`agg_loss`'s ``dp_size, batch_num_tokens, global_batch_size, loss_scale_factor``."""
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=cfg.clip_ratio_c).detach()
    keep = divergence_ok.detach().to(log_prob.dtype)
    pg_losses = apply_rollout_is_weights(-advantages * weight * log_prob * keep, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, *global_counts)
    outside = masked_mean(1.0 - keep, response_mask)
    truncated = masked_mean((ratio > cfg.clip_ratio_c).to(keep.dtype) * keep, response_mask)
    return pg_loss, pg_metrics(outside, truncated, masked_mean(-log_ratio, response_mask))


_DPPO_DOC = """Divergence PPO ({variant}): a trust region on the divergence of the token's
    probability, not on the ratio (``loss_mode={name}``).

    Source: "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879
    (the Binary approximation: the sampled token against all others). With ``p`` / ``p_old``
    the token's probabilities, ``r = p / p_old`` and ``c = clip_ratio_c``::

        L_t = -A_t * sg(min(r_t, c)) * log p_t * M_t

    where ``M_t`` (no gradient) drops a token that already moved too far in the advantage's
    direction: {mask}. ``clip_ratio_low`` / ``clip_ratio_high`` are divergence bounds here,
    not ratio bounds. Aggregated with ``loss_agg_mode``.

    Returns:
        ``(pg_loss, metrics)``: ``actor/pg_clipfrac`` (valid tokens outside the trust region),
        ``actor/pg_clipfrac_lower`` (kept tokens whose ratio weight was truncated at ``c``),
        ``actor/ppo_kl`` as vanilla.
    """


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
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
    cfg = loss_config(config)
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)  # the binary total variation, signed
    ok = torch.where(advantages > 0, moved <= cfg.clip_ratio_high, moved >= -cfg.clip_ratio_low)
    return _dppo_loss(
        ok,
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        cfg,
        rollout_is_weights,
        dp_size,
        batch_num_tokens,
        global_batch_size,
        loss_scale_factor,
    )


compute_policy_loss_dppo_tv.__doc__ = _DPPO_DOC.format(
    variant="Binary-TV",
    name="dppo_tv",
    mask="for ``A > 0`` it needs ``p - p_old <= clip_ratio_high``, otherwise ``p - p_old >= -clip_ratio_low``",
)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
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
    cfg = loss_config(config)
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    ok = torch.where(
        advantages > 0,
        (binary_kl <= cfg.clip_ratio_high) | (p <= p_old),
        (binary_kl <= cfg.clip_ratio_low) | (p >= p_old),
    )
    return _dppo_loss(
        ok,
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        cfg,
        rollout_is_weights,
        dp_size,
        batch_num_tokens,
        global_batch_size,
        loss_scale_factor,
    )


compute_policy_loss_dppo_kl.__doc__ = _DPPO_DOC.format(
    variant="Binary-KL",
    name="dppo_kl",
    mask=(
        "with ``KL_b = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))``, a token "
        "moving towards the advantage's direction needs ``KL_b <= clip_ratio_high`` (``A > 0``) or "
        "``KL_b <= clip_ratio_low`` (otherwise); moving the other way is always kept"
    ),
)


@register_policy_loss("dro")
def compute_policy_loss_dro(
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
    """DRO: policy gradient with a quadratic log-ratio penalty (``loss_mode=dro``).

    Source: "Offline Regularised Reinforcement Learning for Large Language Models Alignment"
    (Direct Reward Optimisation), arXiv 2405.19107, as verl's ``dro``::

        L_t = -(A_t * log_prob_t - dro_beta / 2 * (log_prob_t - old_log_prob_t)^2)

    The penalty pulls the policy back towards ``old_log_prob`` in proportion to how far it moved
    (a soft trust region with no clip). Aggregated with ``loss_agg_mode``.

    Raises:
        AlgorithmConfigError: ``policy_loss.dro_beta`` is not set (it has no default).

    Returns:
        ``(pg_loss, metrics)``: both clip fractions 0, ``actor/ppo_kl`` (unclamped log-ratio).
    """
    cfg = loss_config(config)
    if cfg.dro_beta is None or not cfg.dro_beta > 0:
        raise AlgorithmConfigError(
            f"actor_rollout_ref.actor.policy_loss.dro_beta={cfg.dro_beta} must be > 0 for "
            "loss_mode=dro (the weight of its quadratic log-ratio penalty); set it, e.g. 0.1"
        )
    log_ratio = log_prob - old_log_prob
    pg_losses = apply_rollout_is_weights(
        -(log_prob * advantages - 0.5 * cfg.dro_beta * log_ratio.square()), rollout_is_weights
    )
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(0.0, 0.0, masked_mean(-log_ratio, response_mask))
