"""Policy losses beyond PPO's ``vanilla``: ``gspo``, ``gpg``, ``clip_cov``, ``kl_cov``, ``geo_mean``
and ``cispo``, registered under verl's names (``actor_rollout_ref.actor.policy_loss.loss_mode``).

All share the signature and metrics of
:func:`~hybridrl.algorithms.policy_loss.vanilla.compute_policy_loss_vanilla`, rollout-correction weights
(``rollout_is_weights``) included. Tensors are
``(bs, response_length)``, log-probs in nats, and ``log_prob`` carries the gradient. Ratios
are ``exp`` of log-ratios clamped to [-20, 20] (verl does this for ``vanilla``; here it applies
to every token-ratio loss, so ``exp`` cannot overflow; it changes nothing for
|log-ratio| <= 20).
"""

from typing import Optional

import torch

from ..functional import Number, agg_loss, masked_mean
from .base import (
    LossOutput,
    apply_rollout_is_weights,
    clipped_surrogate,
    loss_config,
    note_fixed_aggregation,
    pg_metrics,
    register_policy_loss,
    token_log_ratio,
)
from .config import PolicyLossParams


def _ppo_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(-token_log_ratio(log_prob, old_log_prob), response_mask)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
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
    """GSPO: PPO clipping on a sequence-level importance ratio (``loss_mode=gspo``).

    Source: "Group Sequence Policy Optimization", arXiv 2507.18071 (the GSPO-token form).
    With ``|y_i|`` the valid tokens of response ``i`` and ``sg`` the stop-gradient::

        s_i   = exp(mean_t(log_prob - old_log_prob))              (geometric-mean ratio)
        s_i,t = sg[s_i] * pi_t / sg[pi_t]                         (value s_i, gradient s_i * dlog pi_t)
        L_t   = max(-A * s_i,t, -A * clip(s_i,t, 1 - clip_ratio_low, 1 + clip_ratio_high))

    ``log s_i,t`` is clamped at 10 (as verl). The loss is always aggregated as
    ``seq-mean-token-mean`` (as in the paper and verl; ``loss_agg_mode`` is checked and a
    different value is logged once), so micro batches need ``global_batch_size``.

    When to use: long responses and MoE models, where token ratios are noisy. The clip range
    is far smaller than PPO's: the paper uses ``clip_ratio_low=3e-4``, ``clip_ratio_high=4e-4``.

    Returns:
        ``(pg_loss, metrics)``; ``actor/pg_clipfrac`` counts valid tokens whose sequence ratio
        is clipped, ``actor/pg_clipfrac_lower`` is 0 (no dual clip), ``actor/ppo_kl`` as vanilla.
    """
    cfg = loss_config(config)
    note_fixed_aggregation("gspo", loss_agg_mode, "seq-mean-token-mean")
    seq_log_ratio = masked_mean(log_prob - old_log_prob, response_mask, axis=-1)  # (bs,)
    # Value sg[log s_i]; gradient that of log_prob. Adding the detached term last keeps
    # log_prob - log_prob.detach() exactly 0 in floating point.
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    pg_losses, clipped = clipped_surrogate(ratio, advantages, cfg)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, "seq-mean-token-mean", dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    clipfrac = masked_mean(clipped.float(), response_mask)
    return pg_loss, pg_metrics(clipfrac, 0.0, _ppo_kl(log_prob, old_log_prob, response_mask))


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
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
    """GPG: the plain policy-gradient loss ``L_t = -A_t * log_prob_t`` (``loss_mode=gpg``).

    Source: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arXiv 2504.02546. No importance ratio and no clipping, so it is exact only on-policy
    (one optimizer step per rollout batch: ``ppo_epochs=1`` and ``ppo_mini_batch_size`` equal
    to the train batch); ``old_log_prob`` is used only for the ``actor/ppo_kl`` metric.
    Aggregated with :func:`agg_loss` and ``loss_agg_mode``. The paper pairs it with its own
    advantage (``algorithm.adv_estimator=gpg``).

    Returns:
        ``(pg_loss, metrics)``; both clip fractions are 0.
    """
    loss_config(config)  # type check only: GPG has no hyper-parameter
    pg_losses = -advantages * log_prob
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(0.0, 0.0, _ppo_kl(log_prob, old_log_prob, response_mask))


