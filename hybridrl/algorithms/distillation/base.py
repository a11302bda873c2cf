"""The distillation-loss registry (verl's ``register_distillation_loss`` /
``get_distillation_loss_fn``) and the helpers the losses share.

A distillation loss is registered under one or more ``distillation.distillation_loss.loss_mode``
names with :class:`DistillationLossSettings`, what it needs from the teacher (top-k log-probs or
the sampled token's log-prob), kept as the entry's capabilities. It is called as::

    fn(student_log_probs, teacher_log_probs, response_mask, config=None,
       teacher_topk_ids=None, student_topk_ids=None) -> (distillation_losses, metrics)

``student_log_probs`` / ``teacher_log_probs`` are ``(bs, response_length)`` sampled-token
log-probs for the estimators (``use_estimator``), ``(bs, response_length, topk)`` log-probs of
the teacher's top-k ids for the top-k losses (``use_topk``). ``distillation_losses`` is the
per-token loss ``(bs, response_length)``, 0 on padding; ``metrics`` maps ``distillation/<name>``
to python floats.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Tuple, Union

import torch

from hybridrl.registry import Registry

from ..errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from .config import SECTION

__all__ = [
    "DISTILLATION_LOSSES",
    "DISTILLATION_LOSS_REGISTRY",
    "DistillationLossSettings",
    "register_distillation_loss",
    "get_distillation_loss_fn",
    "get_distillation_loss_settings",
]

DISTILLATION_LOSSES = Registry(
    "distillation loss",
    f"{SECTION}.loss_mode",
    error=UnknownAlgorithmError,
    hint="register your own with @register_distillation_loss",
)
DISTILLATION_LOSS_REGISTRY: Dict[str, Callable] = DISTILLATION_LOSSES.table  # verl's name: live name -> function


@dataclass(frozen=True)
class DistillationLossSettings:
    """What a registered distillation loss needs (verl's class of that name).

    Attributes:
        names: the ``loss_mode`` name(s) it is registered under (a string or a sequence).
        use_topk: it reads the teacher's top-k log-probs at each position (and the student's
            log-probs of those ids).
        use_estimator: it reads the sampled token's log-prob under the teacher and the student.

    Raises:
        AlgorithmConfigError: no name, or not exactly one of ``use_topk`` / ``use_estimator``.
    """

    names: Union[str, Tuple[str, ...]] = ()
    use_topk: bool = False
    use_estimator: bool = False

    def __post_init__(self):
        names = (self.names,) if isinstance(self.names, str) else tuple(self.names)
        object.__setattr__(self, "names", names)
        if not names:
            raise AlgorithmConfigError("DistillationLossSettings: give at least one name to register the loss under")
        if self.use_topk + self.use_estimator != 1:
            raise AlgorithmConfigError(
                f"DistillationLossSettings{names}: set exactly one of use_topk and use_estimator, got "
                f"use_topk={self.use_topk}, use_estimator={self.use_estimator}"
            )


def register_distillation_loss(loss_settings: DistillationLossSettings) -> Callable:
    """Decorator: register a distillation loss under each of ``loss_settings.names``, with the
    settings as the entry's capabilities.

    Raises:
        UnknownAlgorithmError (a ValueError): a name is taken by another function.
    """

    def decorator(fn: Callable) -> Callable:
        for name in loss_settings.names:
            DISTILLATION_LOSSES.register(
                name, fn, use_topk=loss_settings.use_topk, use_estimator=loss_settings.use_estimator
            )
        return fn

    return decorator


def get_distillation_loss_fn(loss_name: str) -> Callable:
    """The distillation loss registered as ``loss_name``.

    Raises:
        UnknownAlgorithmError: no loss has that name (one line naming the key and the known names).
    """
    return DISTILLATION_LOSSES.get(loss_name)


def get_distillation_loss_settings(loss_name: str) -> DistillationLossSettings:
    """The :class:`DistillationLossSettings` ``loss_name`` was registered with (``names`` is that
    one name).

    Raises:
        UnknownAlgorithmError: no loss has that name.
    """
    caps = DISTILLATION_LOSSES.capabilities(loss_name)
    return DistillationLossSettings(
        names=(loss_name,), use_topk=bool(caps.get("use_topk")), use_estimator=bool(caps.get("use_estimator"))
    )


def check_shapes(what: str, expected: Tuple[int, ...], **tensors: torch.Tensor) -> None:
    """Each tensor has the shape ``expected``.

    Raises:
        AlgorithmInputError: one does not; the message names it and both shapes.
    """
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected):
            raise AlgorithmInputError(
                f"{what}: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected)} "
                "((bs, response_length) as response_mask, with a last topk dim for top-k inputs)"
            )


def masked_stats(values: torch.Tensor, mask: torch.Tensor, prefix: str) -> Dict[str, float]:
    """``{prefix: mean, prefix_min: min, prefix_max: max}`` of ``values`` over the valid tokens,
    python floats; all 0.0 when no token is valid."""
    valid = values.detach()[mask.bool()].float()
    if valid.numel() == 0:
        return {prefix: 0.0, f"{prefix}_min": 0.0, f"{prefix}_max": 0.0}
    return {prefix: valid.mean().item(), f"{prefix}_min": valid.min().item(), f"{prefix}_max": valid.max().item()}


def zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is set, 0 elsewhere (padding may hold NaN or inf)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))
