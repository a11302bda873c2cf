"""Advantage estimators and their registry.

The driver calls every estimator the same way, with keyword arguments::

    fn = get_adv_estimator_fn(config.algorithm.adv_estimator)
    advantages, returns = fn(token_level_rewards=..., response_mask=..., values=..., index=...,
                             reward_baselines=..., gamma=..., lam=...,
                             norm_adv_by_std_in_grpo=..., epsilon=..., config=...)

Each estimator takes the arguments it needs and swallows the rest through ``**kwargs``, so a
new estimator only has to be registered with :func:`register_adv_est`. All of them return
``(advantages, returns)`` of shape ``(bs, response_length)``, zero on masked positions, computed
under ``torch.no_grad``. ``config`` is the ``algorithm`` config section (or None), read only for
estimator-specific knobs from ``config`` (a mapping, or a typed config read by attribute).

This module holds the registry, the shared input checks and the token-level estimators (GAE,
REINFORCE++, ReMax); the group-based outcome estimators (GRPO, RLOO, OPO, GPG, Pass@k,
REINFORCE++-baseline) live in :mod:`hybridrl.algorithms.group_advantages`, imported at the end
of this module so that importing either registers all of them.
"""

from enum import Enum
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from hybridrl.registry import Registry

from .errors import AlgorithmInputError, UnknownAlgorithmError
from .functional import masked_whiten

ADV_ESTIMATORS = Registry("advantage estimator", "algorithm.adv_estimator", error=UnknownAlgorithmError,
                          hint="register your own with @register_adv_est")
ADV_ESTIMATOR_REGISTRY = ADV_ESTIMATORS.table  # verl's name: the live name -> function dict

# Names of registered estimators that compare the responses to one prompt with each other, so
# they need ``actor_rollout_ref.rollout.n >= 2`` (the ``needs_group`` capability; a live view).
ADV_ESTIMATOR_NEEDS_GROUP = ADV_ESTIMATORS.having("needs_group")

# The built-in group estimators. ReMax is not one: its baseline is a separate greedy response.
GROUP_ESTIMATORS: frozenset = frozenset(
    {"grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"}
)


def register_adv_est(name: "str | Enum", needs_group: bool = False) -> Callable:
    """Decorator: register an advantage estimator under ``name`` (a value of
    ``algorithm.adv_estimator``; an ``Enum`` member such as verl's ``AdvantageEstimator.GRPO``
    stands for its value).

    The function must accept keyword arguments and ``**kwargs`` and return
    ``(advantages, returns)``, both ``(bs, response_length)``. ``needs_group=True`` declares
    that it needs several responses per prompt (a capability, seen in ``ADV_ESTIMATOR_NEEDS_GROUP``,
    which the config check uses to reject ``rollout.n < 2``).

    Raises:
        UnknownAlgorithmError (a ValueError): another function is already registered under ``name``.
    """
    return ADV_ESTIMATORS.register(name, needs_group=needs_group)


def get_adv_estimator_fn(name: "str | Enum") -> Callable:
    """Return the estimator registered as ``name`` (or an ``Enum`` member's value).

    Raises:
        UnknownAlgorithmError: no estimator has that name (the message lists the known ones and
            suggests the closest).
    """
    return ADV_ESTIMATORS.get(name)


# ----------------------------------------------------------------------------- shared helpers
def _describe(x: Any) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"


def _check_mask(response_mask: torch.Tensor) -> None:
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        raise AlgorithmInputError(
            f"response_mask is {_describe(response_mask)}; it must be a 2-D tensor "
            "(bs, response_length) of 0/1"
        )


def _check_finite(name: str, tensor: torch.Tensor, fix: str) -> None:
    bad = int((~torch.isfinite(tensor)).sum().item()) if tensor.is_floating_point() else 0
    if bad:
        raise AlgorithmInputError(f"{name} has NaN/inf at {bad} positions; {fix}")


