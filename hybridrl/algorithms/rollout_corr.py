"""Rollout correction: how far the policy that sampled a batch (the rollout engine) is from the
policy the trainer computes, and the importance weights and rejection masks that correct for it.

The engine samples with ``pi_rollout`` (vLLM's kernels, bf16, an older weight version); the
trainer computes ``pi_old`` (``old_log_probs``) and updates ``pi_theta``. With
``log_ratio = log pi_old - log pi_rollout`` per token:

* **importance weights** (``rollout_is``): ``w = exp(log_ratio)`` per token (``token``) or
  ``exp(sum_t log_ratio)`` per sequence (``sequence``), truncated at ``rollout_is_threshold``
  (TIS), detached, and multiplied into the policy loss (``rollout_is_weights``);
* **rejection** (``rollout_rs``): tokens or sequences whose divergence estimate leaves a bound
  are removed from ``response_mask``. Estimators of KL(rollout || training) per token:
  ``k1 = -log_ratio``, ``k2 = log_ratio^2 / 2``, ``k3 = exp(log_ratio) - 1 - log_ratio``; options
  ``token_k*`` (each token), ``seq_sum_k*`` / ``seq_mean_k*`` (a sequence's sum / mean; ``seq_mean_k1``
  bounds the geometric-mean ratio), ``seq_max_k2`` / ``seq_max_k3`` (its worst token). ``k1`` options
  keep ``log(lo) <= stat <= log(hi)`` (``"lo_hi"``, or ``"hi"`` meaning ``lo = 1/hi``); the others
  keep ``stat <= threshold``. Several comma-separated options must all pass.

Sources: "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch" (Liu, Li, Fu, Wang, Liu, Shen, 2025; https://richardli.xyz/rl-collapse); truncated
importance sampling: "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(Yao et al., 2025, https://fengyao.notion.site/off-policy-rl). verl's keys, names and metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybridrl.algorithms.errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from hybridrl.algorithms.functional import masked_mean, masked_sum

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_OPTIONS",
    "BYPASS_LOSS_TYPES",
    "RolloutCorrectionConfig",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_rollout_correction_and_rejection_mask",
    "compute_offpolicy_metrics",
    "rejection_settings",
]

SECTION = "algorithm.rollout_correction"
SAFETY_BOUND = 20.0  # |log ratio| cap: exp(20) ~ 5e8 keeps weights and chi^2 finite
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class RejectionRule:
    """One ``rollout_rs`` option with its bounds: ``lower`` (a log bound, k1 options only) and
    ``upper`` (a log bound for k1 options, else a bound on the estimate itself)."""

    option: str
    upper: float
    lower: Optional[float] = None


def parse_rollout_rs(rollout_rs: Optional[str], rollout_rs_threshold) -> tuple[RejectionRule, ...]:
    """The rules of a ``rollout_rs`` string (``"token_k1,seq_max_k2"``) and its thresholds (one
    shared value, or one per option, comma separated; ``"lo_hi"`` for k1 options).

    Raises:
        UnknownAlgorithmError: an option verl does not have (lists the valid ones).
        AlgorithmConfigError: a missing, non-numeric or non-positive threshold, a count that is
            neither 1 nor one per option, or ``lo_hi`` given to an option that takes one bound.
    """
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise AlgorithmConfigError(
            f"{SECTION}.rollout_rs={rollout_rs!r}: give one or more of "
            f"{', '.join(ROLLOUT_RS_OPTIONS)} (comma separated), or null"
        )
    options = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    for option in options:
        if option not in ROLLOUT_RS_OPTIONS:
            raise UnknownAlgorithmError(
                f"unknown {SECTION}.rollout_rs option {option!r}; valid: {', '.join(ROLLOUT_RS_OPTIONS)}"
            )
    key = f"{SECTION}.rollout_rs_threshold"
    if rollout_rs_threshold is None or isinstance(rollout_rs_threshold, bool):
        raise AlgorithmConfigError(
            f"{key}={rollout_rs_threshold!r}: rollout_rs={rollout_rs} needs a threshold, "
            "e.g. 2.0, or '0.5_2.0' (lower_upper) for k1 options"
        )
    specs = [part.strip() for part in str(rollout_rs_threshold).split(",") if part.strip()]
    if len(specs) not in (1, len(options)):
        raise AlgorithmConfigError(
            f"{key}={rollout_rs_threshold!r}: give one threshold for all options or one per "
            f"option ({len(options)}: {', '.join(options)})"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    return tuple(_rule(option, spec, key) for option, spec in zip(options, specs))


def _rule(option: str, spec: str, key: str) -> RejectionRule:
    parts = spec.split("_")
    if len(parts) > 2 or (len(parts) == 2 and not option.endswith("k1")):
        raise AlgorithmConfigError(
            f"{key}: {spec!r} for {option}: only k1 options take 'lower_upper'; give one positive number"
        )
    try:
        bounds = [float(p) for p in parts]
    except ValueError:
        raise AlgorithmConfigError(f"{key}: {spec!r} for {option} is not a number; e.g. 2.0 or '0.5_2.0'") from None
    if not all(b > 0 and math.isfinite(b) for b in bounds):
        raise AlgorithmConfigError(f"{key}: {spec!r} for {option}: thresholds must be positive numbers")
    if not option.endswith("k1"):
        return RejectionRule(option, upper=bounds[0])
    lower, upper = bounds if len(bounds) == 2 else (1.0 / bounds[0], bounds[0])
    if not lower <= upper:
        raise AlgorithmConfigError(f"{key}: {spec!r} for {option}: the lower bound exceeds the upper one")
    return RejectionRule(option, upper=math.log(upper), lower=math.log(lower))


def _check_rollout_is(rollout_is: Optional[str], rollout_is_threshold) -> None:
    if rollout_is is not None and rollout_is not in ROLLOUT_IS_LEVELS:
        raise UnknownAlgorithmError(
            f"unknown {SECTION}.rollout_is={rollout_is!r}; valid: {', '.join(ROLLOUT_IS_LEVELS)} or null"
        )
    threshold = rollout_is_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0:
        raise AlgorithmConfigError(
            f"{SECTION}.rollout_is_threshold={threshold!r} must be a number > 0 "
            "(the truncation bound of the weights; 2.0 is usual)"
        )


@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction`` (verl's keys and defaults).

    ``rollout_is``: None | ``token`` | ``sequence``; ``rollout_is_threshold`` (> 0, truncation
    bound, 2.0); ``rollout_is_batch_normalize`` (rescale the weights to mean 1 over the batch);
    ``rollout_rs`` / ``rollout_rs_threshold`` (see the module docstring); ``bypass_mode`` (use the
    rollout log-probs as ``old_log_probs``: no old-log-prob pass, two policies instead of three);
    ``loss_type`` (bypass mode only: ``ppo_clip`` clips ``pi_theta / pi_rollout``; ``reinforce`` is
    ``-w * A * log pi_theta`` with the weights made explicit).

    Raises:
        UnknownAlgorithmError: an unknown ``rollout_is``, ``rollout_rs`` option or ``loss_type``.
        AlgorithmConfigError: a bad threshold.

    In bypass mode the weights come from the current policy one micro batch at a time, so
    ``rollout_is_batch_normalize`` rescales them to mean 1 over each micro batch (as verl does).
    """

    rollout_is: Optional[str] = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: Optional[str] = None
    rollout_rs_threshold: Any = None
    rollout_rs_threshold_lower: Optional[float] = None  # verl 0.7's lower bound (see rejection_settings)
    rollout_token_veto_threshold: Optional[float] = None  # verl 0.7's per-token veto: refused unless null
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self):
        _check_rollout_is(self.rollout_is, self.rollout_is_threshold)
        if self.loss_type not in BYPASS_LOSS_TYPES:
            raise UnknownAlgorithmError(
                f"unknown {SECTION}.loss_type={self.loss_type!r}; valid: {', '.join(BYPASS_LOSS_TYPES)}"
            )
        if self.rollout_rs is not None:
            parse_rollout_rs(*rejection_settings(self))
        if self.rollout_token_veto_threshold is not None:
            raise AlgorithmConfigError(
                f"{SECTION}.rollout_token_veto_threshold={self.rollout_token_veto_threshold}: verl 0.7's per-token "
                "veto is not in hybridrl; bound each token with rollout_rs=token_k1 (rollout_rs_threshold='lo_hi') "
                "or a sequence's worst token with seq_max_k2 / seq_max_k3"
            )

    @classmethod
    def from_section(cls, section) -> RolloutCorrectionConfig:
        """From the config section (a mapping; None or missing keys take the defaults)."""
        section = dict(section or {})
        known = {f: section[f] for f in cls.__dataclass_fields__ if f in section and section[f] is not None}
        return cls(**known)

    @property
    def corrects(self) -> bool:
        """Weights or rejection are on (they need ``rollout_log_probs``)."""
        return self.rollout_is is not None or self.rollout_rs is not None

    @property
    def rejection_rules(self) -> tuple[RejectionRule, ...]:
        return parse_rollout_rs(*rejection_settings(self)) if self.rollout_rs else ()


