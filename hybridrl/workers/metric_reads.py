"""Metrics of an update read from the device once per mini batch, not once per micro batch: the
per-micro-batch values stay 0-dim tensors (sums as fp64 on their device) until one stacked
``.tolist()`` reads them, so the update never waits on the host between micro batches.
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["accumulate", "read_at_once", "read_metrics"]


def accumulate(sums: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    """``sums[key] += value`` as an fp64 tensor on ``value``'s device, without a host sync (the
    same sum as adding ``value.item()`` to a python float: fp32 -> fp64 is exact, fp64 adds alike)."""
    value = value.detach().reshape(()).to(torch.float64)
    sums[key] = sums[key] + value if key in sums else value


def read_at_once(values: list) -> list[float]:
    """The python floats of 0-dim tensors (or numbers), with one host read per device: the
    tensors become fp64 (exact from fp32/bf16/ints/bools), are stacked and read by one
    ``.tolist()``; ``float(value.item())`` of each, bit for bit, without a sync per value."""
    out: list = list(values)
    by_device: dict[torch.device, list[int]] = defaultdict(list)
    for i, value in enumerate(out):
        if torch.is_tensor(value):
            by_device[value.device].append(i)
        else:
            out[i] = float(value)
    for indices in by_device.values():
        stacked = torch.stack([out[i].detach().reshape(()).to(torch.float64) for i in indices])
        for i, number in zip(indices, stacked.tolist()):
            out[i] = number
    return out


def read_metrics(pending: dict[str, list], sums: dict[str, torch.Tensor]) -> list[tuple[str, float]]:
    """``(name, value)`` of each per-micro-batch value of ``pending`` (in order), then of each sum,
    read by :func:`read_at_once`: one host sync for a whole mini batch."""
    keys = [key for key, values in pending.items() for _ in values] + list(sums)
    return list(zip(keys, read_at_once([v for values in pending.values() for v in values] + list(sums.values()))))
