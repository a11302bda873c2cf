"""The policy-loss registry and the helpers the losses share (ratios, clipping, weights, metrics);
their config classes are in :mod:`.config`. The loss aggregation,
:func:`~hybridrl.algorithms.functional.agg_loss`, is shared with the critic and lives with the
other masked statistics."""

import logging
from typing import Callable, Dict, Optional, Tuple

import torch

from hybridrl.registry import Registry

from ..errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from ..functional import LOSS_AGG_MODES, Number, unknown_agg_mode
from .config import PolicyLossConfig, PolicyLossParams

# What every policy loss returns: the scalar loss and its metrics (:func:`pg_metrics`).
LossOutput = Tuple[torch.Tensor, Dict[str, Number]]  # tensors from pg_metrics; floats from the rollout correction

logger = logging.getLogger(__name__)

POLICY_LOSSES = Registry(
    "policy loss",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    error=UnknownAlgorithmError,
    hint="register your own with @register_policy_loss",
)
POLICY_LOSS_REGISTRY = POLICY_LOSSES.table  # verl's name: the live name -> function dict


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under ``name`` (the value of
    ``actor_rollout_ref.actor.policy_loss.loss_mode``).

    Raises:
        UnknownAlgorithmError (a ValueError): another function is already registered under ``name``.
    """
    return POLICY_LOSSES.register(name)


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss registered as ``name``.

    Raises:
        UnknownAlgorithmError: no loss has that name (the message lists the known ones).
    """
    return POLICY_LOSSES.get(name)


_ACTOR = "actor_rollout_ref.actor"


def loss_config(config: Optional[PolicyLossParams]) -> PolicyLossParams:
    """``config``, or the defaults when it is None (shared by the policy losses).

    Raises:
        AlgorithmConfigError: ``config`` is not a :class:`~.config.PolicyLossParams` (the
            ``policy_loss`` section alone, a :class:`~.config.PolicyLossConfig`, lacks the clip ratios).
    """
    if config is None:
        return PolicyLossParams()
    if not isinstance(config, PolicyLossParams):
        alone = isinstance(config, PolicyLossConfig)
        section = f" (the {_ACTOR}.policy_loss section alone)" if alone else ""
        raise AlgorithmConfigError(
            f"policy loss config must be a PolicyLossParams, got {type(config).__name__}{section}; "
            "build one with PolicyLossParams(clip_ratio_low=..., clip_ratio_high=..., clip_ratio_c=...)"
        )
    return config


def token_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``log_prob - old_log_prob`` clamped to [-20, 20] (as verl) so ``exp`` cannot overflow."""
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, cfg: PolicyLossParams
) -> Tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate ``max(-A * r, -A * clip(r, 1 - low, 1 + high))`` per token.

    Returns ``(losses, clipped)``, both ``(bs, response_length)``; ``clipped`` (bool) marks the
    tokens where the clipped term is the larger one: the clip is active and no gradient flows.
    """
    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    return torch.maximum(losses_unclipped, losses_clipped), torch.gt(losses_clipped, losses_unclipped)


def apply_rollout_is_weights(pg_losses: torch.Tensor, rollout_is_weights: Optional[torch.Tensor]) -> torch.Tensor:
    """``pg_losses * rollout_is_weights`` (detached: they change the measure, not the objective),
    or ``pg_losses`` when there are none.

    Raises:
        AlgorithmInputError: the weights' shape is not the losses' ``(bs, response_length)``.
    """
    if rollout_is_weights is None:
        return pg_losses
    if rollout_is_weights.shape != pg_losses.shape:
        raise AlgorithmInputError(
            f"rollout_is_weights {tuple(rollout_is_weights.shape)} must have the per-token "
            f"losses' shape {tuple(pg_losses.shape)}"
        )
    return pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)


def pg_metrics(clipfrac: Number, clipfrac_lower: Number, ppo_kl: Number, **extra: Number) -> Dict[str, Number]:
    """The metrics dict every policy loss returns: detached 0-dim tensors under ``actor/<name>``,
    left on their device so that a caller reads them when it wants (the actor: once per mini
    batch, not one host sync per micro batch); ``float(value)`` is the metric. A python number
    becomes an fp64 tensor (exact) on the device of the first tensor given, the CPU if none."""
    values = {"pg_clipfrac": clipfrac, "pg_clipfrac_lower": clipfrac_lower, "ppo_kl": ppo_kl, **extra}
    device = next((v.device for v in values.values() if torch.is_tensor(v)), torch.device("cpu"))
    return {
        f"actor/{k}": v.detach().reshape(()) if torch.is_tensor(v) else _number(v, device) for k, v in values.items()
    }


def _number(value, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim fp64 tensor on ``device``: a fill kernel, no host-to-device copy."""
    return torch.full((), float(value), dtype=torch.float64, device=device)


_LOGGED_FIXED_AGG = set()


def note_fixed_aggregation(loss_mode: str, loss_agg_mode: str, used: str) -> None:
    """Check ``loss_agg_mode`` and say once per process that ``loss_mode`` aggregates its own way.

    Raises:
        UnknownAlgorithmError: unknown ``loss_agg_mode`` (it still drives the entropy/KL terms).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown_agg_mode(loss_agg_mode)
    if loss_agg_mode != used and (loss_mode, loss_agg_mode) not in _LOGGED_FIXED_AGG:
        _LOGGED_FIXED_AGG.add((loss_mode, loss_agg_mode))
        logger.warning(
            "policy loss %r aggregates as %s; %s.loss_agg_mode=%s applies only to the entropy and KL terms",
            loss_mode,
            used,
            _ACTOR,
            loss_agg_mode,
        )
