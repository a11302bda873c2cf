"""The optimal token baseline: a per-step baseline within each prompt group, weighted by how much
gradient variance each trajectory has accumulated (``optimal_token_baseline`` and its multi-turn
name ``tir_optimal_token_baseline``).

Registered on import of :mod:`hybridrl.algorithms.advantages`.
"""

from typing import Optional, Sequence, Tuple

import torch

from ..errors import AlgorithmInputError
from .base import group_ids, register_adv_est

__all__ = ["compute_optimal_token_baseline_advantage", "compute_multi_turn_optimal_token_baseline_advantage"]


def _compact(values: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor, length: int) -> torch.Tensor:
    """``values`` of the valid tokens moved to columns ``0..n_i-1`` of a ``(bs, length)`` tensor."""
    out = values.new_zeros(values.shape[0], length)
    rows = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(rank)
    out[rows[mask], rank[mask]] = values[mask]
    return out


@register_adv_est("optimal_token_baseline", needs_group=True)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    old_log_probs: Optional[torch.Tensor] = None,
    sum_pi_squared: Optional[torch.Tensor] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline (OTB): ``A_t = G_t - B_t`` with a baseline per step of a group.

    Source: "Optimal Token Baseline" (Richard Li, 2025, https://richardli.xyz/optimal-token-baseline),
    verl's ``optimal_token_baseline``: the variance-minimising baseline (Greensmith, Bartlett and
    Baxter, "Variance Reduction Techniques for Gradient Estimates in Reinforcement Learning", JMLR
    2004) with the squared score norm estimated from forward probabilities. For the
    ``t``-th generated token of each response, with ``pi_t`` its probability and
    ``sum_pi^2`` the collision probability of its distribution (``sum_pi_squared``)::

        ||s_t||^2 ~ 1 - 2 pi_t + sum_pi^2                 (squared norm of d log pi / d logits)
        W_t       = sum_{j<=t} ||s_j||^2 [* rho_j^2]      (accumulated, rollout-IS weighted if given)
        G_t       = sum_{j>=t} r_j                        (reward to go)
        B_t       = sum_i G_t,i W_t,i / sum_i W_t,i       over the group's responses that reach step t
        A_t       = G_t - B_t

    Steps count generated tokens only (observation tokens of multi-turn responses are skipped),
    so one function serves both registered names. A group of one has no baseline (``A = G``).
    ``handle_zero_tail``: the part of the single longest response beyond the second longest has
    nothing to compare with, so its baseline is 0 there.

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        old_log_probs: ``(bs, response_length)`` log-probs of the sampling policy (nats).
        sum_pi_squared: ``(bs, response_length)`` from the old-log-prob pass
            (``actor_rollout_ref.actor.calculate_sum_pi_squared=true``).
        rollout_is_weights: ``(bs, response_length)`` rollout-correction weights, or None.

    Returns:
        ``(advantages, returns)``: ``A_t`` (0 on masked positions) and ``G_t``.

    Raises:
        AlgorithmInputError: ``old_log_probs`` or ``sum_pi_squared`` is missing.
    """
    if old_log_probs is None or sum_pi_squared is None:
        raise AlgorithmInputError(
            "the optimal token baseline needs old_log_probs and sum_pi_squared from the old-log-prob pass; "
            "set actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    with torch.no_grad():
        mask = response_mask.bool()
        maskf = mask.to(torch.float32)
        returns = (token_level_rewards * maskf).flip(-1).cumsum(-1).flip(-1)
        w = 1 - 2 * torch.exp(old_log_probs.float()) + sum_pi_squared.float()
        if rollout_is_weights is not None:
            w = w * rollout_is_weights.float().square()
        w_cum = (w * maskf).cumsum(-1)
        rank = (maskf.cumsum(-1) - 1).clamp_min(0).long()  # step number of each generated token
        lengths = maskf.sum(-1).long()
        steps = int(lengths.max()) if lengths.numel() else 0
        w_steps, g_steps = _compact(w_cum, mask, rank, steps), _compact(returns, mask, rank, steps)
        reach = torch.arange(steps, device=mask.device)[None, :] < lengths[:, None]
        baseline = torch.zeros_like(g_steps)
        group = group_ids(index, mask.shape[0]).to(mask.device)
        for g in group.unique():
            rows = (group == g).nonzero(as_tuple=True)[0]
            if rows.numel() < 2:
                continue
            wg, reach_g = w_steps[rows] * reach[rows], reach[rows]
            baseline[rows] = ((g_steps[rows] * wg).sum(0) / (wg.sum(0) + epsilon)) * reach_g
            if handle_zero_tail:
                ordered = lengths[rows].sort().values
                longest = (lengths[rows] == ordered[-1]).nonzero(as_tuple=True)[0]
                if longest.numel() == 1 and ordered[-1] > ordered[-2]:
                    baseline[rows[longest[0]], int(ordered[-2]) :] = 0.0
        rows_all = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(rank)
        b_tokens = torch.zeros_like(returns)
        b_tokens[mask] = baseline[rows_all[mask], rank[mask]]
        advantages = (returns - b_tokens) * maskf
    return advantages, returns


# verl registers the multi-turn form (steps counted over generated tokens only) under its own
# name; counting that way is what the function above does for every batch.
register_adv_est("tir_optimal_token_baseline", needs_group=True)(compute_optimal_token_baseline_advantage)
compute_multi_turn_optimal_token_baseline_advantage = compute_optimal_token_baseline_advantage
