"""Balanced partitioning of item sizes into k sets: micro batches by token budget
(``use_dynamic_bsz``) and the data-parallel balance of a batch (``trainer.balance_batch``).

The largest differencing method of Karmarkar and Karp, generalised to k sets
("The Differencing Method of Set Partitioning", Karmarkar & Karp, 1982; k-way form as in
Korf, "Multi-Way Number Partitioning", IJCAI 2009), as verl's ``seqlen_balancing.py`` uses.
"""

from __future__ import annotations

import heapq
from typing import Sequence


def karmarkar_karp(sizes: Sequence[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Partitions item indices into ``k`` sets of nearly equal size sums.

    Args:
        sizes: non-negative item sizes (e.g. tokens per row).
        k: number of sets, ``1 <= k``; with ``equal_size`` ``len(sizes)`` must divide by ``k``.
        equal_size: every set gets ``len(sizes) // k`` items.

    Returns:
        ``k`` lists of item indices, each sorted ascending; no list is empty when
        ``len(sizes) >= k`` and the sizes are positive.

    Raises:
        ValueError: ``k < 1``, or ``equal_size`` with a count that ``k`` does not divide.
    """
    if k < 1:
        raise ValueError(f"karmarkar_karp: k={k} must be >= 1")
    n = len(sizes)
    if equal_size and n % k:
        raise ValueError(f"karmarkar_karp: {n} items do not split into {k} sets of equal size")
    order = sorted(range(n), key=lambda i: sizes[i])
    # A heap entry is one partial partition: k (sum, items) sets, kept sorted by sum descending;
    # it is keyed by its spread (largest - smallest sum), largest first.
    groups = [order[i : i + k] for i in range(0, n, k)] if equal_size else [[i] for i in order]
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tie, group in enumerate(groups):
        sets = [(sizes[i], [i]) for i in group] + [(0, []) for _ in range(k - len(group))]
        sets.sort(key=lambda s: (-s[0], -len(s[1])))
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), tie, sets))
    tie = len(groups)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # The largest set of one with the smallest of the other: the differences cancel.
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda s: (-s[0], -len(s[1])))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    sets = heap[0][2] if heap else [(0, []) for _ in range(k)]
    return [sorted(items) for _, items in sets]
