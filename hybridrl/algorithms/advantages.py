"""Advantage estimators and their registry.

The driver calls every estimator the same way, with keyword arguments::

    fn = get_adv_estimator_fn(config.algorithm.adv_estimator)
    advantages, returns = fn(token_level_rewards=..., response_mask=..., values=..., index=...,
                             gamma=..., lam=..., norm_adv_by_std_in_grpo=..., epsilon=...)

Each estimator takes the arguments it needs and swallows the rest through ``**kwargs``, so a
new estimator only has to be registered with :func:`register_adv_est`.
"""

from typing import Callable, Dict, Sequence, Tuple

import numpy as np
import torch

from .errors import AlgorithmInputError, lookup, register_into
from .functional import masked_whiten

ADV_ESTIMATOR_REGISTRY: Dict[str, Callable] = {}


def register_adv_est(name: str) -> Callable:
    """Decorator: register an advantage estimator under ``name`` (the value of
    ``algorithm.adv_estimator``). The function must accept keyword arguments and ``**kwargs``
    and return ``(advantages, returns)``, both ``(bs, response_length)``."""
    return register_into(ADV_ESTIMATOR_REGISTRY, name, "advantage estimator")


def get_adv_estimator_fn(name: str) -> Callable:
    """Return the estimator registered as ``name``.

    Raises:
        UnknownAlgorithmError: no estimator has that name (the message lists the known ones).
    """
    return lookup(ADV_ESTIMATOR_REGISTRY, name, "advantage estimator", "algorithm.adv_estimator")


def _check_same_shape(name: str, tensor: torch.Tensor, response_mask: torch.Tensor) -> None:
    if tensor is None:
        raise AlgorithmInputError(f"{name} is required by this advantage estimator but is None")
    if tensor.shape != response_mask.shape:
        raise AlgorithmInputError(
            f"{name} has shape {tuple(tensor.shape)} but response_mask has "
            f"{tuple(response_mask.shape)}; both must be (bs, response_length)"
        )


@register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (PPO's estimator).

    Source: "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
    Schulman et al., arXiv 1506.02438.

    Over the valid tokens ``t`` of a response (``response_mask == 1``), right to left::

        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next
        V_next, A_next = V_t, A_t           (0 and 0 after the last valid token)

    Masked tokens *inside* a response (multi-turn observation/tool tokens) are skipped: the
    recursion passes ``V_next`` and ``A_next`` through them unchanged, so the result on the
    valid tokens equals GAE on the response with the masked tokens deleted; rewards and values
    placed on masked tokens are ignored.

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards per token.
        values: ``(bs, response_length)`` critic values ``V_t``.
        response_mask: ``(bs, response_length)`` 1 for tokens the policy generated.
        gamma: discount factor; lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and 0 at masked positions.
        ``returns = A + V`` uses the raw advantages; ``advantages`` are then whitened
        (zero mean, unit variance) over all valid tokens of the batch.

    Raises:
        AlgorithmInputError: shapes differ, or the mask has no valid token.
    """
    _check_same_shape("values", values, response_mask)
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        rewards = token_level_rewards.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last_adv = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(values.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * last_adv
            m = mask[:, t]
            # Masked token: keep the running value and advantage of the next valid token.
            next_value = torch.where(m.bool(), values[:, t], next_value)
            last_adv = torch.where(m.bool(), adv_t, last_adv)
            reversed_adv.append(last_adv)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


def _group_ids(index: Sequence, bs: int) -> torch.Tensor:
    if index is None:
        raise AlgorithmInputError(
            "index is None: this advantage estimator groups responses by prompt and needs the "
            "uid array (non_tensor_batch['uid']) of shape (bs,)"
        )
    index = np.asarray(index, dtype=object).reshape(-1)
    if index.shape[0] != bs:
        raise AlgorithmInputError(
            f"index has {index.shape[0]} entries but the batch has {bs} responses; pass one uid "
            "per response"
        )
    ids: Dict = {}
    return torch.tensor([ids.setdefault(uid, len(ids)) for uid in index], dtype=torch.long)


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the response score normalised within its prompt's group.

    Source: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
    Models", Shao et al., arXiv 2402.03300. ``norm_adv_by_std_in_grpo=False`` is Dr. GRPO
    ("Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783).

    ``score_i = sum_t token_level_rewards[i, t]``; for the group ``g`` of responses sharing
    ``index[i]``: ``A_i = (score_i - mean_g) / (std_g + epsilon)`` with the unbiased
    (``n - 1``) std, or ``A_i = score_i - mean_g`` without std normalisation. A group of one
    response has no baseline: mean 0 and std 1 are used, so its advantage is its score.
    ``A_i`` is broadcast over the response tokens and multiplied by ``response_mask``.

    Args:
        token_level_rewards: ``(bs, response_length)``.
        response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` array of group ids (the prompt uid strings).
        epsilon: added to the std to avoid division by zero.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: ``index`` is missing or has the wrong length.
    """
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1).float()
        bs = scores.shape[0]
        group = _group_ids(index, bs).to(scores.device)
        n_groups = int(group.max().item()) + 1 if bs else 0
        counts = torch.zeros(n_groups, device=scores.device).index_add_(0, group, torch.ones_like(scores))
        mean = torch.zeros(n_groups, device=scores.device).index_add_(0, group, scores) / counts
        sq_dev = (scores - mean[group]) ** 2
        var = torch.zeros(n_groups, device=scores.device).index_add_(0, group, sq_dev)
        std = torch.sqrt(var / (counts - 1).clamp_min(1))
        single = counts == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        adv = scores - mean[group]
        if norm_adv_by_std_in_grpo:
            adv = adv / (std[group] + epsilon)
        advantages = adv.unsqueeze(-1).to(token_level_rewards.dtype) * response_mask.to(token_level_rewards.dtype)
    return advantages, advantages.clone()