# verl 0.7's rejection modes: bounds on the ratio of a token, a sequence, the geometric mean
_V07_RS = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


def rejection_settings(corr) -> tuple[Optional[str], Any]:
    """``(rollout_rs, rollout_rs_threshold)`` of ``corr`` with verl 0.7's spelling folded in: its
    modes ``token`` / ``sequence`` / ``geometric`` are ``token_k1`` / ``seq_sum_k1`` / ``seq_mean_k1``,
    and its ``rollout_rs_threshold_lower`` (default ``1 / upper``) joins the upper bound as ``"lo_hi"``."""
    rollout_rs, threshold = corr.rollout_rs, corr.rollout_rs_threshold
    lower = getattr(corr, "rollout_rs_threshold_lower", None)
    if isinstance(rollout_rs, str):
        rollout_rs = ",".join(_V07_RS.get(part.strip(), part.strip()) for part in rollout_rs.split(","))
    if lower is not None and threshold is not None and "_" not in str(threshold) and "," not in str(threshold):
        threshold = f"{lower}_{threshold}"
    return rollout_rs, threshold


def _check_shapes(name: str, **tensors: torch.Tensor) -> None:
    shapes = {key: tuple(t.shape) for key, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise AlgorithmInputError(f"{name}: shapes differ: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``pi_training / pi_rollout``.

    Args:
        log_ratio: ``(bs, R)`` ``log pi_training - log pi_rollout`` per token (nats).
        response_mask: ``(bs, R)``, 1 on generated tokens.
        rollout_is: ``token`` (one weight per token: biased, low variance) or ``sequence`` (the
            product over the sequence, the same for all its tokens: unbiased, high variance).
        rollout_is_threshold: upper truncation bound (> 0).
        rollout_is_batch_normalize: divide by the batch mean (over tokens for ``token``, over
            sequences for ``sequence``) after truncation, so the weights average 1.

    Returns:
        ``(weights, metrics)``: ``(bs, R)`` detached weights, 0 outside the mask; metrics
        ``rollout_is_mean`` / ``_std`` (truncated weights), ``rollout_is_max`` / ``_min`` and
        ``rollout_is_ratio_fraction_high`` / ``_low`` (untruncated weights against the threshold and
        its inverse), ``rollout_is_eff_sample_size`` (``1 / E[(w / E w)^2]``, 1 = no loss),
        ``rollout_is_seq_mean`` / ``_max`` / ``_min`` (per-sequence mean weight) and, when
        normalising, ``rollout_is_batch_norm_factor``. Unprefixed; empty without valid tokens.

    Raises:
        UnknownAlgorithmError: ``rollout_is`` is not ``token`` / ``sequence``.
        AlgorithmConfigError: ``rollout_is_threshold`` is not > 0.
        AlgorithmInputError: the shapes differ.
    """
    _check_rollout_is(rollout_is, rollout_is_threshold)
    _check_shapes("compute_rollout_correction_weights", log_ratio=log_ratio, response_mask=response_mask)
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        log_w = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        unit_log_w, unit_mask = log_w[mask > 0], None  # metric units: tokens
    else:
        seq_log_w = masked_sum(log_ratio, mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        log_w = seq_log_w.unsqueeze(-1).expand_as(log_ratio)
        unit_mask = mask.sum(-1) > 0
        unit_log_w = seq_log_w[unit_mask]  # metric units: sequences
    weights = (torch.exp(log_w) * mask).clamp(max=float(rollout_is_threshold)).detach()
    if unit_log_w.numel() == 0:
        return weights, {}
    units = weights[mask > 0] if unit_mask is None else weights[unit_mask].amax(-1)
    metrics = _is_metrics(units, unit_log_w, float(rollout_is_threshold), weights, mask)
    if rollout_is_batch_normalize:
        mean = units.mean()
        if mean > 1e-8:
            weights = weights / mean
        metrics["rollout_is_batch_norm_factor"] = float(mean) if mean > 1e-8 else 1.0
    return weights, metrics


def _is_metrics(
    units: torch.Tensor, unit_log_w: torch.Tensor, threshold: float, weights: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Weight statistics; ``units`` are the truncated weights per token or per sequence."""
    log_hi = math.log(threshold)
    normalised = units / units.mean().clamp_min(1e-8)
    rows = mask.sum(-1) > 0
    seq_mean = masked_mean(weights, mask, axis=-1)[rows]
    metrics = {
        "rollout_is_mean": units.mean(),
        "rollout_is_std": units.std(unbiased=False),
        "rollout_is_max": unit_log_w.max().exp(),
        "rollout_is_min": unit_log_w.min().exp(),
        "rollout_is_ratio_fraction_high": (unit_log_w > log_hi).double().mean(),
        "rollout_is_ratio_fraction_low": (unit_log_w < -log_hi).double().mean(),
        "rollout_is_eff_sample_size": 1.0 / normalised.square().mean(),
        "rollout_is_seq_mean": seq_mean.mean(),
        "rollout_is_seq_max": seq_mean.max(),
        "rollout_is_seq_min": seq_mean.min(),
    }
    return {key: float(value) for key, value in metrics.items()}


def _estimates(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}


def _sequence_stat(how: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if how == "sum":
        return masked_sum(values, mask, axis=-1)
    if how == "mean":
        return masked_mean(values, mask, axis=-1)
    return values.masked_fill(mask == 0, float("-inf")).amax(-1).clamp_min(0.0)  # max; k2, k3 >= 0


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str = "token_k1", rollout_rs_threshold=None
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` without the tokens or sequences outside the rejection bounds.

    Args:
        log_ratio: ``(bs, R)`` ``log pi_training - log pi_rollout`` per token (nats).
        response_mask: ``(bs, R)``, 1 on generated tokens.
        rollout_rs: one or more options, comma separated (see the module docstring); all must pass.
        rollout_rs_threshold: one threshold for all options or one per option; ``"lo_hi"`` for k1.

    Returns:
        ``(mask, metrics)``: the mask in ``response_mask``'s dtype; per option
        ``rollout_rs_<option>_mean`` / ``_max`` / ``_min`` (of the estimate, per token or per
        sequence), ``_fraction_high`` / ``_fraction_low`` (outside the bounds) and
        ``_masked_fraction`` / ``_seq_masked_fraction``; overall ``rollout_rs_masked_fraction``
        (tokens) and ``rollout_rs_seq_masked_fraction`` (sequences losing any token). Unprefixed.

    Raises:
        UnknownAlgorithmError, AlgorithmConfigError: see :func:`parse_rollout_rs`.
        AlgorithmInputError: the shapes differ.
    """
    rules = parse_rollout_rs(rollout_rs, rollout_rs_threshold)
    _check_shapes("compute_rollout_rejection_mask", log_ratio=log_ratio, response_mask=response_mask)
    mask = response_mask.to(log_ratio.dtype)
    rows = mask.sum(-1) > 0
    if not rows.any():
        return response_mask, {}
    estimates = _estimates(log_ratio)
    keep_all = torch.ones_like(mask, dtype=torch.bool)
    metrics: dict[str, float] = {}
    for rule in rules:
        level, _, estimator = rule.option.rpartition("_")
        if level == "token":
            stat = estimates[estimator]
            units = stat[mask > 0]
        else:
            seq_stat = _sequence_stat(level.split("_")[1], estimates[estimator], mask)
            stat, units = seq_stat.unsqueeze(-1).expand_as(mask), seq_stat[rows]
        high, low = stat > rule.upper, stat < rule.lower if rule.lower is not None else torch.zeros_like(keep_all)
        keep = ~(high | low)
        keep_all &= keep
        prefix = f"rollout_rs_{rule.option}"
        unit_high = units > rule.upper
        unit_low = units < rule.lower if rule.lower is not None else torch.zeros_like(unit_high)
        metrics.update(
            {
                f"{prefix}_mean": float(units.mean()),
                f"{prefix}_max": float(units.max()),
                f"{prefix}_min": float(units.min()),
                f"{prefix}_fraction_high": float(unit_high.double().mean()),
                f"{prefix}_fraction_low": float(unit_low.double().mean()),
                f"{prefix}_masked_fraction": float(masked_mean((~keep).double(), mask)),
                f"{prefix}_seq_masked_fraction": float(((~keep) & (mask > 0)).any(-1)[rows].double().mean()),
            }
        )
    metrics["rollout_rs_masked_fraction"] = float(masked_mean((~keep_all).double(), mask))
    metrics["rollout_rs_seq_masked_fraction"] = float(((~keep_all) & (mask > 0)).any(-1)[rows].double().mean())
    return (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype), metrics


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold=None,
) -> tuple[Optional[torch.Tensor], torch.Tensor, dict[str, float]]:
    """Importance weights, rejection mask and off-policy diagnostics in one call.

    Args:
        old_log_prob: ``(bs, R)`` log-probs under the training policy (nats).
        rollout_log_prob: ``(bs, R)`` log-probs the engine sampled with (nats).
        response_mask: ``(bs, R)``, 1 on generated tokens.
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize: see
            :func:`compute_rollout_correction_weights`; ``rollout_is=None``: no weights.
        rollout_rs, rollout_rs_threshold: see :func:`compute_rollout_rejection_mask`;
            ``rollout_rs=None``: nothing rejected.

    Returns:
        ``(rollout_is_weights or None, response_mask after rejection, metrics)``; every metric
        under ``rollout_corr/``, the off-policy ones included (:func:`compute_offpolicy_metrics`,
        measured on the mask before rejection). verl returns the weights in a DataProto; here
        they are the tensor (algorithms do not know the batch type).

    Raises:
        UnknownAlgorithmError, AlgorithmConfigError: a bad option or threshold.
        AlgorithmInputError: the shapes differ.
    """
    _check_shapes(
        "compute_rollout_correction_and_rejection_mask",
        old_log_prob=old_log_prob,
        rollout_log_prob=rollout_log_prob,
        response_mask=response_mask,
    )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask
    if rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics = {f"rollout_corr/{key}": value for key, value in metrics.items()}
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
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
    _check_shapes(
        "compute_offpolicy_metrics",
        old_log_prob=old_log_prob,
        rollout_log_prob=rollout_log_prob,
        response_mask=response_mask,
    )
    rows = response_mask.sum(-1) > 0
    if not rows.any():
        return {}
    mask = response_mask[rows].double()
    training, rollout = old_log_prob[rows].double(), rollout_log_prob[rows].double()
    log_ratio = ((training - rollout) * mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    training_log_ppl = -masked_mean(training, mask, axis=-1)
    rollout_log_ppl = -masked_mean(rollout, mask, axis=-1)
    log_ppl_diff = rollout_log_ppl - training_log_ppl
    seq_log_ratio = log_ratio.sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
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