def _check_same_shape(name: str, tensor: Optional[torch.Tensor], response_mask: torch.Tensor,
                      missing: str = "this advantage estimator needs it") -> None:
    """``tensor`` must be a finite ``(bs, response_length)`` tensor like ``response_mask``."""
    _check_mask(response_mask)
    if tensor is None:
        raise AlgorithmInputError(f"{name} is None: {missing}")
    if not isinstance(tensor, torch.Tensor) or tensor.shape != response_mask.shape:
        raise AlgorithmInputError(
            f"{name} has shape {_describe(tensor)} but response_mask has {tuple(response_mask.shape)}; "
            "both must be (bs, response_length)"
        )
    _check_finite(name, tensor, "check the reward function and the KL penalty that produce it"
                  if name == "token_level_rewards" else f"check what produced {name}")


def _float_dtype(tensor: torch.Tensor) -> torch.dtype:
    # At least fp32: bf16 sums and std are too coarse for advantages.
    return torch.promote_types(tensor.dtype, torch.float32)


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Checked ``(bs,)`` sequence scores ``sum_t token_level_rewards[:, t]`` in fp32 or wider."""
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    return token_level_rewards.sum(dim=-1).to(_float_dtype(token_level_rewards))


def _knob(value: Any, config: Any, key: str, default: Any) -> Any:
    """An explicit argument wins; else the config's ``key`` (a mapping such as a DictConfig, or a
    typed config read by attribute, as verl's ``AlgoConfig``; None: no config); else ``default``."""
    if value is not None:
        return value
    if config is not None:
        found = config.get(key, None) if hasattr(config, "get") else getattr(config, key, None)
        if found is not None:
            return found
    return default


def _group_ids(index: Sequence, bs: int) -> torch.Tensor:
    """``(bs,)`` long tensor numbering the distinct uids of ``index`` 0.. in first-seen order.

    Raises:
        AlgorithmInputError: ``index`` is None or does not have ``bs`` entries.
    """
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


# ----------------------------------------------------------------------------- estimators
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
    _check_same_shape("values", values, response_mask,
                      "the gae estimator needs the critic's values (bs, response_length); run "
                      "critic_wg.compute_values before compute_advantage")
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    with torch.no_grad():
        values = values.to(_float_dtype(values))
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
    config: Any = None,
    gamma: Optional[float] = None,
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
        config: the ``algorithm`` section; ``gamma`` is read from it when not passed.
        gamma: discount factor; default ``config.gamma``, else 1.0.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and 0 at masked positions.

    Raises:
        AlgorithmInputError: shapes differ, rewards hold NaN/inf, or the mask has no valid token.
    """
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    gamma = float(_knob(gamma, config, "gamma", 1.0))
    with torch.no_grad():
        rewards = token_level_rewards.to(_float_dtype(token_level_rewards))
        mask = response_mask.to(rewards.dtype)
        running = torch.zeros_like(rewards[:, 0])
        reversed_returns = []
        for t in reversed(range(rewards.shape[1])):
            running = torch.where(mask[:, t].bool(), rewards[:, t] + gamma * running, running)
            reversed_returns.append(running)
        returns = torch.stack(reversed_returns[::-1], dim=1) * mask
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
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
    _check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    bs = response_mask.shape[0]
    if reward_baselines is None:
        raise AlgorithmInputError(
            "reward_baselines is None: remax needs the reward of the greedy response to each "
            "prompt, shape (bs,); the trainer must generate the greedy baseline (do_sample=False), "
            "score it and store batch['reward_baselines'] before compute_advantage"
        )
    if not isinstance(reward_baselines, torch.Tensor) or tuple(reward_baselines.shape) != (bs,):
        raise AlgorithmInputError(
            f"reward_baselines has shape {_describe(reward_baselines)}; it must be ({bs},): one "
            "greedy reward per response"
        )
    _check_finite("reward_baselines", reward_baselines, "check the reward of the greedy responses")
    with torch.no_grad():
        rewards = token_level_rewards.to(_float_dtype(token_level_rewards))
        mask = response_mask.to(rewards.dtype)
        returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = (returns - reward_baselines.to(rewards.dtype).unsqueeze(-1)) * mask
    return advantages, returns


# Registers the group-based outcome estimators; last, because that module imports this one.
from . import group_advantages as _group_advantages  # noqa: E402,F401
from . import gdpo as _gdpo  # noqa: E402,F401
from . import token_baseline as _token_baseline  # noqa: E402,F401
