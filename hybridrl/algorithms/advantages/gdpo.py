"""GDPO: group normalisation per reward component, then a weighted sum (``adv_estimator=gdpo``).

Registered on import of :mod:`hybridrl.algorithms.advantages`.
"""

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import AlgorithmConfigError, AlgorithmInputError
from ..functional import masked_whiten
from .base import register_adv_est
from .group import compute_grpo_outcome_advantage

__all__ = ["compute_gdpo_outcome_advantage"]


def _component_scores(non_tensor_batch: dict, keys: Sequence[str], response_mask: torch.Tensor) -> list[torch.Tensor]:
    """Each component's per-response score on the response's last valid token, ``(bs, R)``."""
    missing = [key for key in keys if key not in non_tensor_batch]
    if missing:
        raise AlgorithmInputError(
            f"algorithm.gdpo_reward_keys {missing} are not in the reward function's output (it gave: "
            f"{sorted(k for k in non_tensor_batch if k != 'uid')}); return them in the dict of compute_score"
        )
    last = ((response_mask.cumsum(-1) == response_mask.sum(-1, keepdim=True)) & (response_mask > 0)).float()
    scores = []
    for key in keys:
        values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
        scores.append(last * values.unsqueeze(-1))
    return scores


@register_adv_est("gdpo", needs_group=True)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    gdpo_reward_keys: Optional[Sequence[str]] = None,
    gdpo_reward_weights: Optional[Sequence[float]] = None,
    non_tensor_batch: Optional[dict] = None,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GDPO: each reward component is normalised within its prompt group, then they are summed.

    Source: "GDPO: Group reward-Decoupled Normalization Policy Optimization", arXiv 2601.05242.
    With components ``r_k`` (``algorithm.gdpo_reward_keys``: keys of the reward function's dict)
    and weights ``w_k`` (``algorithm.gdpo_reward_weights``, default 1 each)::

        A_k = (r_k - mean_g(r_k)) / (std_g(r_k) + epsilon)       (GRPO per component)
        A   = whiten_batch(sum_k w_k A_k)

    Summing first (GRPO) lets a large-variance component drown the others; normalising each
    first gives every component the same scale inside a group. Without keys (or without the
    batch's reward outputs) it is GRPO on ``token_level_rewards`` then whitened.

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon, norm_adv_by_std_in_grpo: as in :func:`compute_grpo_outcome_advantage`.
        gdpo_reward_keys: ``algorithm.gdpo_reward_keys``, the components' keys (None or empty:
            ``token_level_rewards`` is the one component).
        gdpo_reward_weights: ``algorithm.gdpo_reward_weights``, one per component (None: 1 each).
        non_tensor_batch: the batch's non-tensor columns, holding each component per response.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmConfigError: the weights do not match the keys.
        AlgorithmInputError: a key is missing from the reward function's output (names it).
    """
    keys = list(gdpo_reward_keys or [])
    weights = gdpo_reward_weights
    if keys and non_tensor_batch is not None:
        components = _component_scores(non_tensor_batch, keys, response_mask)
    else:
        components = [token_level_rewards]
    weights = list(weights) if weights is not None else [1.0] * len(components)
    if len(weights) != len(components):
        raise AlgorithmConfigError(
            f"algorithm.gdpo_reward_weights has {len(weights)} values for "
            f"{len(components)} gdpo_reward_keys; give one weight per key or null"
        )
    total = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    for weight, scores in zip(weights, components):
        advantage, _ = compute_grpo_outcome_advantage(scores, response_mask, index, epsilon, norm_adv_by_std_in_grpo)
        total = total + float(weight) * advantage
    with torch.no_grad():
        advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages.clone()
