"""Build the run's reward manager from its config (verl's ``load_reward_manager``): the custom
scoring function, the registered manager class and the keyword arguments it takes."""

from __future__ import annotations

import inspect
import logging
from typing import Any

from hybridrl.rewards.custom import RewardConfigError, load_custom_reward_fn
from hybridrl.rewards.manager import DEFAULT_SCORE_TIMEOUT_S, NaiveRewardManager, get_reward_manager_cls
from hybridrl.rewards.pool import RewardPool
from hybridrl.rewards.settings import to_plain_dict

__all__ = ["load_reward_manager"]

logger = logging.getLogger(__name__)


def _score_timeout(value: float) -> float:
    if value <= 0:
        raise RewardConfigError(
            f"reward_model.timeout_s={value!r} must be a number of seconds > 0 (default {DEFAULT_SCORE_TIMEOUT_S:g})"
        )
    return float(value)


def _accepted_args(manager_cls: type) -> set[str]:
    """The keyword arguments a manager takes; a naive subclass's ``**kwargs`` reach the naive ones."""
    params = inspect.signature(manager_cls).parameters
    names = set(params)
    if issubclass(manager_cls, NaiveRewardManager) and any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names |= set(inspect.signature(NaiveRewardManager).parameters)
    return names


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0, pool: RewardPool | None = None) -> Any:
    """Build the reward manager the trainer config asks for (verl's ``load_reward_manager``).

    Reads ``custom_reward_function.{path,name,reward_kwargs}`` (the custom scorer, with its kwargs
    bound by ``functools.partial``; default :func:`default_compute_score`),
    ``reward_model.reward_manager`` (default ``"naive"``), ``reward_model.reward_kwargs`` (extra
    constructor arguments of the manager), ``reward_model.{on_error,retries,timeout_s,overlong_buffer}``,
    ``data.reward_fn_key`` and ``data.max_response_length``.

    Args:
        config: the whole PPO config as the run reads it (typed:
            ``hybridrl.trainer.ppo.config.typed_ppo_config``).
        tokenizer: the tokenizer used to decode responses.
        num_examine: samples per data_source to print on each call.
        pool: the run's scoring processes (``reward.num_workers`` > 1, see
            :func:`hybridrl.rewards.pool.build_reward_pool`), or None to score in the driver. It is
            checked here: every worker must load the reward function.

    Raises:
        RewardConfigError: a bad custom function, manager name, on_error value, timeout or reward_kwargs.
        RewardPoolError: the workers of ``pool`` cannot load the reward function.
    """
    custom, rm = config.custom_reward_function, config.reward_model
    compute_score = None
    if custom.path:
        fn_kwargs = to_plain_dict(custom.reward_kwargs, "custom_reward_function.reward_kwargs")
        compute_score = load_custom_reward_fn(custom.path, custom.name, fn_kwargs)
    manager_name = rm.reward_manager
    manager_cls = get_reward_manager_cls(manager_name)
    manager_kwargs = to_plain_dict(rm.reward_kwargs, "reward_model.reward_kwargs")
    optional = {  # passed to managers that take them (verl's naive one does not), unless reward_kwargs do
        "timeout_s": _score_timeout(rm.timeout_s),
        "retries": rm.retries,
        "overlong_buffer_cfg": rm.overlong_buffer,
        "max_resp_len": config.data.max_response_length,
        "pool": pool,
        "config": config,  # managers that read keys of their own (the judge; verl's reward-loop managers)
    }
    accepted = _accepted_args(manager_cls)
    if pool is not None and "pool" not in accepted:
        logger.warning(
            "reward.num_workers=%d: reward manager %r takes no pool (no `pool` argument); it scores "
            "as it does without one",
            pool.num_workers,
            manager_name,
        )
    try:
        manager = manager_cls(
            tokenizer=tokenizer,
            num_examine=num_examine,
            compute_score=compute_score,
            reward_fn_key=config.data.reward_fn_key,
            on_error=rm.on_error,
            **{k: v for k, v in optional.items() if k in accepted and k not in manager_kwargs},
            **manager_kwargs,
        )
    except TypeError as exc:
        if not manager_kwargs:
            raise
        raise RewardConfigError(
            f"reward_model.reward_kwargs={manager_kwargs} do not fit reward manager "
            f"{manager_name!r}: {exc}; remove the keys it does not take"
        ) from exc
    if getattr(manager, "pool", None) is not None:
        manager.pool.check_started(manager._score_fn)
    return manager
