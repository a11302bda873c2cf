"""Errors raised by the algorithm functions.

Every error is a ``ValueError`` subclass whose message stands alone: what is wrong, which key
or argument, and what to do.
"""

import math
from typing import Optional

from hybridrl.errors import UserError
from hybridrl.registry import RegistryError


class UnknownAlgorithmError(RegistryError):
    """An algorithm registry (estimators, losses, KL penalties) was given a name nobody registered,
    or a second function under a taken name."""


class AlgorithmConfigError(UserError, ValueError):
    """An algorithm hyper-parameter has a value the algorithm cannot work with."""


class AlgorithmInputError(UserError, ValueError):
    """A tensor or array handed to an algorithm function has the wrong shape or content."""


class NonFiniteError(UserError, ArithmeticError):
    """A loss or advantage tensor holds NaN or inf: training stops rather than corrupt the weights."""


def check_finite(tensor, name: str, data_step: Optional[int] = None, mask=None) -> None:
    """Raise :class:`NonFiniteError` naming ``name`` (and the training step) if ``tensor`` has
    NaN/inf; with ``mask``, only positions where ``mask`` is non-zero count (padding may hold
    anything). Reads the count on the host: one device sync for a CUDA tensor."""
    import torch

    bad = ~torch.isfinite(tensor.detach())
    if mask is not None:
        bad = bad & mask.to(torch.bool)
    count = int(bad.sum())
    if count:
        raise non_finite_error(name, count, bad.numel(), data_step)


def check_finite_value(value: float, name: str, data_step: Optional[int] = None) -> None:
    """:func:`check_finite` of one number already on the host (no device sync): the same
    :class:`NonFiniteError` and message as for a one-element tensor."""
    if not math.isfinite(value):
        raise non_finite_error(name, 1, 1, data_step)


def non_finite_error(name: str, count: int, numel: int, data_step: Optional[int] = None) -> NonFiniteError:
    """The error of ``count`` NaN/inf values among ``numel`` in ``name``."""
    where = f"step {data_step}: " if data_step is not None else ""
    return NonFiniteError(
        f"{where}{name} has {count} NaN/inf value(s) of {numel}; the step is stopped. Usual causes: "
        "a reward function returning NaN, a learning rate too high, or fp16 overflow; run with "
        "HYBRIDRL_DEBUG=1 for the traceback"
    )
