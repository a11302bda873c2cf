"""Worker base: where a worker learns its rank, world size and device."""

from __future__ import annotations

import os

from hybridrl.errors import ConfigError


def resolve_device(device: str) -> str:
    """``trainer.device`` (cpu | cuda | auto) -> a torch device string.

    Raises:
        ConfigError: ``cuda`` requested but torch sees no CUDA device, or an unknown value.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but torch sees no CUDA device; set trainer.device=cpu or auto")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"trainer.device={device!r} is not one of cpu, cuda, auto")
    return device


def resolve_worker_precision(config, device: str, rank: int = 0) -> str | None:
    """Replaces the ``auto`` dtypes left in a worker's ``config`` section by what ``device`` (this
    worker's, resolved) computes fast: the driver leaves them where it cannot know the workers'
    device (:func:`hybridrl.config.precision.resolved_in_workers`: a GPU-less head, Ray
    workers). Rank 0 prints the line. A no-op on sections that hold no ``auto`` (the driver
    resolved them) and on configs that are not DictConfigs. Returns the line, or None."""
    from omegaconf import DictConfig

    from hybridrl.config.precision import auto_dtype_keys, resolve_precision

    if not isinstance(config, DictConfig) or not auto_dtype_keys(config):
        return None
    line = resolve_precision(config, device)
    if line and rank == 0:
        print(f"hybridrl: worker {line}", flush=True)
    return line


MALLOC_REUSE_ENV = "HYBRIDRL_CPU_MALLOC_REUSE"


def reuse_freed_cpu_memory(world_size: int = 1) -> bool:
    """Makes glibc's malloc keep freed memory for reuse instead of returning it to the OS.

    By default glibc serves every allocation over a few MB (activations, logits) with a fresh
    ``mmap`` and unmaps it on free, so each forward/backward pays page faults and kernel page
    zeroing again: on these CPUs ~13% of a GRPO step went to system time. A huge
    ``M_TRIM_THRESHOLD`` (never trim the heap) keeps freed memory resident for the next micro
    batch; which blocks depends on ``world_size``, the worker's group size:

    - one worker: every block (``M_MMAP_MAX=0``). The big ones are the logits and activations
      that each micro batch allocates again: SmolLM2-135M's update ran 9% slower when blocks
      over 16 MiB were unmapped (benchmarks/grpo_step.py: 296 -> 268 tokens/s).
    - several (FSDP): blocks under 16 MiB (a fixed ``M_MMAP_THRESHOLD``). FSDP's all-gather and
      reduce buffers and the optimizer step's whole-matrix temporaries come and go at every
      layer, and kept they grew the RSS with the model: SmolLM2-360M's shapes on 2 workers,
      peak 7.3 -> 5.4 GB per worker for 36 -> 39 s per step (docs/scale.md).

    The same idea as preloading jemalloc/tcmalloc, PyTorch's CPU tuning advice, without a
    preload. Applies to this process only; returns False where there is no glibc (macOS, musl),
    which is harmless.
    """
    mallopt = _mallopt()
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4  # <malloc.h>
    if mallopt is None:
        return False
    kept = mallopt(m_mmap_max, 0) if world_size <= 1 else mallopt(m_mmap_threshold, SHARDED_MMAP_THRESHOLD)
    return bool(kept) and bool(mallopt(m_trim_threshold, 2**30))


SHARDED_MMAP_THRESHOLD = 16 * 2**20  # bytes: with several workers, blocks this large are unmapped on free


def release_freed_cpu_memory() -> bool:
    """Makes glibc's malloc return every freed block over 128 KiB to the OS at once
    (``trainer.cpu_malloc_reuse=false``): a fixed ``M_MMAP_THRESHOLD`` (glibc's initial one).

    Left alone, glibc raises the threshold each time a large mmap'd block is freed (up to
    32 MB), after which such blocks come from the heap and stay resident after they are freed;
    FSDP's all-gather and gradient buffers of a few MB each then leave the RSS at about the
    model's size above what is live (measured on 2 Gloo ranks, 256 MB of Linear layers: 1.2-1.5 GB
    steady instead of 0.79 GB). Slower than keeping the memory (:func:`reuse_freed_cpu_memory`),
    leanest for memory-bound runs. Returns False where there is no glibc.
    """
    mallopt = _mallopt()
    m_mmap_threshold = -3  # <malloc.h>
    return mallopt is not None and bool(mallopt(m_mmap_threshold, 128 * 1024))


def _mallopt():
    """glibc's ``mallopt``, or None (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


class Worker:
    """Base class of all workers.

    Rank and world size come from the torch.distributed environment variables (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``) that the backend sets before the worker is built; the local
    backend runs one worker with rank 0 of 1. ``init_distributed`` starts the process group
    (Gloo on CPU, NCCL on CUDA) only when there is more than one worker.
    """

    def __init__(self, config=None, device: str | None = None) -> None:
        """``config``: the worker's config section. ``device`` (``trainer.device``: cpu | cuda |
        auto): when given, the worker computes there and joins its group's process group."""
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if os.environ.get(MALLOC_REUSE_ENV) == "1":  # trainer.cpu_malloc_reuse, set by the driver
            reuse_freed_cpu_memory(self.world_size)
        elif os.environ.get(MALLOC_REUSE_ENV) == "0":
            release_freed_cpu_memory()
        self.config = config
        if device is not None:
            self.device = resolve_device(device)
            resolve_worker_precision(config, self.device, self.rank)
            self.init_distributed(self.device)

    def init_distributed(self, device: str) -> None:
        """Joins the default process group: NCCL on CUDA, Gloo on CPU (rendezvous from the
        ``MASTER_ADDR`` / ``MASTER_PORT`` the backend set). Collectives time out after
        ``HYBRIDRL_PG_TIMEOUT_S`` seconds (verl's ``nccl_timeout``), else ``HYBRIDRL_DIST_TIMEOUT_S``
        (``trainer.dist_timeout_s``, default 600), so a rank that died cannot leave the others
        waiting forever."""
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        if self.world_size > 1 and not dist.is_initialized():
            if device == "cuda":
                torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            timeout = timedelta(seconds=process_group_timeout_s())
            dist.init_process_group(backend="nccl" if device == "cuda" else "gloo", timeout=timeout)


def process_group_timeout_s() -> float:
    """The timeout of the workers' process group, seconds: ``HYBRIDRL_PG_TIMEOUT_S`` (the run's
    ``nccl_timeout``) when set, else ``HYBRIDRL_DIST_TIMEOUT_S`` (``trainer.dist_timeout_s``), else 600."""
    return float(os.environ.get("HYBRIDRL_PG_TIMEOUT_S") or os.environ.get("HYBRIDRL_DIST_TIMEOUT_S") or 600)
