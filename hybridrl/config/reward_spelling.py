"""verl >= 0.8 spells the reward settings under ``reward.*``; hybridrl reads the older
``reward_model.*`` / ``custom_reward_function.*`` keys. Both spellings are accepted: a ``reward.*``
value is copied to the key hybridrl reads, and the same setting given both ways with different
values is an error naming both keys. An old key set to null (verl 0.9's ``legacy_reward_impl.yaml``
nulls them all) is not given, so the ``reward.*`` value is taken.
"""

from __future__ import annotations

from hybridrl.config.defaults import packaged_defaults
from hybridrl.config.rules import plain, value_at
from hybridrl.errors import ConfigError

__all__ = ["REWARD_SPELLING", "apply_reward_spelling"]

# verl >= 0.8 key -> the key hybridrl reads
REWARD_SPELLING: dict[str, str] = {
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs": "custom_reward_function.reward_kwargs",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "reward.num_workers": "reward_model.num_workers",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    **{
        f"reward.reward_model.rollout.{key}": f"reward_model.rollout.{key}"  # the judge's engine
        for key in (
            "name",
            "dtype",
            "prompt_length",
            "response_length",
            "do_sample",
            "temperature",
            "top_k",
            "top_p",
            "tensor_model_parallel_size",
            "gpu_memory_utilization",
        )
    },
    "reward.sandbox_fusion.url": "reward_model.sandbox_fusion.url",
    "reward.sandbox_fusion.max_concurrent": "reward_model.sandbox_fusion.max_concurrent",
    "reward.sandbox_fusion.memory_limit_mb": "reward_model.sandbox_fusion.memory_limit_mb",
}


def _unset(value) -> bool:
    return value is None or value == {}


def apply_reward_spelling(cfg) -> None:
    """Copies every ``reward.*`` value that is set onto the key hybridrl reads (in place).

    Raises:
        ConfigError: a setting given both ways with different values (names both keys).
    """
    from omegaconf import open_dict

    defaults = packaged_defaults()
    for new_key, old_key in REWARD_SPELLING.items():
        new = plain(value_at(cfg, new_key))
        if _unset(new):
            continue
        old = plain(value_at(cfg, old_key))
        # None is "not given": verl 0.9's legacy_reward_impl.yaml sets every old key to null
        if not _unset(old) and old != plain(value_at(defaults, old_key)) and old != new:
            raise ConfigError(
                f"{new_key}={new!r} and {old_key}={old!r} set the same thing differently; "
                f"keep one of them ({new_key} is verl >= 0.8's spelling)"
            )
        parent, _, leaf = old_key.rpartition(".")
        with open_dict(cfg):
            value_at(cfg, parent)[leaf] = new
