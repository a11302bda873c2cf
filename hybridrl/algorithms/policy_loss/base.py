"""The policy-loss registry, :class:`PolicyLossConfig` and the helpers the losses share (ratios,
clipping, weights, metrics). The loss aggregation, :func:`~hybridrl.algorithms.functional.agg_loss`,
is shared with the critic and lives with the other masked statistics."""

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from hybridrl.registry import Registry

from ..errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from ..functional import LOSS_AGG_MODES, Number, unknown_agg_mode
from ..rollout_corr import RolloutCorrectionConfig

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


# Keys of the ``actor_rollout_ref.actor.policy_loss`` section that PolicyLossConfig holds
# (``loss_mode`` is not one: it selects the function, see :func:`get_policy_loss_fn`).
POLICY_LOSS_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")

_ACTOR = "actor_rollout_ref.actor"


@dataclass
class PolicyLossConfig:
    """Hyper-parameters of the policy losses.

    From ``actor_rollout_ref.actor.*``: ``clip_ratio_low`` / ``clip_ratio_high`` default to
    ``clip_ratio``; the ratio is clipped to ``[1 - clip_ratio_low, 1 + clip_ratio_high]``
    (``geo_mean`` reads them as log-ratio bounds). ``clip_ratio_c`` is the dual-clip bound for
    negative advantages and must be > 1.

    From ``actor_rollout_ref.actor.policy_loss.*`` (verl's names and defaults):
    ``clip_cov_ratio`` (fraction of valid tokens Clip-Cov may detach, in (0, 1]),
    ``clip_cov_lb`` < ``clip_cov_ub`` (covariance band of the Clip-Cov candidates),
    ``kl_cov_ratio`` (fraction of valid tokens KL-Cov penalises, in (0, 1]) and
    ``ppo_kl_coef`` (>= 0, weight of KL-Cov's ``|log_ratio|`` penalty) and ``dro_beta`` (> 0,
    DRO's quadratic penalty; required by ``loss_mode=dro``). ``tau_pos`` / ``tau_neg`` (actor
    keys, > 0) are SAPO's gate temperatures for positive / other advantages.

    ``rollout_correction``: ``algorithm.rollout_correction`` for the ``bypass_mode`` loss, which
    computes its weights and rejection from the current policy (None elsewhere).

    Raises:
        AlgorithmConfigError: a value that is not a number or is out of range; the message
            names the full config key.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    dro_beta: Optional[float] = None
    rollout_correction: Optional[RolloutCorrectionConfig] = None  # read by ``bypass_mode``

    def __post_init__(self):
        if self.clip_ratio_low is None:
            self.clip_ratio_low = self.clip_ratio
        if self.clip_ratio_high is None:
            self.clip_ratio_high = self.clip_ratio
        for field in dataclasses.fields(self):
            if field.name != "rollout_correction" and not (field.name == "dro_beta" and self.dro_beta is None):
                setattr(self, field.name, _as_float(field.name, getattr(self, field.name)))
        for key in ("tau_pos", "tau_neg"):
            if not getattr(self, key) > 0:
                raise AlgorithmConfigError(
                    f"{_full_key(key)}={getattr(self, key)} must be > 0 (SAPO's gate "
                    "temperature; the paper uses tau_pos=1.0, tau_neg=1.05)"
                )
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) < 0:
                raise AlgorithmConfigError(
                    f"{_full_key(key)}={getattr(self, key)} is negative; use a value >= 0 (e.g. 0.2)"
                )
        if not self.clip_ratio_c > 1.0:
            raise AlgorithmConfigError(
                f"{_full_key('clip_ratio_c')}={self.clip_ratio_c} must be > 1 (dual-clip "
                "lower bound for negative advantages); use e.g. 3.0"
            )
        for key in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise AlgorithmConfigError(
                    f"{_full_key(key)}={getattr(self, key)} must be in (0, 1] (a fraction of the valid "
                    "tokens); use e.g. 0.0002"
                )
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise AlgorithmConfigError(
                f"{_full_key('clip_cov_lb')}={self.clip_cov_lb} must be < {_full_key('clip_cov_ub')}="
                f"{self.clip_cov_ub} (the covariance band of Clip-Cov); use e.g. 1.0 and 5.0"
            )
        if self.ppo_kl_coef < 0:
            raise AlgorithmConfigError(
                f"{_full_key('ppo_kl_coef')}={self.ppo_kl_coef} is negative; use a value >= 0 (e.g. 0.1)"
            )


def _full_key(key: str) -> str:
    section = f"{_ACTOR}.policy_loss" if key in POLICY_LOSS_KEYS else _ACTOR
    return f"{section}.{key}"


def _as_float(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AlgorithmConfigError(f"{_full_key(key)}={value!r} is not a number; set a number (see ppo_trainer.yaml)")
    return float(value)


def loss_config(config: Optional[PolicyLossConfig]) -> PolicyLossConfig:
    """``config``, or the defaults when it is None (shared by the policy losses).

    Raises:
        AlgorithmConfigError: ``config`` is not a :class:`PolicyLossConfig`.
    """
    if config is None:
        return PolicyLossConfig()
    if not isinstance(config, PolicyLossConfig):
        raise AlgorithmConfigError(
            f"policy loss config must be a PolicyLossConfig, got {type(config).__name__}; "
            "build one with PolicyLossConfig(clip_ratio=..., clip_ratio_c=...)"
        )
    return config


def token_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``log_prob - old_log_prob`` clamped to [-20, 20] (as verl) so ``exp`` cannot overflow."""
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, cfg: PolicyLossConfig
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


def pg_metrics(clipfrac: Number, clipfrac_lower: Number, ppo_kl: Number, **extra: Number) -> Dict[str, float]:
    """The metrics dict every policy loss returns: python floats under ``actor/<name>``."""
    values = {"pg_clipfrac": clipfrac, "pg_clipfrac_lower": clipfrac_lower, "ppo_kl": ppo_kl, **extra}
    return {f"actor/{k}": float(v.detach().item() if torch.is_tensor(v) else v) for k, v in values.items()}


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
