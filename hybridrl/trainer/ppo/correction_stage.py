"""Rollout correction on the driver: ``algorithm.rollout_correction`` applied to a batch.

Two modes (verl's). *Decoupled* (default): the old-log-prob pass gives ``pi_old``; before the
advantages, the importance weights (``rollout_is_weights``) join the batch and rejection removes
tokens from ``response_mask``. *Bypass* (``bypass_mode=true``): ``old_log_probs`` are the rollout
log-probs (no old-log-prob pass) and the actor's ``bypass_mode`` loss computes the weights and
the rejection from the current policy. The formulas are in :mod:`hybridrl.algorithms.rollout_corr`.
"""

from __future__ import annotations

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.rollout_corr import (
    RolloutCorrectionConfig,
    compute_rollout_correction_and_rejection_mask,
    rejection_settings,
)
from hybridrl.protocol import DataProto

__all__ = [
    "share_rollout_correction",
    "apply_bypass_mode",
    "compute_rollout_correction_and_add_to_batch",
    "RolloutCorrectionError",
]

_ENGINE_KEY = "actor_rollout_ref.rollout.calculate_log_probs"


class RolloutCorrectionError(AlgorithmInputError):
    """A batch lacks the rollout log-probs that rollout correction needs."""


def share_rollout_correction(config) -> None:
    """Copies ``algorithm.rollout_correction`` to ``actor_rollout_ref.actor.policy_loss`` (the
    actor workers see only ``actor_rollout_ref``) and, in bypass mode, selects the ``bypass_mode``
    loss, as verl's trainer does (``policy_loss.rollout_correction`` is a field of the typed config)."""
    policy_loss = config.actor_rollout_ref.actor.policy_loss
    policy_loss.rollout_correction = config.algorithm.rollout_correction
    if config.algorithm.rollout_correction.bypass_mode:
        policy_loss.loss_mode = "bypass_mode"


def _rollout_log_probs(batch: DataProto, what: str):
    if "rollout_log_probs" not in batch.batch.keys():
        raise RolloutCorrectionError(
            f"algorithm.rollout_correction.{what} needs the engine's log-probs but the batch has no rollout_log_probs; "
            f"set {_ENGINE_KEY}=true (an agent loop must return response_logprobs)"
        )
    return batch.batch["rollout_log_probs"]


def apply_bypass_mode(batch: DataProto) -> None:
    """``old_log_probs`` = ``rollout_log_probs``, in place (the old-log-prob pass is skipped).

    Raises:
        RolloutCorrectionError: the batch has no ``rollout_log_probs``.
    """
    batch.batch["old_log_probs"] = _rollout_log_probs(batch, "bypass_mode")


def compute_rollout_correction_and_add_to_batch(
    batch: DataProto,
    rollout_corr_config: RolloutCorrectionConfig,
) -> tuple[DataProto, dict[str, float]]:
    """Decoupled mode: adds ``rollout_is_weights`` ``(bs, R)`` (when ``rollout_is`` is set) and
    applies the rejection to ``response_mask``, in place.

    Returns:
        ``(batch, metrics)``: the ``rollout_corr/*`` metrics.

    Raises:
        RolloutCorrectionError: the batch has no ``rollout_log_probs``.
    """
    cfg = rollout_corr_config
    rollout_log_probs = _rollout_log_probs(batch, f"rollout_is={cfg.rollout_is}, rollout_rs={cfg.rollout_rs}")
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        batch.batch["old_log_probs"],
        rollout_log_probs,
        batch.batch["response_mask"],
        cfg.rollout_is,
        cfg.rollout_is_threshold,
        cfg.rollout_is_batch_normalize,
        *rejection_settings(cfg),
    )
    batch.batch["response_mask"] = mask
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    return batch, metrics
