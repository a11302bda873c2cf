"""``distillation.distillation_loss``: the on-policy distillation loss's hyper-parameters, typed
(verl's ``DistillationLossConfig``: the same field names and defaults).

A frozen dataclass of plain values, read by the functions of this package as ``config=``. Rules
on single fields live in ``__post_init__``; whether ``loss_mode`` / ``policy_loss_mode`` name
registered functions is checked when they are looked up (a loss registered after the config was
built is still found).
"""

from dataclasses import dataclass
from typing import Optional

from ..errors import AlgorithmConfigError
from ..policy_loss import PolicyLossParams

__all__ = ["DistillationLossConfig", "SECTION"]

SECTION = "distillation.distillation_loss"

# Estimators whose gradient, backpropagated directly, does not depend on the teacher.
_TEACHER_FREE_GRADIENT = ("k1", "kl")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class DistillationLossConfig:
    """The distillation loss section (verl's names and defaults).

    Attributes:
        loss_mode: a name registered with ``@register_distillation_loss``: the sampled-token
            reverse-KL estimators ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``,
            or ``forward_kl_topk``.
        topk: how many of the teacher's most likely next tokens are kept per position (the
            top-k losses); > 0, or None where no top-k loss is used.
        use_task_rewards: the task's policy loss (from the reward function's advantages) is
            trained too, and the distillation loss is added to it times ``distillation_loss_coef``.
        distillation_loss_coef: the weight of the distillation loss next to the task loss (read
            only with ``use_task_rewards``; alone, the distillation loss has weight 1).
        loss_max_clamp: the per-token distillation loss is clamped to
            ``[-loss_max_clamp, loss_max_clamp]`` before it is aggregated or used as a reward
            (k1 can be negative); > 0, or None for no clamp.
        log_prob_min_clamp: the top-k losses clamp the student's and the teacher's log-probs from
            below at this value (a probability of ``exp(-10)`` counts as that, not as 0), so
            ``log p - log q`` stays finite; <= 0, or None for no clamp.
        use_policy_gradient: the per-token loss is a reward: its negative is the advantage of a
            policy-gradient loss (Thinking Machines, "On-Policy Distillation", 2025; k1 is the
            usual estimator). Otherwise the loss is backpropagated directly, as a supervised loss
            (GKD, Agarwal et al. 2024, arXiv:2306.13649; k3 or ``forward_kl_topk`` are usual).
        policy_loss_mode: the policy loss (``@register_policy_loss`` name) used with
            ``use_policy_gradient``.
        clip_ratio, clip_ratio_low, clip_ratio_high: that policy loss's PPO clip, ratio clipped to
            ``[1 - clip_ratio_low, 1 + clip_ratio_high]``; each > 0.

    Raises:
        AlgorithmConfigError: a value of the wrong type or out of range, or ``loss_mode`` k1/kl
            without ``use_policy_gradient`` (k1's gradient, backpropagated directly, is the
            student's score alone: it does not depend on the teacher). The message names the key.
    """

    loss_mode: str = "k3"
    topk: Optional[int] = 128
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: Optional[float] = 10.0
    log_prob_min_clamp: Optional[float] = -10.0
    use_policy_gradient: bool = True
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    def __post_init__(self):
        for key in ("loss_mode", "policy_loss_mode"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise AlgorithmConfigError(f"{SECTION}.{key}={getattr(self, key)!r} must be a non-empty name")
        for key in ("use_task_rewards", "use_policy_gradient"):
            if not isinstance(getattr(self, key), bool):
                raise AlgorithmConfigError(f"{SECTION}.{key}={getattr(self, key)!r} must be true or false")
        if self.topk is not None and (isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1):
            raise AlgorithmConfigError(f"{SECTION}.topk={self.topk!r} must be an integer >= 1 (e.g. 128) or null")
        if not _is_number(self.distillation_loss_coef) or self.distillation_loss_coef < 0:
            raise AlgorithmConfigError(
                f"{SECTION}.distillation_loss_coef={self.distillation_loss_coef!r} must be a number >= 0 (e.g. 1.0)"
            )
        if self.loss_max_clamp is not None and (not _is_number(self.loss_max_clamp) or self.loss_max_clamp <= 0):
            raise AlgorithmConfigError(
                f"{SECTION}.loss_max_clamp={self.loss_max_clamp!r} must be a number > 0 (e.g. 10.0) or null"
            )
        clamp = self.log_prob_min_clamp
        if clamp is not None and (not _is_number(clamp) or clamp > 0):
            raise AlgorithmConfigError(
                f"{SECTION}.log_prob_min_clamp={clamp!r} must be a log-probability <= 0 (e.g. -10.0) or null"
            )
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, key)
            if not _is_number(value) or value <= 0:
                raise AlgorithmConfigError(
                    f"{SECTION}.{key}={value!r} must be a number > 0 (the PPO clip; 0.2 is usual)"
                )
        if self.loss_mode in _TEACHER_FREE_GRADIENT and not self.use_policy_gradient:
            raise AlgorithmConfigError(
                f"{SECTION}.loss_mode={self.loss_mode} with use_policy_gradient=false backpropagates "
                "log p_student - log p_teacher, whose gradient does not depend on the teacher; set "
                "use_policy_gradient=true (k1 as a reward) or loss_mode=k3"
            )

    def policy_loss_params(self) -> PolicyLossParams:
        """The ``config=`` of the policy loss used with ``use_policy_gradient``: this section's
        clip ratios, the other knobs at their defaults (dual clip ``clip_ratio_c=3.0``)."""
        return PolicyLossParams(
            clip_ratio=float(self.clip_ratio),
            clip_ratio_low=float(self.clip_ratio_low),
            clip_ratio_high=float(self.clip_ratio_high),
        )
