"""`@register`: how a worker method is called from the driver.

A worker method decorated with ``@register(dispatch_mode=...)`` becomes a method of every
WorkerGroup holding that worker class. The dispatch mode says how the driver's arguments are
split over the ``world_size`` workers and how their outputs are collected back; the execute
mode says which ranks run it. The same table serves the local and the Ray backends.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable

from hybridrl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

MAGIC_ATTR = "__hybridrl_register__"


class Dispatch(enum.Enum):
    """The dispatch modes a worker method is registered with (verl's names; those no hybridrl
    worker uses are left out: ``ALL_TO_ALL``, ``RANK_ZERO``, ``DP_COMPUTE_METRIC``)."""

    ONE_TO_ALL = "one_to_all"  # every worker gets the same arguments; outputs as a list
    DP_COMPUTE = "dp_compute"  # list arguments of world_size items, one per rank; outputs as a list
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split into world_size chunks, outputs concatenated


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: Dispatch


def register(dispatch_mode: Dispatch) -> Callable:
    """Mark a worker method as callable through a WorkerGroup; every rank runs it.

    Raises:
        TypeError: if ``dispatch_mode`` is not a :class:`Dispatch`.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"register: dispatch_mode must be a Dispatch, got {dispatch_mode!r}")

    def decorator(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            return func(*args, **kwargs)

        setattr(inner, MAGIC_ATTR, MethodSpec(dispatch_mode))
        return inner

    return decorator


def get_method_spec(func: Any) -> MethodSpec | None:
    return getattr(func, MAGIC_ATTR, None)


# ---- dispatch: driver arguments -> per-rank argument lists ------------------------------


def _split_proto(value, world_size: int):
    if isinstance(value, DataProto):
        padded, pad_size = pad_dataproto_to_divisor(value, world_size)
        return padded.chunk(world_size), pad_size
    return [value] * world_size, 0


def dispatch_args(mode: Dispatch, world_size: int, args: tuple, kwargs: dict):
    """Returns ``(per_rank_args, per_rank_kwargs, pad_size)``: lists of ``world_size`` items."""
    if mode == Dispatch.ONE_TO_ALL:
        return [args] * world_size, [kwargs] * world_size, 0
    if mode == Dispatch.DP_COMPUTE:
        for value in (*args, *kwargs.values()):
            if not isinstance(value, (list, tuple)) or len(value) != world_size:
                raise ValueError(f"{mode.name}: every argument must be a list of world_size={world_size} items")
        per_args = [tuple(a[r] for a in args) for r in range(world_size)]
        per_kwargs = [{k: v[r] for k, v in kwargs.items()} for r in range(world_size)]
        return per_args, per_kwargs, 0
    # DP_COMPUTE_PROTO: split every DataProto, broadcast the rest.
    pad_size = 0
    split_args = []
    for a in args:
        chunks, pad = _split_proto(a, world_size)
        pad_size = max(pad_size, pad)
        split_args.append(chunks)
    split_kwargs = {}
    for k, v in kwargs.items():
        split_kwargs[k], pad = _split_proto(v, world_size)
        pad_size = max(pad_size, pad)
    per_args = [tuple(c[r] for c in split_args) for r in range(world_size)]
    per_kwargs = [{k: c[r] for k, c in split_kwargs.items()} for r in range(world_size)]
    return per_args, per_kwargs, pad_size


def collect_outputs(mode: Dispatch, outputs: list, pad_size: int):
    """Per-rank outputs -> what the driver sees."""
    if mode == Dispatch.DP_COMPUTE_PROTO:
        if not all(isinstance(o, DataProto) for o in outputs):
            raise TypeError("DP_COMPUTE_PROTO: every worker must return a DataProto")
        merged = DataProto.concat(outputs)
        return unpad_dataproto(merged, pad_size) if pad_size else merged
    return outputs
