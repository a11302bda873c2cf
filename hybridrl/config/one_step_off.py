"""Start-up checks of ``trainer.one_step_off_policy`` (docs/async.md).

One-step-off-policy training generates batch t+1 while the actor trains on batch t, with the
weights from before update t. That needs an engine holding its own copy of the weights, and it
refuses the features whose meaning the schedule would change silently.
"""

from __future__ import annotations

from hybridrl.config.access import _get, _plain
from hybridrl.config.errors import ConfigError
from hybridrl.config.key_tables import ROLLOUT

KEY = "trainer.one_step_off_policy"


def check_one_step_off(config) -> list[str]:
    """Checks ``trainer.one_step_off_policy`` and what it runs with.

    Returns:
        list[str]: a note when nothing corrects for the samples' age (no rollout correction).

    Raises:
        ConfigError: not a bool; an engine that generates with the actor's own module (``hf``,
            and the engines that fall back to it); DAPO's dynamic sampling; ReMax.
    """
    value = _get(config, KEY, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{KEY}={value!r} must be true or false")
    if not value:
        return []
    name = _get(config, f"{ROLLOUT}.name")
    if name != "vllm":
        raise ConfigError(
            f"{KEY}=true with {ROLLOUT}.name={name}: the next batch is generated while the actor trains, so the "
            f"engine needs its own copy of the weights, and the HF engine generates with the actor's module; set "
            f"{ROLLOUT}.name=vllm (sync or async mode; pip install -e '.[vllm]') or {KEY}=false")
    if _get(config, "algorithm.filter_groups.enable", False):
        raise ConfigError(
            f"{KEY}=true with algorithm.filter_groups.enable=true: DAPO's dynamic sampling generates a varying "
            "number of batches per step, and this schedule prefetches exactly one; set one of them to false")
    if _get(config, "algorithm.adv_estimator") == "remax":
        raise ConfigError(
            f"{KEY}=true with algorithm.adv_estimator=remax: ReMax's greedy baselines would come from weights one "
            "update newer than its samples; use grpo, rloo or reinforce_plus_plus, or set "
            f"{KEY}=false")
    return _correction_notes(config)


def _correction_notes(config) -> list[str]:
    from hybridrl.algorithms.rollout_corr import SECTION, RolloutCorrectionConfig

    corr = RolloutCorrectionConfig.from_section(_plain(_get(config, SECTION, None)))
    if corr.corrects or corr.bypass_mode:
        return []
    return [f"{KEY}=true: every batch after the first was sampled by weights one update old and nothing corrects "
            f"for it; verl's one-step-off recipe sets {SECTION}.bypass_mode=true (or add {SECTION}.rollout_is=token "
            "for decoupled PPO; docs/async.md)"]
