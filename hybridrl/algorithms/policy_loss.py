"""Policy-gradient losses: the registry, their config, the loss aggregation shared with the
critic, and the PPO loss (``vanilla``). The other losses live in :mod:`.policy_losses` and are
registered when this module is imported: ``gspo``, ``gpg``, ``clip_cov``, ``kl_cov``,
``geo_mean``, ``cispo`` (verl's names, selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``).

A policy loss is called as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=PolicyLossConfig(...), rollout_is_weights=None, dp_size=1, batch_num_tokens=None,
       global_batch_size=None, loss_scale_factor=None)
    -> (pg_loss, metrics)

``rollout_is_weights`` ``(bs, response_length)`` are rollout correction's importance weights
(:mod:`.rollout_corr`): every loss multiplies its per-token losses by them before aggregating.

``pg_loss`` is a scalar tensor with gradient; ``metrics`` maps ``actor/pg_clipfrac``,
``actor/pg_clipfrac_lower`` and ``actor/ppo_kl`` (plus loss-specific keys) to python floats.
"""

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from hybridrl.registry import Registry

from .errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from .functional import masked_mean, masked_sum
from .rollout_corr import RolloutCorrectionConfig

logger = logging.getLogger(__name__)

POLICY_LOSSES = Registry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode", error=UnknownAlgorithmError,
                         hint="register your own with @register_policy_loss")
POLICY_LOSS_REGISTRY = POLICY_LOSSES.table  # verl's name: the live name -> function dict

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

Number = Union[int, float, torch.Tensor]


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
                raise AlgorithmConfigError(f"{_full_key(key)}={getattr(self, key)} must be > 0 (SAPO's gate "
                                           "temperature; the paper uses tau_pos=1.0, tau_neg=1.05)")
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


def _unknown_agg_mode(loss_agg_mode: str) -> UnknownAlgorithmError:
    return UnknownAlgorithmError(
        f"unknown loss_agg_mode {loss_agg_mode!r} (config key "
        f"`{_ACTOR}.loss_agg_mode`); use one of: {', '.join(LOSS_AGG_MODES)}"
    )


def _check_positive(key: str, value: Optional[Number]) -> None:
    if value is not None and not float(value) > 0:
        raise AlgorithmConfigError(
            f"agg_loss: {key}={float(value)} must be > 0; pass the global batch's count or None"
        )


