"""On-policy distillation: the student samples, a teacher scores each token, and the student is
trained towards the teacher on its own states (``distillation.distillation_loss``, verl's names).

Two loss families, registered by ``loss_mode`` (:mod:`.base`):

* the sampled-token reverse-KL estimators ``kl``/``k1``, ``abs``, ``mse``/``k2``,
  ``low_var_kl``/``k3`` (:mod:`.estimators`, hybridrl's :func:`~hybridrl.algorithms.kl.kl_penalty`
  with the teacher as the reference), used as a per-token reward under a policy loss
  (``use_policy_gradient=true``) or backpropagated directly;
* ``forward_kl_topk`` (:mod:`.topk`): GKD's forward KL on the teacher's top-k next tokens.

:func:`distillation_loss` turns the per-token loss into a scalar, :func:`distillation_ppo_loss`
adds it to the task's policy loss (:mod:`.losses`); :class:`DistillationLossConfig` is the
section (:mod:`.config`).
"""

from .base import (
    DISTILLATION_LOSS_REGISTRY,
    DISTILLATION_LOSSES,
    DistillationLossSettings,
    get_distillation_loss_fn,
    get_distillation_loss_settings,
    register_distillation_loss,
)
from .config import DistillationLossConfig
from .estimators import compute_distillation_loss_reverse_kl_estimator
from .losses import compute_distillation_loss_range, distillation_loss, distillation_ppo_loss
from .topk import compute_forward_kl_topk, topk_overlap_ratio

__all__ = [
    "DISTILLATION_LOSSES",
    "DISTILLATION_LOSS_REGISTRY",
    "DistillationLossSettings",
    "DistillationLossConfig",
    "register_distillation_loss",
    "get_distillation_loss_fn",
    "get_distillation_loss_settings",
    "compute_distillation_loss_reverse_kl_estimator",
    "compute_forward_kl_topk",
    "topk_overlap_ratio",
    "compute_distillation_loss_range",
    "distillation_loss",
    "distillation_ppo_loss",
]
