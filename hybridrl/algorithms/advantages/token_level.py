"""Token-level advantage estimators: GAE (PPO), REINFORCE++ and ReMax."""

from typing import Tuple

import torch

from ..errors import AlgorithmInputError
from ..functional import masked_whiten
from .base import advantage_dtype, check_input_finite, check_same_shape, describe_shape, register_adv_est


@register_adv_est("gae", needs_values=True)
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
    placed on masked tokens are ignored. Needs no groups (works with ``rollout.n = 1``).

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
        AlgorithmInputError: ``values`` is None, shapes differ, a tensor holds NaN/inf, or the
            mask has no valid token.
    """
    check_same_shape(
        "values",
        values,
        response_mask,
        "the gae estimator needs the critic's values (bs, response_length); run "
        "critic_wg.compute_values before compute_advantage",
    )
    check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    with torch.no_grad():
        values = values.to(advantage_dtype(values))
        mask = response_mask.to(values.dtype)
        rewards = token_level_rewards.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last_adv = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(values.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * last_adv
            m = mask[:, t].bool()
            # Masked token: keep the running value and advantage of the next valid token.
            next_value = torch.where(m, values[:, t], next_value)
            last_adv = torch.where(m, adv_t, last_adv)
            reversed_adv.append(last_adv)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ advantage: discounted return-to-go, whitened over the batch.

    Source: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    Hu, arXiv 2501.03262.

    Over the valid tokens of each response, right to left, ``G_t = r_t + gamma * G_next``
    (``G_next = 0`` after the last valid token); ``returns = G`` and ``advantages`` are ``G``
    whitened (zero mean, unit variance) over all valid tokens of the batch. No critic, no
    groups (works with ``rollout.n = 1``); the KL penalty usually sits in the token rewards.

    Masked tokens: trailing padding never contributes (as in verl, which resets the running
    return there). Masked tokens *inside* a response (multi-turn tool/observation tokens) are
    skipped as in GAE: their rewards are ignored and the running return passes through them
    undiscounted, so the valid tokens get the return of the response with those tokens deleted
    (verl instead resets the return at them, which cuts earlier turns off from the outcome).

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards per token.
        response_mask: ``(bs, response_length)`` 1 for tokens the policy generated.
        gamma: discount factor (``algorithm.gamma``; the driver passes it). verl reads it from its
            ``config`` argument (``AlgoConfig``); here it is a plain value, and a ``config``
            keyword is swallowed by ``**kwargs`` unread.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and 0 at masked positions.

    Raises:
        AlgorithmInputError: shapes differ, rewards hold NaN/inf, or the mask has no valid token.
    """
    check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    gamma = float(gamma)
    with torch.no_grad():
        rewards = token_level_rewards.to(advantage_dtype(token_level_rewards))
        mask = response_mask.to(rewards.dtype)
        running = torch.zeros_like(rewards[:, 0])
        reversed_returns = []
        for t in reversed(range(rewards.shape[1])):
            running = torch.where(mask[:, t].bool(), rewards[:, t] + gamma * running, running)
            reversed_returns.append(running)
        returns = torch.stack(reversed_returns[::-1], dim=1) * mask
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("remax", needs_reward_baselines=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """ReMax advantage: return-to-go minus the reward of the greedy response.

    Source: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", Li et al., arXiv 2310.10505.

    ``returns[i, t] = sum_{s >= t} token_level_rewards[i, s] * response_mask[i, s]`` and
    ``advantages[i, t] = returns[i, t] - reward_baselines[i]`` on valid tokens. The baseline is
    the reward of the greedy (``do_sample=False``) response to the same prompt, so ReMax needs
    no group of samples (works with ``rollout.n = 1``) but one extra greedy generation per prompt.

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards per token.
        reward_baselines: ``(bs,)`` greedy-response reward of each response's prompt.
        response_mask: ``(bs, response_length)`` 1 for tokens the policy generated.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and 0 at masked positions.

    Raises:
        AlgorithmInputError: ``reward_baselines`` is None or not ``(bs,)``, shapes differ, or a
            tensor holds NaN/inf.
    """
    check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    bs = response_mask.shape[0]
    if reward_baselines is None:
        raise AlgorithmInputError(
            "reward_baselines is None: remax needs the reward of the greedy response to each "
            "prompt, shape (bs,); the trainer must generate the greedy baseline (do_sample=False), "
            "score it and store batch['reward_baselines'] before compute_advantage"
        )
    if not isinstance(reward_baselines, torch.Tensor) or tuple(reward_baselines.shape) != (bs,):
        raise AlgorithmInputError(
            f"reward_baselines has shape {describe_shape(reward_baselines)}; it must be ({bs},): one "
            "greedy reward per response"
        )
    check_input_finite("reward_baselines", reward_baselines, "check the reward of the greedy responses")
    with torch.no_grad():
        rewards = token_level_rewards.to(advantage_dtype(token_level_rewards))
        mask = response_mask.to(rewards.dtype)
        returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = (returns - reward_baselines.to(rewards.dtype).unsqueeze(-1)) * mask
    return advantages, returns