def _global_count(key: str, value: Optional[Number], local: torch.Tensor, dp_size: int) -> Number:
    """``value`` (a count over all data-parallel ranks), or the local count on one rank."""
    _check_positive(key, value)
    if value is not None:
        return value
    if dp_size > 1:
        raise AlgorithmConfigError(f"agg_loss: dp_size={dp_size} needs the global {key} (the count over every "
                                   "rank's share of the mini batch); pass it")
    return local


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``(bs, response_length)`` into a scalar (verl 0.9's arguments).

    Modes (``actor_rollout_ref.actor.loss_agg_mode``), with ``m`` the mask:
      * ``token-mean``: ``sum(m * l) / batch_num_tokens``.
      * ``token-sum``: ``sum(m * l)`` (no normalisation; the loss scales with the tokens).
      * ``seq-mean-token-sum``: per-sequence token sum, summed over sequences / ``global_batch_size``.
      * ``seq-mean-token-mean``: per-sequence token mean, the same sequence mean.
      * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum`` / ``loss_scale_factor`` (default
        ``loss_mat.shape[-1]``; Dr. GRPO, arXiv 2503.20783, uses a constant).

    Sequences without a valid token never count. For gradient accumulation and data parallelism
    pass the counts of the whole mini batch over all ranks (``batch_num_tokens``: valid tokens;
    ``global_batch_size``: sequences) and ``dp_size``: every rank's loss is multiplied by
    ``dp_size`` because FSDP averages gradients over the ranks. Then the SUM of the micro-batch
    losses, averaged over ranks, equals the loss of one pass over the mini batch. Without counts
    they are this call's own (allowed only with ``dp_size == 1``).

    Raises:
        UnknownAlgorithmError: unknown ``loss_agg_mode``.
        AlgorithmConfigError: a count that is not > 0, or ``dp_size > 1`` without the count it needs.
    """
    if loss_agg_mode == "token-mean":
        tokens = _global_count("batch_num_tokens", batch_num_tokens, loss_mask.sum(), dp_size)
        return masked_sum(loss_mat, loss_mask) / tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, loss_mask, axis=-1)
    else:
        raise _unknown_agg_mode(loss_agg_mode)
    has_tokens = loss_mask.to(loss_mat.device).sum(dim=-1) > 0
    sequences = _global_count("global_batch_size", global_batch_size, has_tokens.sum(), dp_size)
    loss = torch.where(has_tokens, seq_losses, torch.zeros_like(seq_losses)).sum() / sequences * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        _check_positive("loss_scale_factor", loss_scale_factor)
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
    return loss


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
        raise AlgorithmInputError(f"rollout_is_weights {tuple(rollout_is_weights.shape)} must have the per-token "
                                  f"losses' shape {tuple(pg_losses.shape)}")
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
        raise _unknown_agg_mode(loss_agg_mode)
    if loss_agg_mode != used and (loss_mode, loss_agg_mode) not in _LOGGED_FIXED_AGG:
        _LOGGED_FIXED_AGG.add((loss_mode, loss_agg_mode))
        logger.warning(
            "policy loss %r aggregates as %s; %s.loss_agg_mode=%s applies only to the entropy and KL terms",
            loss_mode, used, _ACTOR, loss_agg_mode,
        )


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossConfig] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """PPO clipped surrogate loss with clip-higher and dual-clip (``policy_loss.loss_mode=vanilla``).

    Sources: PPO, "Proximal Policy Optimization Algorithms", arXiv 1707.06347; asymmetric
    clip-higher from DAPO, arXiv 2503.14476; dual-clip from "Mastering Complex Control in MOBA
    Games with Deep Reinforcement Learning", arXiv 1912.09729.

    With ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and advantage ``A``::

        L_clip = max(-A * r, -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L      = min(L_clip, -A * clip_ratio_c)   if A < 0   (dual clip bounds the loss)
               = L_clip                          otherwise

    then aggregated with :func:`agg_loss`. The default choice for PPO, GRPO, DAPO.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``(bs, response_length)``;
            log-probs in nats, ``log_prob`` carries the gradient.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see :func:`agg_loss`.
        config: clip ratios; ``None`` uses ``PolicyLossConfig()``.
        rollout_is_weights: ``(bs, response_length)`` rollout-correction weights, or None.

    Returns:
        ``(pg_loss, metrics)``: scalar loss; ``actor/pg_clipfrac`` (fraction of valid tokens
        where the ratio clip is active), ``actor/pg_clipfrac_lower`` (where the dual clip is
        active), ``actor/ppo_kl`` (masked mean of the clamped ``old_log_prob - log_prob``).
    """
    cfg = loss_config(config)
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    clip_losses, clipped = clipped_surrogate(torch.exp(log_ratio), advantages, cfg)
    clipfrac = masked_mean(clipped.float(), response_mask)

    losses_dual = -advantages * cfg.clip_ratio_c
    negative = advantages < 0
    clipfrac_lower = masked_mean((torch.gt(clip_losses, losses_dual) & negative).float(), response_mask)
    pg_losses = torch.where(negative, torch.minimum(clip_losses, losses_dual), clip_losses)

    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens,
                       global_batch_size, loss_scale_factor)
    return pg_loss, pg_metrics(clipfrac, clipfrac_lower, masked_mean(-log_ratio, response_mask))


# The other losses register themselves on import; kept last so they can import the above.
from . import bypass_loss, policy_losses, trust_region_losses  # noqa: E402,F401  isort: skip
