"""``reward_model.launch_reward_fn_async``: score a batch in a driver thread while the log-prob
passes (old, reference, values) run, and collect the scores before the advantages need them.

verl runs the same overlap as a Ray task; here a daemon thread of the driver calls the reward
manager, which scores one call at a time or hands the calls to the ``reward.num_workers`` pool.
The scores are those of synchronous scoring; only the wall time changes. Scoring has to come
first where something reads the scores before the log-prob passes: DAPO's dynamic sampling
(``algorithm.filter_groups.enable``) keeps or drops groups by them, so with it the trainer
scores synchronously (as verl's DAPO trainer does, whatever the key says) and the start-up check
notes it. A reward model's ``rm_scores`` are computed before the thread starts, as in verl.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.manager import RewardFunctionError
from hybridrl.rewards.pool import START_TIMEOUT_S, check_num_workers
from hybridrl.trainer.run.background import BackgroundCall

__all__ = ["PendingReward", "reward_deadline_s", "scores_async"]


def scores_async(config) -> bool:
    """Whether the trainer scores in a thread: ``launch_reward_fn_async`` without dynamic sampling."""
    launch = bool(config.reward_model.launch_reward_fn_async)
    return launch and not config.algorithm.filter_groups.enable


def reward_deadline_s(config, n_samples: int) -> float:
    """The longest a batch's scoring may take: every call at its deadline (``reward_model.timeout_s``),
    with all its ``retries`` under ``on_error=retry``, ``reward.num_workers`` at a time, plus the
    pool's start allowance. Seconds."""
    rm = config.reward_model
    attempts = 1 + (int(rm.retries) if rm.on_error == "retry" else 0)
    workers = max(1, check_num_workers(rm.num_workers))
    timeout_s = float(rm.timeout_s)
    return attempts * timeout_s * math.ceil(n_samples / workers) + START_TIMEOUT_S


class PendingReward(BackgroundCall):
    """The reward of one batch, being computed in a daemon thread.

    Args:
        batch: the scored rows (``prompts``, ``responses``, ``attention_mask``, the non-tensors
            the reward manager reads). The thread works on a shallow copy, so the driver may add
            keys to ``batch`` meanwhile.
        reward_fn: the reward manager, called as ``reward_fn(batch, return_dict=True)``.
        deadline_s: the longest :meth:`result` waits, counted from now (see :func:`reward_deadline_s`).
    """

    def __init__(self, batch: DataProto, reward_fn: Callable[..., Any], deadline_s: float) -> None:
        snapshot = DataProto(
            batch=batch.batch.clone(False),
            non_tensor_batch=dict(batch.non_tensor_batch),
            meta_info=dict(batch.meta_info),
        )
        self.n_samples = len(batch)

        def score() -> tuple[torch.Tensor, dict]:
            result = reward_fn(snapshot, return_dict=True)
            return result["reward_tensor"], result.get("reward_extra_info", {})

        super().__init__(score, "reward-async", deadline_s)

    def result(self) -> tuple[torch.Tensor, dict]:
        """Waits for the scores: ``(token_level_scores (bs, response_length), reward_extra_info)``.

        Raises:
            RewardFunctionError: no result within ``deadline_s`` of the start (the thread runs on
                unwatched), or what the reward manager raised, re-raised as it was.
        """
        return super().result(
            lambda: RewardFunctionError(
                f"reward_model.launch_reward_fn_async: the scores of the batch ({self.n_samples} samples) were not "
                f"ready {self.deadline_s:g} s after scoring started (every call at reward_model.timeout_s, "
                "reward.num_workers at a time); a reward manager that ignores reward_model.timeout_s may hang"
            )
        )
