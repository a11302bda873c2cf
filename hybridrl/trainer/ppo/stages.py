"""The stages a PPO step is made of, outside the trainer class: the prompt trimming, the reward,
the advantage, reward failures and DAPO's sampler (which passes run: :mod:`.step_plan`).

Kept apart from :mod:`hybridrl.trainer.ppo.ppo_trainer` so that the driver loop reads as the algorithm
and these functions can be used (and tested) on their own.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.algorithms.advantages import get_adv_estimator_fn
from hybridrl.algorithms.config import AlgoConfig
from hybridrl.algorithms.errors import check_finite
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.dynamic_sampling import DynamicSampler

__all__ = [
    "GEN_BATCH_KEYS",
    "trim_left_padding",
    "compute_advantage",
    "compute_reward",
    "object_array",
    "build_dynamic_sampler",
    "apply_reward_failures",
]

GEN_BATCH_KEYS = ["input_ids", "attention_mask", "position_ids"]


def trim_left_padding(gen_batch: DataProto) -> DataProto:
    """Drops the prompt columns that are padding in every row.

    The dataset left-pads every prompt to ``data.max_prompt_length``; when the longest prompt
    of a batch is shorter, those columns would only cost compute in generation and in every
    forward pass after it.
    """
    attention_mask = gen_batch.batch["attention_mask"]
    first = int(attention_mask.any(dim=0).int().argmax())
    if first == 0:
        return gen_batch
    tensors = {key: gen_batch.batch[key][:, first:] for key in GEN_BATCH_KEYS}
    return DataProto.from_dict(tensors=tensors, non_tensors=gen_batch.non_tensor_batch, meta_info=gen_batch.meta_info)


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgoConfig | None = None,
) -> DataProto:
    """Fills ``advantages`` and ``returns`` ``(bs, response_length)`` with the named estimator.

    Every estimator gets the same keyword arguments and uses the ones it needs: the group-based
    ones group responses by the per-prompt ``uid``; GAE uses the critic's ``values``; ReMax the
    greedy responses' ``reward_baselines``; GDPO the reward components named by
    ``config.gdpo_reward_keys`` / ``gdpo_reward_weights``. ``config`` is the typed ``algorithm``
    section (None: its defaults), also handed on for estimators written for verl.

    Raises:
        NonFiniteError: the rewards, values, advantages or returns hold NaN/inf on a response token.
    """
    batch = data.batch
    step = data.meta_info.get("global_steps")
    algo = config if config is not None else AlgoConfig()
    for key in ("token_level_rewards", "values"):
        if key in batch.keys():
            check_finite(batch[key], key, step, mask=batch["response_mask"])
    advantages, returns = get_adv_estimator_fn(adv_estimator)(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        values=batch.get("values", None),
        reward_baselines=batch.get("reward_baselines", None),
        index=data.non_tensor_batch["uid"],
        non_tensor_batch=data.non_tensor_batch,  # the reward function's outputs (gdpo's components)
        old_log_probs=batch.get("old_log_probs", None),  # the optimal token baseline's inputs
        sum_pi_squared=batch.get("sum_pi_squared", None),
        rollout_is_weights=batch.get("rollout_is_weights", None),
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        gdpo_reward_keys=algo.gdpo_reward_keys,
        gdpo_reward_weights=algo.gdpo_reward_weights,
        config=config,
    )
    check_finite(advantages, "advantages", step, mask=batch["response_mask"])
    check_finite(returns, "returns", step, mask=batch["response_mask"])
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data


def compute_reward(data: DataProto, reward_fn) -> tuple[torch.Tensor, dict]:
    """``(token_level_scores (bs, response_length), reward_extra_info)`` from a reward manager."""
    result = reward_fn(data, return_dict=True)
    return result["reward_tensor"], result.get("reward_extra_info", {})


def object_array(values: list) -> np.ndarray:
    """A 1-d object array of ``values`` (``np.array`` would make lists of lists 2-d)."""
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def build_dynamic_sampler(config, tokenizer) -> DynamicSampler | None:
    """DAPO's group filter when ``algorithm.filter_groups.enable``, else None (``config``: the
    run's typed config, read by attribute)."""
    groups = config.algorithm.filter_groups
    if not groups.enable:
        return None
    return DynamicSampler(
        groups.metric or "acc",
        groups.max_num_gen_batches,
        config.data.train_batch_size,
        tokenizer.pad_token_id,
        timeout_s=groups.timeout_s,
    )


def apply_reward_failures(batch: DataProto, on_error: str, drop_rows: bool) -> tuple[DataProto, dict[str, float]]:
    """Applies ``reward_model.on_error`` to the samples whose scoring failed (``reward_error``).

    ``mask_sample``: the sample's ``response_mask`` becomes 0 (no gradient, not counted in the
    loss; its 0 score still enters its group's baseline). ``drop_group``: every sample of a prompt
    group with a failure leaves the batch when ``drop_rows`` (dynamic sampling refills it), else
    is masked the same way. ``zero``: nothing beyond the 0 score.

    Returns:
        ``(batch, metrics)``: ``reward/error_count``, ``reward/timeout_count`` and, per policy,
        ``reward/masked_samples`` or ``reward/dropped_groups``.
    """
    if "reward_error" not in batch.non_tensor_batch:
        return batch, {}
    failed = np.asarray(batch.non_tensor_batch["reward_error"], dtype=np.float64) > 0
    timed_out = np.asarray(batch.non_tensor_batch.get("reward_timeout", np.zeros(len(failed))), dtype=np.float64)
    metrics = {"reward/error_count": float(failed.sum()), "reward/timeout_count": float(timed_out.sum())}
    if on_error == "mask_sample":
        hit = failed
        metrics["reward/masked_samples"] = float(hit.sum())
    elif on_error == "drop_group":
        uids = batch.non_tensor_batch["uid"]
        bad_groups = set(uids[failed])
        hit = np.array([uid in bad_groups for uid in uids], dtype=bool)
        metrics["reward/dropped_groups"] = float(len(bad_groups))
        if drop_rows and hit.any():
            return batch[np.flatnonzero(~hit).tolist()], metrics
    else:
        return batch, metrics
    if hit.any():
        keep = torch.as_tensor(~hit, dtype=batch.batch["response_mask"].dtype).unsqueeze(-1)
        batch.batch["response_mask"] = batch.batch["response_mask"] * keep
    return batch, metrics
