"""Policy-gradient losses, their registry, and the loss aggregation shared with the critic.

A policy loss is called as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=PolicyLossConfig(...), global_num_tokens=None, global_batch_size=None)
    -> (pg_loss, metrics)

``pg_loss`` is a scalar tensor with gradient; ``metrics`` maps ``actor/pg_clipfrac``,
``actor/pg_clipfrac_lower`` and ``actor/ppo_kl`` to python floats.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from .errors import AlgorithmConfigError, UnknownAlgorithmError, lookup, register_into
from .functional import masked_mean, masked_sum

POLICY_LOSS_REGISTRY: Dict[str, Callable] = {}

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

Number = Union[int, float, torch.Tensor]


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under ``name`` (the value of
    ``actor_rollout_ref.actor.policy_loss.loss_mode``)."""
    return register_into(POLICY_LOSS_REGISTRY, name, "policy loss")


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss registered as ``name``.

    Raises:
        UnknownAlgorithmError: no loss has that name (the message lists the known ones).
    """
    return lookup(POLICY_LOSS_REGISTRY, name, "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")


@dataclass
class PolicyLossConfig:
    """Clipping hyper-parameters of the PPO-style losses (``actor_rollout_ref.actor.*``).

    ``clip_ratio_low`` / ``clip_ratio_high`` default to ``clip_ratio``; the ratio is clipped to
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]``. ``clip_ratio_c`` is the dual-clip bound for
    negative advantages and must be > 1.

    Raises:
        AlgorithmConfigError: a negative clip ratio or ``clip_ratio_c <= 1``.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0

    def __post_init__(self):
        if self.clip_ratio_low is None:
            self.clip_ratio_low = self.clip_ratio
        if self.clip_ratio_high is None:
            self.clip_ratio_high = self.clip_ratio
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) < 0:
                raise AlgorithmConfigError(
                    f"actor_rollout_ref.actor.{key}={getattr(self, key)} is negative; use a value >= 0 (e.g. 0.2)"
                )
        if not self.clip_ratio_c > 1.0:
            raise AlgorithmConfigError(
                f"actor_rollout_ref.actor.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip "
                "lower bound for negative advantages); use e.g. 3.0"
            )


def _check_positive(key: str, value: Optional[Number]) -> None:
    if value is not None and not float(value) > 0:
        raise AlgorithmConfigError(
            f"agg_loss: {key}={float(value)} must be > 0; pass the mini-batch's count or None"
        )


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``(bs, response_length)`` into a scalar.

    Modes (``actor_rollout_ref.actor.loss_agg_mode``):
      * ``token-mean``: sum over valid tokens / number of valid tokens.
      * ``seq-mean-token-sum``: per-sequence token sum, then mean over sequences.
      * ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences.
      * ``seq-mean-token-sum-norm``: per-sequence token sum / ``loss_mat.shape[-1]`` (a
        constant, as in Dr. GRPO, arXiv 2503.20783), then mean over sequences.

    Local means count only sequences with at least one valid token. Global normalisation for
    gradient accumulation: with ``global_num_tokens`` (valid tokens of the whole mini-batch)
    ``token-mean`` divides by it instead; with ``global_batch_size`` (sequences of the whole
    mini-batch) the ``seq-mean-*`` modes divide the sequence sum by it. Then the SUM of the
    micro-batch losses equals the loss of the whole mini-batch, and so do the gradients
    (``seq-mean-token-sum-norm`` needs the same padded length in every micro batch).

    Raises:
        UnknownAlgorithmError: unknown ``loss_agg_mode``.
        AlgorithmConfigError: a global count that is not > 0.
    """
    if loss_agg_mode == "token-mean":
        _check_positive("global_num_tokens", global_num_tokens)
        if global_num_tokens is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / global_num_tokens
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, loss_mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / loss_mat.shape[-1]
    else:
        raise UnknownAlgorithmError(
            f"unknown loss_agg_mode {loss_agg_mode!r} (config key "
            f"`actor_rollout_ref.actor.loss_agg_mode`); use one of: {', '.join(LOSS_AGG_MODES)}"
        )
    _check_positive("global_batch_size", global_batch_size)
    if global_batch_size is not None:
        return seq_losses.sum() / global_batch_size
    has_tokens = loss_mask.to(loss_mat.device).sum(dim=-1) > 0
    return masked_mean(seq_losses, has_tokens)


def _clip_config(config: Optional[PolicyLossConfig]) -> PolicyLossConfig:
    if config is None:
        return PolicyLossConfig()
    if not isinstance(config, PolicyLossConfig):
        raise AlgorithmConfigError(
            f"policy loss config must be a PolicyLossConfig, got {type(config).__name__}; "
            "build one with PolicyLossConfig(clip_ratio=..., clip_ratio_c=...)"
        )
    return config


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossConfig] = None,
    global_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """PPO clipped surrogate loss with clip-higher and dual-clip.

    Sources: PPO, "Proximal Policy Optimization Algorithms", arXiv 1707.06347; asymmetric
    clip-higher from DAPO, arXiv 2503.14476; dual-clip from "Mastering Complex Control in MOBA
    Games with Deep Reinforcement Learning", arXiv 1912.09729.

    With ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and advantage ``A``::

        L_clip = max(-A * r, -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L      = min(L_clip, -A * clip_ratio_c)   if A < 0   (dual clip bounds the loss)
               = L_clip                          otherwise

    then aggregated with :func:`agg_loss`.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``(bs, response_length)``;
            log-probs in nats, ``log_prob`` carries the gradient.
        loss_agg_mode, global_num_tokens, global_batch_size: see :func:`agg_loss`.
        config: clip ratios; ``None`` uses ``PolicyLossConfig()``.

    Returns:
        ``(pg_loss, metrics)``: scalar loss; ``actor/pg_clipfrac`` (fraction of valid tokens
        where the ratio clip is active), ``actor/pg_clipfrac_lower`` (where the dual clip is
        active), ``actor/ppo_kl`` (masked mean of the clamped ``old_log_prob - log_prob``).
    """
    cfg = _clip_config(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clip_losses = torch.maximum(losses_unclipped, losses_clipped)
    clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)

    losses_dual = -advantages * cfg.clip_ratio_c
    negative = advantages < 0
    dual_active = torch.gt(clip_losses, losses_dual) & negative
    clipfrac_lower = masked_mean(dual_active.float(), response_mask)
    pg_losses = torch.where(negative, torch.minimum(clip_losses, losses_dual), clip_losses)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_num_tokens, global_batch_size)
    metrics = {
        "actor/pg_clipfrac": clipfrac.item(),
        "actor/pg_clipfrac_lower": clipfrac_lower.item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
    }
    return pg_loss, metrics
