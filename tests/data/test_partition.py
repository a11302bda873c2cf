"""Karmarkar-Karp k-way partitions (hybridrl.data.partition): hand cases, balance, bad arguments."""

import itertools

import pytest
import torch

from hybridrl.data.partition import karmarkar_karp


def _sums(sizes, parts):
    return [sum(sizes[i] for i in p) for p in parts]


def _is_partition(parts, n):
    return sorted(i for p in parts for i in p) == list(range(n))


def test_karmarkar_karp_two_way_hand_case():
    # Differencing by hand: (8 | 7) d=1, (6 | 5) d=1, (4 | -) d=4; merge the two largest
    # differences: (4 | -) + (8 | 7) -> (4+7 | 8) d=3; then + (6 | 5) -> (4+7+5 | 8+6) d=2.
    # (The classic case where differencing misses the perfect 8+7 | 6+5+4.)
    sizes = [8, 7, 6, 5, 4]
    parts = karmarkar_karp(sizes, 2)
    assert sorted(parts) == [[0, 2], [1, 3, 4]]


def test_karmarkar_karp_three_way_hand_case():
    sizes = [3, 3, 3, 3, 3, 3]
    parts = karmarkar_karp(sizes, 3)
    assert _is_partition(parts, 6) and _sums(sizes, parts) == [6, 6, 6]


@pytest.mark.parametrize("k,equal_size", [(2, False), (3, False), (4, True), (2, True)])
@pytest.mark.parametrize("seed", range(4))
def test_karmarkar_karp_is_balanced(k, equal_size, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 200, (16,), generator=gen).tolist()
    parts = karmarkar_karp(sizes, k, equal_size=equal_size)
    assert len(parts) == k and _is_partition(parts, 16) and all(parts)
    if equal_size:
        assert all(len(p) == 16 // k for p in parts)
    sums = _sums(sizes, parts)
    assert max(sums) - min(sums) <= max(sizes)  # differencing never leaves more than one item's worth
    if k == 2 and not equal_size:  # close to the best split (brute force over 2**16 subsets)
        total = sum(sizes)
        best = min(abs(total - 2 * sum(c)) for r in range(9) for c in itertools.combinations(sizes, r))
        assert max(sums) - min(sums) <= best + max(sizes) // 4


def test_karmarkar_karp_rejects_bad_arguments():
    with pytest.raises(ValueError):
        karmarkar_karp([1, 2, 3], 0)
    with pytest.raises(ValueError, match="equal size"):
        karmarkar_karp([1, 2, 3], 2, equal_size=True)
