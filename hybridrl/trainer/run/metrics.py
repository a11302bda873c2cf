"""Metrics every trainer shares: the stage timer and the reduction of per-worker values.

``marked_timer`` times a stage into ``timing_s/<stage>``; ``reduce_metrics`` (verl's
``verl.utils.metric.reduce_metrics``) turns the lists the workers return into one number each:
the mean, or the maximum for the memory peaks (:data:`MAX_REDUCED_METRICS`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Mapping

import numpy as np

from hybridrl.workers.memory import MEMORY_METRICS


@contextmanager
def marked_timer(name: str, timing_raw: dict) -> Iterator[None]:
    """Time a block with `time.perf_counter` and add the elapsed seconds to `timing_raw[name]`.

    Repeated blocks with the same name accumulate, so a stage run twice in one step (e.g. two
    generation rounds) reports its total. The time is recorded even if the block raises.

    Args:
        name: stage name, e.g. "gen", "update_actor", "step".
        timing_raw: dict of stage name -> seconds (float), updated in place.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


# Metrics whose per-worker (or per-call) values are reduced to their maximum instead of their mean:
# a peak over the workers is what tells whether the busiest device fits.
MAX_REDUCED_METRICS = frozenset(MEMORY_METRICS)


def reduce_metrics(metrics: dict) -> dict[str, float]:
    """Mean of each list of metric values (e.g. one per mini-batch or per worker); the maximum for
    the names in :data:`MAX_REDUCED_METRICS` (the memory peaks); scalars pass through.

    Args:
        metrics: name -> list of numbers (or tensors/arrays of one element) or a single number.

    Returns:
        A new dict name -> float; the input is not modified. An empty list gives NaN.
    """
    reduced = {}
    for key, value in metrics.items():
        if isinstance(value, (list, tuple)):
            items = [v.item() if hasattr(v, "item") else v for v in value]
            reduce = np.max if key in MAX_REDUCED_METRICS else np.mean
            reduced[key] = float(reduce(items)) if items else float("nan")
        else:
            reduced[key] = float(value.item() if hasattr(value, "item") else value)
    return reduced


def reduce_worker_metrics(per_worker: list[Mapping[str, float]]) -> dict[str, float]:
    """:func:`reduce_metrics` of one dict per worker (a ONE_TO_ALL call's outputs, e.g.
    ``get_memory_metrics``): the mean over the workers, the maximum for :data:`MAX_REDUCED_METRICS`."""
    lists: dict[str, list] = {}
    for worker_metrics in per_worker:
        for key, value in worker_metrics.items():
            lists.setdefault(key, []).append(value)
    return reduce_metrics(lists)


def merge_metrics(metrics: dict, reduced: Mapping[str, float]) -> dict:
    """``metrics.update(reduced)`` in place, except that a name of :data:`MAX_REDUCED_METRICS` already
    in ``metrics`` (reported by another worker group this step) keeps the larger value. Returns ``metrics``."""
    for key, value in reduced.items():
        if key in MAX_REDUCED_METRICS and key in metrics:
            value = max(metrics[key], value)
        metrics[key] = value
    return metrics
