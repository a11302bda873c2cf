"""Comparing batch values and merging ``meta_info``: the parts of :meth:`DataProto.union` and
:meth:`DataProto.concat` that do not need the batch itself."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from hybridrl.protocol.errors import ConcatConflictError, DataProtoError

__all__ = ["arrays_equal", "values_equal", "merge_meta_info"]


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Element-wise equality of two arrays of the same shape; NaN equals NaN."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "biufc" and b.dtype.kind in "biufc":
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    return all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))


def values_equal(a: Any, b: Any) -> bool:
    """Equality that copes with tensors / arrays nested as values; NaN equals NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        try:
            return arrays_equal(np.asarray(a), np.asarray(b))
        except ValueError:  # a ragged list next to an array
            return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return a is b


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _metric_records(metrics: Any, item: int) -> list[dict]:
    """One part's ``meta_info['metrics']`` as a list of ``{name: value or [values]}`` dicts."""
    records = metrics if isinstance(metrics, list) else [metrics]
    for record in records:
        if not isinstance(record, dict):
            raise DataProtoError(
                f"concat: meta_info['metrics'] of item {item} holds a {type(record).__name__}; "
                "give a dict {name: value or [values]} or a list of such dicts"
            )
    return records


def merge_meta_info(metas: Sequence[dict]) -> dict:
    """The ``meta_info`` of :meth:`DataProto.concat` (see there) from the parts' meta_infos."""
    merged: dict = {}
    source: dict[str, int] = {}  # key -> the part that set it, for the error message
    records: list[dict] = []
    has_metrics = False
    for i, meta in enumerate(metas):
        for key, value in meta.items():
            if key == "metrics":
                if value is not None:
                    has_metrics = True
                    records.extend(_metric_records(value, i))
            elif key not in merged:
                merged[key], source[key] = value, i
            elif not values_equal(merged[key], value):
                raise ConcatConflictError(
                    f"Conflicting values for meta_info key '{key}' in concat: item {source[key]} "
                    f"has {_short(merged[key])}, item {i} has {_short(value)}; give every part the "
                    "same value or pop the key before concat"
                )
    if has_metrics:
        joined: dict[str, list] = {}
        for record in records:
            for name, value in record.items():
                joined.setdefault(name, []).extend(value if isinstance(value, list) else [value])
        merged["metrics"] = joined
    return merged
