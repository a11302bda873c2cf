"""Rollout correction: how far the policy that sampled a batch (the rollout engine) is from the
policy the trainer computes, and (to come) the importance weights and rejection masks that
correct for it.

Source: "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch" (Liu, Li, Fu, Wang, Liu, Shen, 2025; https://richardli.xyz/rl-collapse), as verl's
``rollout_corr`` metrics.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.functional import masked_mean

__all__ = ["compute_offpolicy_metrics"]

_LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps chi^2 finite when one token is badly off


def compute_offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                              response_mask: torch.Tensor) -> dict[str, float]:
    """Off-policy diagnostics of a batch sampled by the rollout policy and trained under another.

    Args:
        old_log_prob: ``(bs, R)`` log-probs of the responses under the trained policy (nats).
        rollout_log_prob: ``(bs, R)`` log-probs the engine sampled them with (nats).
        response_mask: ``(bs, R)``, 1 on generated tokens.

    Returns:
        ``rollout_corr/`` + ``kl`` (k1 estimate of KL(rollout || training), per token),
        ``k3_kl`` (the low-variance k3 estimate), ``training_ppl`` / ``rollout_ppl`` (per-sequence
        perplexities, averaged), ``log_ppl_diff`` / ``log_ppl_abs_diff`` / ``log_ppl_diff_max`` /
        ``log_ppl_diff_min`` (rollout minus training log-perplexity per sequence), ``ppl_ratio``
        (training / rollout perplexity, averaged), ``chi2_token`` (``E[rho^2] - 1`` per token,
        rho = pi_training / pi_rollout) and ``chi2_seq`` (the same for sequence ratios).
        Empty when no row has a response token.

    Raises:
        AlgorithmInputError: the three tensors differ in shape.
    """
    if not (old_log_prob.shape == rollout_log_prob.shape == response_mask.shape):
        raise AlgorithmInputError(
            f"compute_offpolicy_metrics: shapes differ: old_log_prob {tuple(old_log_prob.shape)}, "
            f"rollout_log_prob {tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}")
    rows = response_mask.sum(-1) > 0
    if not rows.any():
        return {}
    mask = response_mask[rows].double()
    training, rollout = old_log_prob[rows].double(), rollout_log_prob[rows].double()
    log_ratio = ((training - rollout) * mask).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    training_log_ppl = -masked_mean(training, mask, axis=-1)
    rollout_log_ppl = -masked_mean(rollout, mask, axis=-1)
    log_ppl_diff = rollout_log_ppl - training_log_ppl
    seq_log_ratio = log_ratio.sum(-1).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    metrics = {
        "kl": masked_mean(-log_ratio, mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "training_ppl": training_log_ppl.exp().mean(),
        "rollout_ppl": rollout_log_ppl.exp().mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": (training_log_ppl - rollout_log_ppl).exp().mean(),
        "chi2_token": masked_mean(torch.exp(2 * log_ratio), mask) - 1,
        "chi2_seq": torch.exp(2 * seq_log_ratio).mean() - 1,
    }
    return {f"rollout_corr/{name}": float(value) for name, value in metrics.items()}
