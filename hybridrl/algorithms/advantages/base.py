"""The advantage-estimator registry and the input checks and helpers the estimators share."""

from enum import Enum
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from hybridrl.registry import Registry

from ..errors import AlgorithmInputError, UnknownAlgorithmError

ADV_ESTIMATORS = Registry(
    "advantage estimator",
    "algorithm.adv_estimator",
    error=UnknownAlgorithmError,
    hint="register your own with @register_adv_est",
)
ADV_ESTIMATOR_REGISTRY = ADV_ESTIMATORS.table  # verl's name: the live name -> function dict

# Names of registered estimators that compare the responses to one prompt with each other, so
# they need ``actor_rollout_ref.rollout.n >= 2`` (the ``needs_group`` capability; a live view).
ADV_ESTIMATOR_NEEDS_GROUP = ADV_ESTIMATORS.having("needs_group")


def register_adv_est(
    name: "str | Enum", needs_group: bool = False, needs_values: bool = False, needs_reward_baselines: bool = False
) -> Callable:
    """Decorator: register an advantage estimator under ``name`` (a value of
    ``algorithm.adv_estimator``; an ``Enum`` member such as verl's ``AdvantageEstimator.GRPO``
    stands for its value).

    The function must accept keyword arguments and ``**kwargs`` and return
    ``(advantages, returns)``, both ``(bs, response_length)``. Its needs are capabilities the
    driver and the config check read (:func:`estimator_needs`), never name checks:
    ``needs_group`` several responses per prompt (``rollout.n >= 2``, seen in
    ``ADV_ESTIMATOR_NEEDS_GROUP``); ``needs_values`` a critic's ``values`` (the critic is built
    and trained); ``needs_reward_baselines`` the greedy responses' rewards (``reward_baselines``).

    Raises:
        UnknownAlgorithmError (a ValueError): another function is already registered under ``name``.
    """
    return ADV_ESTIMATORS.register(
        name, needs_group=needs_group, needs_values=needs_values, needs_reward_baselines=needs_reward_baselines
    )


def estimator_needs(name: "str | Enum", capability: str) -> bool:
    """Whether the estimator registered as ``name`` declared ``capability`` (``needs_group``,
    ``needs_values``, ``needs_reward_baselines``); False for an unknown name, which the config
    check reports on its own."""
    return name in ADV_ESTIMATORS and bool(ADV_ESTIMATORS.capabilities(name).get(capability))


def get_adv_estimator_fn(name: "str | Enum") -> Callable:
    """Return the estimator registered as ``name`` (or an ``Enum`` member's value).

    Raises:
        UnknownAlgorithmError: no estimator has that name (the message lists the known ones and
            suggests the closest).
    """
    return ADV_ESTIMATORS.get(name)


# ----------------------------------------------------------------------------- shared helpers
def describe_shape(x: Any) -> str:
    """``x``'s shape as a tuple string (``"(4, 8)"``) for a tensor, else ``"a <type name>"``:
    what an input check's message says was given."""
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"


def _check_mask(response_mask: torch.Tensor) -> None:
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        raise AlgorithmInputError(
            f"response_mask is {describe_shape(response_mask)}; it must be a 2-D tensor (bs, response_length) of 0/1"
        )


def check_input_finite(name: str, tensor: torch.Tensor, fix: str) -> None:
    """An estimator's input ``tensor`` (any shape) holds no NaN/inf (integer tensors always pass).

    Raises:
        AlgorithmInputError: ``"<name> has NaN/inf at <k> positions; <fix>"``.
    """
    bad = int((~torch.isfinite(tensor)).sum().item()) if tensor.is_floating_point() else 0
    if bad:
        raise AlgorithmInputError(f"{name} has NaN/inf at {bad} positions; {fix}")


def check_same_shape(
    name: str,
    tensor: Optional[torch.Tensor],
    response_mask: torch.Tensor,
    missing: str = "this advantage estimator needs it",
) -> None:
    """``tensor`` must be a finite ``(bs, response_length)`` tensor like ``response_mask``.

    Raises:
        AlgorithmInputError: ``response_mask`` is not 2-D; ``tensor`` is None (the message ends
            with ``missing``), has another shape, or holds NaN/inf.
    """
    _check_mask(response_mask)
    if tensor is None:
        raise AlgorithmInputError(f"{name} is None: {missing}")
    if not isinstance(tensor, torch.Tensor) or tensor.shape != response_mask.shape:
        raise AlgorithmInputError(
            f"{name} has shape {describe_shape(tensor)} but response_mask has {tuple(response_mask.shape)}; "
            "both must be (bs, response_length)"
        )
    check_input_finite(
        name,
        tensor,
        "check the reward function and the KL penalty that produce it"
        if name == "token_level_rewards"
        else f"check what produced {name}",
    )


def advantage_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype advantages are computed in: ``tensor``'s, at least fp32 (bf16 sums and std are
    too coarse for advantages)."""
    return torch.promote_types(tensor.dtype, torch.float32)


def outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Checked ``(bs,)`` sequence scores ``score_i = sum_t token_level_rewards[i, t]`` in fp32 or
    wider, from ``(bs, response_length)`` rewards.

    Raises:
        AlgorithmInputError: the shapes differ or the rewards hold NaN/inf.
    """
    check_same_shape("token_level_rewards", token_level_rewards, response_mask)
    return token_level_rewards.sum(dim=-1).to(advantage_dtype(token_level_rewards))


def group_ids(index: Sequence, bs: int) -> torch.Tensor:
    """``(bs,)`` long tensor numbering the distinct uids of ``index`` 0.. in first-seen order.

    Raises:
        AlgorithmInputError: ``index`` is None or does not have ``bs`` entries.
    """
    if index is None:
        raise AlgorithmInputError(
            "index is None: this advantage estimator groups responses by prompt and needs the "
            "uid array (non_tensor_batch['uid']) of shape (bs,)"
        )
    index = np.asarray(index, dtype=object).reshape(-1)
    if index.shape[0] != bs:
        raise AlgorithmInputError(
            f"index has {index.shape[0]} entries but the batch has {bs} responses; pass one uid per response"
        )
    ids: Dict = {}
    return torch.tensor([ids.setdefault(uid, len(ids)) for uid in index], dtype=torch.long)