def _token_covariance(log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Centred ``(A - mean A) * (log_prob - mean log_prob)`` per token, means over valid tokens,
    detached: the covariance term that drives the entropy change (arXiv 2505.22617)."""
    log_prob = log_prob.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))


def _flat_mask(indices: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(like.numel(), dtype=torch.bool, device=like.device)
    mask[indices] = True
    return mask.view(like.shape)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
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
    """Clip-Cov: PPO's clipped loss minus the gradient of a few high-covariance tokens
    (``loss_mode=clip_cov``).

    Source: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv 2505.22617. With ``cov_t = (A_t - mean A) * (log_prob_t - mean log_prob)`` over the
    valid tokens of this call, the candidates are the valid tokens not already clipped by PPO
    with ``clip_cov_lb < cov_t < clip_cov_ub``; ``max(1, floor(clip_cov_ratio * n_valid))`` of
    them, drawn at random, contribute 0 (no loss, no gradient; they stay in the token-mean
    denominator). The others get ``max(-A r, -A clip(r, 1 - low, 1 + high))`` (no dual clip).

    The draw uses torch's global CPU generator (``torch.randperm``, as verl), so it follows
    ``torch.manual_seed``. Statistics and selection are per call, that is per micro batch (as
    verl): micro-batch accumulation matches a full-batch pass only when the selection does.

    When to use: to stop the entropy collapse of GRPO-style training (the paper keeps
    ``clip_cov_ratio=2e-4``, ``clip_cov_lb=1``, ``clip_cov_ub=5``).

    Returns:
        ``(pg_loss, metrics)``: the vanilla-style ``actor/pg_clipfrac`` (PPO clip) and
        ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` 0, and ``actor/clip_cov_frac`` (fraction
        of valid tokens whose gradient was removed; verl reports it as ``pg_clipfrac``).
    """
    cfg = loss_config(config)
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    clip_losses, clipped = clipped_surrogate(torch.exp(log_ratio), advantages, cfg)
    valid = response_mask.bool()
    with torch.no_grad():
        cov = _token_covariance(log_prob, advantages, response_mask)
        candidates = valid & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
        index = torch.nonzero(candidates.flatten()).squeeze(-1)
        n_clip = max(int(cfg.clip_cov_ratio * valid.sum().item()), 1)
        if index.numel() > n_clip:
            index = index[torch.randperm(index.numel())[:n_clip].to(index.device)]
        removed = _flat_mask(index, candidates)
    pg_losses = torch.where(removed, torch.zeros_like(clip_losses), clip_losses)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(
        masked_mean(clipped.float(), response_mask),
        0.0,
        masked_mean(-log_ratio, response_mask),
        clip_cov_frac=masked_mean(removed.float(), response_mask),
    )


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
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
    """KL-Cov: the unclipped surrogate plus a ``|log_ratio|`` penalty on the tokens of largest
    covariance (``loss_mode=kl_cov``).

    Source: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv 2505.22617. With ``cov_t`` as in :func:`compute_policy_loss_clip_cov` and ``K`` the
    ``max(1, floor(kl_cov_ratio * n_valid))`` valid tokens of largest ``cov_t``::

        L_t = -A_t * r_t + ppo_kl_coef * |log_prob_t - old_log_prob_t|   if t in K
            = -A_t * r_t                                                 otherwise

    No clipping at all: the penalty is the only trust region. The penalty uses the unclamped
    log-ratio. Selection is per call (per micro batch), as in verl; deterministic.

    When to use: like Clip-Cov, against entropy collapse; the paper reports KL-Cov as the
    stronger of the two (``kl_cov_ratio=2e-4`` for 7B models, ``ppo_kl_coef`` of 0.1 to 1).

    Returns:
        ``(pg_loss, metrics)``: clip fractions 0, ``actor/ppo_kl`` as vanilla, and
        ``actor/kl_cov_frac`` (fraction of valid tokens penalised).
    """
    cfg = loss_config(config)
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    valid = response_mask.bool()
    n_valid = int(valid.sum().item())
    with torch.no_grad():
        cov = _token_covariance(log_prob, advantages, response_mask)
        cov = torch.where(valid, cov, torch.full_like(cov, -torch.inf))  # k <= n_valid: never picked
        k = max(1, int(n_valid * cfg.kl_cov_ratio)) if n_valid else 0
        penalised = _flat_mask(torch.topk(cov.flatten(), k).indices, cov)
    # torch.where (not a product) so a NaN log-prob in padding cannot reach the gradient.
    abs_kl = torch.where(penalised, log_prob - old_log_prob, torch.zeros_like(log_prob)).abs()
    pg_losses = -advantages * torch.exp(log_ratio) + cfg.ppo_kl_coef * abs_kl
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(
        0.0, 0.0, masked_mean(-log_ratio, response_mask), kl_cov_frac=masked_mean(penalised.float(), response_mask)
    )


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
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
    """GMPO: the geometric mean of token ratios, clipped per token in log space
    (``loss_mode=geo_mean``).

    Source: "Geometric-Mean Policy Optimization", arXiv 2507.20673 (verl's form). With
    ``l_t = log_prob_t - old_log_prob_t`` (not clamped, as verl) and ``sgn = sign(A_t)``::

        l'_t = sgn * min(sgn * l_t, sgn * clamp(l_t, -clip_ratio_low, clip_ratio_high))
        L_i  = -mean_t(A_t) * exp(mean_t(l'_t))                       (one loss per sequence)

    that is, for ``A > 0`` only the upper bound clips and for ``A < 0`` only the lower one.
    ``clip_ratio_low/high`` are bounds on the LOG-ratio (GMPO uses 0.4, i.e. ratios in
    ``[e^-0.4, e^0.4]``). Sequence losses are averaged over sequences with valid tokens, or
    summed and divided by ``global_batch_size`` when given; ``loss_agg_mode`` is checked but
    does not apply (logged once). Meant for sequence-level advantages (GRPO's): token
    advantages are averaged per sequence.

    When to use: GRPO-style training that should be less sensitive to outlier token ratios
    than the arithmetic mean (more stable, a wider clip range).

    Returns:
        ``(pg_loss, metrics)``: ``actor/pg_clipfrac`` (valid tokens with ``A > 0`` and
        ``l_t > clip_ratio_high``), ``actor/pg_clipfrac_lower`` (``A < 0`` and
        ``l_t < -clip_ratio_low``), ``actor/ppo_kl`` as vanilla.
    """
    cfg = loss_config(config)
    note_fixed_aggregation("geo_mean", loss_agg_mode, "a mean over sequences")
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -cfg.clip_ratio_low, cfg.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp(masked_mean(pessimistic, response_mask, axis=-1))  # (bs,)
    seq_losses = -masked_mean(advantages, response_mask, axis=-1) * seq_ratio
    if rollout_is_weights is not None:  # one weight per sequence: the tokens' geometric mean (as verl)
        seq_losses = seq_losses * torch.exp(
            masked_mean(torch.log(rollout_is_weights.detach() + 1e-10), response_mask, axis=-1)
        )
    has_tokens = (response_mask.sum(dim=-1) > 0).unsqueeze(-1)
    # One column per sequence: agg_loss's sequence mean (and global_batch_size) applies as is.
    pg_loss = agg_loss(
        seq_losses.unsqueeze(-1), has_tokens, "seq-mean-token-sum", dp_size, global_batch_size=global_batch_size
    )
    clipfrac = masked_mean(((advantages > 0) & (log_ratio > cfg.clip_ratio_high)).float(), response_mask)
    clipfrac_lower = masked_mean(((advantages < 0) & (log_ratio < -cfg.clip_ratio_low)).float(), response_mask)
    return pg_loss, pg_metrics(clipfrac, clipfrac_lower, _ppo_kl(log_prob, old_log_prob, response_mask))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
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
    """CISPO: REINFORCE weighted by a truncated, detached importance ratio (``loss_mode=cispo``).

    Source: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
    arXiv 2506.13585, eq. 4-5::

        L_t = -sg(clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A_t * log_prob_t

    so every token keeps a gradient ``-w_t * A_t`` on its log-prob, however far its ratio
    moved (PPO drops clipped tokens). Aggregated with :func:`agg_loss` and ``loss_agg_mode``.

    When to use: off-policy updates (several mini batches or epochs per rollout) where PPO
    would clip away rare, important tokens. MiniMax-M1 keeps no lower bound (set
    ``clip_ratio_low`` large, e.g. 10) and tunes only ``clip_ratio_high``.

    Returns:
        ``(pg_loss, metrics)``: ``actor/pg_clipfrac`` (valid tokens whose weight was
        truncated), ``actor/pg_clipfrac_lower`` 0, ``actor/ppo_kl`` as vanilla.
    """
    cfg = loss_config(config)
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    pg_losses = -weight * advantages * log_prob
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    clipfrac = masked_mean((weight != ratio).float(), response_mask)
    return pg_loss, pg_metrics(clipfrac, 0.0, masked_mean(-log_ratio, response_mask))
