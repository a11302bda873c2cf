"""A worker process's memory, as verl logs it every step (``perf/max_memory_*_gb``, ``perf/cpu_memory_used_gb``).

The workers return :func:`memory_metrics` with their step's results (``update_actor``,
``update_critic``, ``compute_rm_score``, SFT/RM ``train_batch``) or from a ``get_memory_metrics``
call when they have no update in a step; the driver keeps the MAXIMUM over every worker of every role
(:data:`MEMORY_METRICS`, reduced with ``max`` by :func:`hybridrl.trainer.ppo.metrics.reduce_metrics`).
"""

from __future__ import annotations

import os
import resource
import sys

__all__ = ["GIB", "MEMORY_METRICS", "current_rss_bytes", "memory_metrics", "peak_rss_bytes"]

GIB = 1024**3  # the "gb" of verl's names: GiB, 1024**3 bytes

MEMORY_METRICS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")


def peak_rss_bytes() -> int:
    """This process's peak resident set size, in bytes: ``VmHWM`` of ``/proc/self/status`` (the
    high-water mark of this program's address space, reset by ``exec``). ``getrusage``'s
    ``ru_maxrss`` stands in where there is no ``/proc`` (KiB on Linux, bytes on macOS); Linux
    carries it over ``fork`` + ``exec``, so a process started by a large one would report its
    parent's size. Never reset; threads included, child processes not."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def current_rss_bytes() -> int:
    """This process's resident set size now, in bytes (``/proc/self/statm``: resident pages x page
    size); where there is no ``/proc`` (macOS), the peak (:func:`peak_rss_bytes`) stands in."""
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def release_cached_memory(device) -> bool:
    """Hands the blocks PyTorch's CUDA caching allocator keeps (freed by the trainer: activations,
    gradients, offloaded optimizer state) back to the driver, so that a rollout engine waking in
    this process (vLLM's ``wake_up``, its KV cache) can have them, as verl's sharding managers do
    before a generation. Returns True when it did; a no-op on the CPU (``device`` ``"cpu"``, or
    torch without CUDA)."""
    device_type = getattr(device, "type", None) or str(device).split(":")[0]
    import torch

    if device_type != "cuda" or not torch.cuda.is_available():
        return False
    torch.cuda.empty_cache()
    return True


def memory_metrics(device) -> dict[str, float]:
    """This process's memory on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``),
    in GiB (1024**3 bytes), under verl's names:

    - ``perf/max_memory_allocated_gb``: on CUDA, ``torch.cuda.max_memory_allocated(device)``, the peak
      of the tensors on the device; on CPU, the process's peak resident memory (``VmHWM``).
    - ``perf/max_memory_reserved_gb``: on CUDA, ``torch.cuda.max_memory_reserved(device)``, the peak
      held by PyTorch's caching allocator (>= allocated); on CPU, the peak resident memory again.
    - ``perf/cpu_memory_used_gb``: the process's resident memory now (verl logs the machine's used
      memory, ``psutil.virtual_memory().used``; one process's is what a worker can answer for).

    Peaks run from the process's start, as verl's (the CUDA peak counters are never reset); child
    processes (e.g. a vLLM engine core) are not counted. Cheap: no synchronisation, no allocation.
    """
    device_type = getattr(device, "type", None) or str(device).split(":")[0]
    current = current_rss_bytes()
    if device_type == "cuda":
        import torch

        allocated = torch.cuda.max_memory_allocated(device) / GIB
        reserved = torch.cuda.max_memory_reserved(device) / GIB
    else:  # the kernel's two counters may differ by a few pages: the peak is never below the current
        allocated = reserved = max(peak_rss_bytes(), current) / GIB
    cpu_used = current / GIB
    return {
        "perf/max_memory_allocated_gb": allocated,
        "perf/max_memory_reserved_gb": reserved,
        "perf/cpu_memory_used_gb": cpu_used,
    }
