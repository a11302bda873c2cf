"""The policy losses' hyper-parameters, each field and each range rule defined once.

* :class:`PolicyLossConfig`: the ``actor_rollout_ref.actor.policy_loss`` section (verl's class of
  that name): ``loss_mode``, the knobs of the losses that have them and ``rollout_correction``.
* :class:`ActorLossKnobs`: the loss keys that sit on the ``actor_rollout_ref.actor`` section itself
  (``clip_ratio*``, ``tau_pos`` / ``tau_neg``); the actor section's dataclass
  (:class:`hybridrl.workers.config.ActorConfig`) extends it.
* :class:`PolicyLossParams`: both together, flat: what every policy loss reads as ``config=``
  (``config.clip_ratio_low``, ``config.clip_cov_ratio``, ``config.rollout_correction``, ...).

Every rule raises :class:`~hybridrl.algorithms.errors.AlgorithmConfigError` naming the full
config key (the start-up check turns it into a ``ConfigError`` line).
"""

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..errors import AlgorithmConfigError
from ..rollout_corr import RolloutCorrectionConfig

__all__ = ["PolicyLossConfig", "ActorLossKnobs", "PolicyLossParams", "POLICY_LOSS_KEYS"]

ACTOR = "actor_rollout_ref.actor"
SECTION = f"{ACTOR}.policy_loss"


def _as_float(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AlgorithmConfigError(f"{key}={value!r} is not a number; set a number (see ppo_trainer.yaml)")
    return float(value)


def _floats(config, prefix: str, names) -> None:
    """Each field of ``names`` that is set, checked to be a number and stored as a float."""
    for name in names:
        value = getattr(config, name)
        if value is not None:
            setattr(config, name, _as_float(f"{prefix}.{name}", value))


@dataclass
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss`` (verl's ``PolicyLossConfig``): which loss, and the
    knobs of the losses that have them (verl's names and defaults).

    Attributes:
        loss_mode: a name registered with ``@register_policy_loss`` (``vanilla``, ``gspo``, ...).
        clip_cov_ratio: Clip-Cov: fraction of the valid tokens whose gradient may be detached, in (0, 1].
        clip_cov_lb, clip_cov_ub: Clip-Cov: candidates have a covariance in (lb, ub); lb < ub.
        kl_cov_ratio: KL-Cov: fraction of the valid tokens (largest covariance) penalised, in (0, 1].
        ppo_kl_coef: KL-Cov: weight (>= 0) of the ``|log_ratio|`` penalty.
        dro_beta: DRO: weight (> 0) of its quadratic log-ratio penalty; no default, required by
            ``loss_mode=dro``.
        rollout_correction: a copy of ``algorithm.rollout_correction``, filled in by the trainer
            (the actor workers see only ``actor_rollout_ref``); read by the ``bypass_mode`` loss.

    Raises:
        AlgorithmConfigError: a knob that is not a number or is out of range, or ``loss_mode=dro``
            without ``dro_beta``; the message names the full config key.
    """

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Optional[float] = None
    rollout_correction: Optional[RolloutCorrectionConfig] = None

    def __post_init__(self):
        _floats(self, SECTION, POLICY_LOSS_KEYS)
        for key in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise AlgorithmConfigError(
                    f"{SECTION}.{key}={getattr(self, key)} must be in (0, 1] (a fraction of the valid "
                    "tokens); use e.g. 0.0002"
                )
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise AlgorithmConfigError(
                f"{SECTION}.clip_cov_lb={self.clip_cov_lb} must be < {SECTION}.clip_cov_ub="
                f"{self.clip_cov_ub} (the covariance band of Clip-Cov); use e.g. 1.0 and 5.0"
            )
        if self.ppo_kl_coef < 0:
            raise AlgorithmConfigError(
                f"{SECTION}.ppo_kl_coef={self.ppo_kl_coef} is negative; use a value >= 0 (e.g. 0.1)"
            )
        if self.loss_mode == "dro" and self.dro_beta is None:
            raise AlgorithmConfigError(
                f"{SECTION}.loss_mode=dro needs policy_loss.dro_beta "
                "(> 0, the weight of its quadratic log-ratio penalty); set it, e.g. 0.1"
            )


# The numeric knobs of PolicyLossConfig (``loss_mode`` selects the function, see
# :func:`~hybridrl.algorithms.policy_loss.get_policy_loss_fn`; ``rollout_correction`` is a section).
POLICY_LOSS_KEYS = tuple(
    f.name for f in dataclasses.fields(PolicyLossConfig) if f.name not in ("loss_mode", "rollout_correction")
)


@dataclass
class ActorLossKnobs:
    """The policy-loss keys of ``actor_rollout_ref.actor`` itself (verl's places and defaults).

    Attributes:
        clip_ratio: the PPO clip, used where ``clip_ratio_low`` / ``clip_ratio_high`` are null.
        clip_ratio_low, clip_ratio_high: the ratio is clipped to ``[1 - low, 1 + high]``
            (``geo_mean`` reads them as log-ratio bounds); high > low is DAPO's clip-higher.
        clip_ratio_c: the dual-clip bound for negative advantages (arXiv:1912.09729), > 1.
        tau_pos, tau_neg: SAPO's gate temperatures for positive / other advantages, > 0.

    Raises:
        AlgorithmConfigError: a value that is not a number or is out of range (clip ratios > 0,
            ``clip_ratio_c`` > 1, temperatures > 0); the message names the full config key.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = 0.2
    clip_ratio_high: Optional[float] = 0.2
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self):
        names = [f.name for f in dataclasses.fields(ActorLossKnobs)]
        _floats(self, ACTOR, names)
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise AlgorithmConfigError(f"{ACTOR}.{key}={value} must be a number > 0 (the PPO clip; 0.2 is usual)")
        if not self.clip_ratio_c > 1.0:
            raise AlgorithmConfigError(
                f"{ACTOR}.clip_ratio_c={self.clip_ratio_c} must be > 1 (the dual-clip lower bound for "
                "negative advantages); use e.g. 3.0"
            )
        for key in ("tau_pos", "tau_neg"):
            if not getattr(self, key) > 0:
                raise AlgorithmConfigError(
                    f"{ACTOR}.{key}={getattr(self, key)} must be > 0 (SAPO's gate "
                    "temperature; the paper uses tau_pos=1.0, tau_neg=1.05)"
                )


@dataclass
class PolicyLossParams(ActorLossKnobs, PolicyLossConfig):
    """What a policy loss reads as ``config=``: the ``policy_loss`` section's fields and the
    actor's loss keys, flat (``config.clip_ratio_low``, ``config.clip_cov_ratio``, ...). The actor
    builds it from its section (:func:`hybridrl.workers.actor.build_policy_loss_config`); tests
    and direct callers build it by hand.

    A ``clip_ratio_low`` / ``clip_ratio_high`` of None becomes ``clip_ratio``; like the YAML (and
    verl), both default to 0.2 whatever ``clip_ratio`` is, so ``PolicyLossParams(clip_ratio=0.3)``
    clips to [0.8, 1.2]: pass ``clip_ratio_low=None, clip_ratio_high=None`` to follow it.

    Raises:
        AlgorithmConfigError: a rule of :class:`PolicyLossConfig` or :class:`ActorLossKnobs`.
    """

    def __post_init__(self):
        if self.clip_ratio_low is None:
            self.clip_ratio_low = self.clip_ratio
        if self.clip_ratio_high is None:
            self.clip_ratio_high = self.clip_ratio
        ActorLossKnobs.__post_init__(self)
        PolicyLossConfig.__post_init__(self)
