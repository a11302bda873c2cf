"""A worker's speed metrics, as verl logs them: ``perf/mfu/<role>`` of an update (the memory ones,
``perf/max_memory_*_gb``, are :mod:`hybridrl.workers.memory`'s)."""

from __future__ import annotations

import time

import torch

from hybridrl.models.flops import device_peak_flops, update_mfu

__all__ = ["mfu_metrics"]


def mfu_metrics(role: str, module, batch, start: float, device: str, epochs: int, lm_head: bool = True) -> dict:
    """verl's ``perf/mfu/<role>``: this worker's update MFU (:func:`hybridrl.models.flops.update_mfu`)
    over ``batch`` (its shard) since ``start`` (``time.perf_counter()``; CUDA synchronised first),
    as a one-entry list so that the driver averages the workers; {} where the device has no
    promised peak (a CPU without ``HYBRIDRL_DEVICE_PEAK_TFLOPS``, an unknown GPU)."""
    peak = device_peak_flops(device)
    if peak is None:
        return {}
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    mfu = update_mfu(getattr(module, "config", None), batch, seconds, peak, epochs, lm_head)
    return {f"perf/mfu/{role}": [mfu]} if mfu is not None else {}
