"""The ``algorithm`` config section, typed (verl's ``AlgoConfig``).

Built once from the YAML with :func:`algo_config`; the defaults are those of the packaged
``ppo_trainer.yaml`` (a test checks they agree and that every key there has a field). Rules on a
single field, or on fields of this section only, live in ``__post_init__``; the checks against
other sections and against the registries stay in the run's start-up check
(:mod:`hybridrl.trainer.ppo.config_check`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hybridrl.config.rules import plain
from hybridrl.config.typed import refused, to_dataclass
from hybridrl.errors import ConfigError

from .errors import AlgorithmConfigError
from .kl import get_kl_controller
from .rollout_corr import RolloutCorrectionConfig

__all__ = ["AlgoConfig", "KLControlConfig", "FilterGroupsConfig", "PFPPOConfig", "algo_config"]

SECTION = "algorithm"
KL_CONTROLLERS = ("fixed", "adaptive")


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise AlgorithmConfigError(f"{SECTION}.{name}={value} must be in [0, 1] (1.0 is usual for LLM rewards)")


@dataclass
class KLControlConfig:
    """``algorithm.kl_ctrl``: the coefficient of the KL penalty in the reward.

    ``type``: ``fixed`` (``kl_coef`` throughout) or ``adaptive`` (PPO for RLHF's controller,
    steering the KL towards ``target_kl`` over ``horizon`` samples).
    """

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1

    def __post_init__(self):
        if self.type not in KL_CONTROLLERS:
            raise AlgorithmConfigError(
                f"{SECTION}.kl_ctrl.type={self.type!r} is not one of {', '.join(KL_CONTROLLERS)}; set one of them"
            )

    def controller(self):
        """The controller (``FixedKLController`` or ``AdaptiveKLController``).

        Raises:
            AlgorithmConfigError: an unknown ``type``, or ``adaptive`` without a positive
                ``target_kl`` / ``horizon``.
        """
        return get_kl_controller(self.type, self.kl_coef, self.target_kl, self.horizon)


@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO's dynamic sampling (arXiv:2503.14476).

    ``metric``: what must vary within a prompt group for it to be kept (None: ``acc``);
    ``max_num_gen_batches``: stop with an error after this many generation batches (<= 0: no limit);
    ``timeout_s`` (hybridrl's): stop with an error when a training batch is not full this many
    seconds after its first generation batch (<= 0: no limit).
    """

    enable: bool = False
    metric: Optional[str] = None
    max_num_gen_batches: int = 0
    timeout_s: float = 3600.0


@dataclass
class PFPPOConfig:
    """``algorithm.pf_ppo`` (PF-PPO's reweighting; refused by this build's start-up check)."""

    reweight_method: str = "pow"
    weight_pow: float = 2.0


@dataclass
class AlgoConfig:
    """``algorithm``: the advantage estimator and the in-reward KL penalty (docs/algorithms.md).

    Raises:
        AlgorithmConfigError: ``gamma`` or ``lam`` outside [0, 1]; an unknown ``kl_ctrl.type``, or a
            KL controller that cannot be built while ``use_kl_in_reward``.
        UnknownAlgorithmError, AlgorithmConfigError: from ``rollout_correction`` (its own rules).
    """

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    gdpo_reward_keys: Optional[List[str]] = None
    gdpo_reward_weights: Optional[List[float]] = None
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    use_pf_ppo: bool = refused(False, "preference-feedback PPO reweighting")
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)

    def __post_init__(self):
        _check_unit_interval("gamma", self.gamma)
        _check_unit_interval("lam", self.lam)
        if self.use_kl_in_reward:
            self.kl_ctrl.controller()
        if self.filter_groups.enable and self.filter_groups.metric == "seq_final_reward" and self.use_kl_in_reward:
            raise ConfigError(
                "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: "
                "groups are filtered before the KL penalty exists here; use seq_reward"
            )
        if self.adv_estimator == "gdpo":
            _check_gdpo(plain(self.gdpo_reward_keys), plain(self.gdpo_reward_weights))


def _check_gdpo(keys, weights) -> None:
    """``adv_estimator=gdpo`` names its reward components (and at most one weight each).

    Raises:
        ConfigError: no keys, or a weight list of another length.
    """
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys, a list of the keys "
            f"your compute_score returns in its dict (got {keys!r}), e.g. "
            "\"['format_reward','accuracy_reward']\""
        )
    if weights is not None and (not isinstance(weights, list) or len(weights) != len(keys)):
        raise ConfigError(
            f"algorithm.gdpo_reward_weights={weights!r} must be a list with one number per "
            f"gdpo_reward_keys entry ({len(keys)}), or null"
        )


def algo_config(config) -> AlgoConfig:
    """The run's ``algorithm`` section (of a ``ppo_trainer`` config) as an :class:`AlgoConfig`.

    Raises:
        ConfigError: a key without a field, or a value of the wrong type.
        AlgorithmConfigError, UnknownAlgorithmError: a rule of the section (see :class:`AlgoConfig`).
    """
    return to_dataclass(AlgoConfig, config.get("algorithm"), SECTION)
