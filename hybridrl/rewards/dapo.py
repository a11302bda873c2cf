"""``reward_model.reward_manager=dapo``: DAPO's reward manager, the naive one plus overlong
reward shaping.

Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476,
section 3.4 (soft overlong punishment, eq. 13). With ``L_max = data.max_response_length``,
``L_cache = overlong_buffer.len`` and ``|y|`` the response's valid tokens::

    R_length(y) = 0                                            |y| <= L_max - L_cache
                = -(|y| - (L_max - L_cache)) / L_cache * f     L_max - L_cache < |y| <= L_max

with ``f = overlong_buffer.penalty_factor`` (the paper: 1), added to the rule score. A scorer that
returns a float also reports it as ``acc`` (the filter metric DAPO uses).
"""

from __future__ import annotations

from typing import Any

from hybridrl.config.typed import to_dataclass
from hybridrl.rewards.config import OverlongBufferConfig
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.manager import NaiveRewardManager, register_reward_manager
from hybridrl.rewards.settings import to_plain_dict

__all__ = ["DAPORewardManager", "overlong_penalty"]

_KEY = "reward_model.overlong_buffer"


def overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (<= 0) of one response; see the module docstring."""
    exceed = response_length - (max_resp_len - buffer_len)
    return min(-exceed / buffer_len * penalty_factor, 0.0)


def _buffer_settings(cfg: Any) -> OverlongBufferConfig:
    """``cfg`` typed: the config's ``reward_model.overlong_buffer`` section, or verl-recipe's plain
    ``reward_kwargs.overlong_buffer_cfg`` mapping, where a missing or null key takes the default.

    Raises:
        ConfigError: a key :class:`OverlongBufferConfig` has not, or a value of the wrong type.
    """
    given = {
        key: value for key, value in to_plain_dict(cfg if cfg is not None else {}, _KEY).items() if value is not None
    }
    return to_dataclass(OverlongBufferConfig, given, _KEY)


@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """The naive manager (every argument the same) with DAPO's overlong shaping.

    Args:
        max_resp_len: ``data.max_response_length`` (tokens); needed when the buffer is on.
        overlong_buffer_cfg: ``reward_model.overlong_buffer`` (or verl-recipe's
            ``reward_model.reward_kwargs.overlong_buffer_cfg``): ``enable``, ``len`` (tokens,
            ``0 < len <= max_resp_len``), ``penalty_factor`` (>= 0, default 1.0), ``log`` (report
            ``overlong_reward`` and ``overlong`` per sample in the reward extras).

    Raises:
        RewardConfigError: the buffer is on with a missing or out-of-range length or factor.
        ConfigError: a key ``overlong_buffer_cfg`` has not, or a value of the wrong type.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score=None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
        **kwargs,
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        cfg = _buffer_settings(overlong_buffer_cfg)
        self.overlong = cfg.enable
        self.buffer_len = cfg.len
        self.penalty_factor = cfg.penalty_factor
        self.log_overlong = cfg.log
        self.max_resp_len = max_resp_len
        if self.overlong:
            self._check(max_resp_len)

    def _check(self, max_resp_len) -> None:
        if isinstance(max_resp_len, bool) or not isinstance(max_resp_len, int) or max_resp_len < 1:
            raise RewardConfigError(f"{_KEY}.enable=true needs data.max_response_length (got {max_resp_len!r})")
        if not 0 < self.buffer_len <= max_resp_len:
            raise RewardConfigError(
                f"{_KEY}.len={self.buffer_len!r} must be a whole number of tokens in "
                f"(0, data.max_response_length={max_resp_len}]; DAPO uses 4096 of 20480"
            )
        factor = self.penalty_factor
        if factor < 0:
            raise RewardConfigError(f"{_KEY}.penalty_factor={factor:g} must be a number >= 0 (DAPO: 1.0)")

    def shape_score(self, score: float, extras: dict, response_length: int) -> tuple[float, dict]:
        extras = extras if "acc" in extras else {**extras, "acc": score}
        if not self.overlong:
            return score, extras
        penalty = overlong_penalty(response_length, self.max_resp_len, self.buffer_len, self.penalty_factor)
        if self.log_overlong:
            extras = {**extras, "overlong_reward": penalty, "overlong": penalty < 0}
        return score + penalty, extras
