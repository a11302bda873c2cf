"""Precision by capability: what ``auto`` means for a dtype key.

bf16 is only fast where the hardware computes it natively. On CPUs with AMX or AVX512-BF16 a
bf16 matmul is ~6-7x faster than fp32; on AVX2-only CPUs (AMD Zen 3, most laptops) torch
emulates it and it is ~50x *slower* (measured: 1024^2 matmul 0.2 GFLOP/s bf16 vs 11.5 fp32).
So ``auto`` picks bf16 on a CUDA device that supports it and on a CPU that has the bf16
instructions, fp32 everywhere else. Explicit values (``bf16``, ``fp32``, ...) always win.

The CPU check reads the instruction-set flags the kernel reports (``/proc/cpuinfo``); where
there is no such file (macOS, Windows) a short timing probe decides: bf16 is taken when a small
bf16 matmul is at least as fast as the fp32 one.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

AUTO = "auto"
# CPU flags of native bf16 matmul: AMX tiles (Intel Sapphire Rapids+) and AVX512-BF16 (Intel
# Cooper Lake+, AMD Zen 4+).
NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# Keys whose value may be ``auto``: the last component of a config path.
DTYPE_LEAVES = ("param_dtype", "dtype")


def read_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's instruction-set flags from ``cpuinfo_path``; None when it cannot be read."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def bf16_matmul_is_fast(size: int = 128, repeats: int = 3) -> bool:
    """Times a ``size``^2 matmul in bf16 and fp32 on the CPU; True when bf16 is not slower.

    128^2 keeps the probe under ~20 ms even where bf16 is emulated (0.2 GFLOP/s).
    """
    import torch

    def best(dtype) -> float:
        a = torch.randn(size, size).to(dtype)
        a @ a  # warm-up: kernel selection
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.bfloat16) <= best(torch.float32)


def cpu_native_bf16(
    flags: Iterable[str] | None = None, probe: Callable[[], bool] = bf16_matmul_is_fast
) -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and why (for the start-up line).

    Args:
        flags: the CPU's flags; None reads ``/proc/cpuinfo`` (tests inject them).
        probe: called when no flags can be read; True means bf16 matmul is fast.
    """
    flags = read_cpu_flags() if flags is None else set(flags)
    if flags is None:
        fast = probe()
        return fast, f"a bf16 matmul probe was {'as fast as or faster than' if fast else 'slower than'} fp32"
    native = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
    if native:
        return True, f"the CPU has {'/'.join(native).upper()}"
    return False, "the CPU has no AMX-BF16 or AVX512-BF16 (bf16 would be emulated, many times slower)"


def _device_name(device: str) -> str:
    """``auto`` as ``trainer.device=auto`` resolves it (cuda when torch sees one); others as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def runs_on_ray(config) -> bool:
    """Whether the run's workers are Ray actors (processes of their own, maybe on other machines):
    ``trainer.backend=ray``, or ``auto`` with more than one worker (``trainer.nnodes`` x
    ``trainer.n_gpus_per_node``) or a pool of its own (``actor_rollout_ref.rollout.nnodes``,
    ``distillation.nnodes`` when it distils),
    as :func:`hybridrl.trainer.run.worker_groups.resolve_backend` chooses. False for configs
    without a backend (``hybridrl generate``: one process)."""
    trainer = getattr(config, "trainer", None)
    backend = getattr(trainer, "backend", None)
    if backend in (None, "local"):
        return False
    if backend == "ray":
        return True
    workers = int(getattr(trainer, "nnodes", 1) or 1) * int(getattr(trainer, "n_gpus_per_node", 1) or 1)
    rollout = getattr(getattr(config, "actor_rollout_ref", None), "rollout", None)
    distillation = getattr(config, "distillation", None)
    teacher_pool = bool(getattr(distillation, "enabled", False)) and int(getattr(distillation, "nnodes", 0) or 0) > 0
    return workers > 1 or int(getattr(rollout, "nnodes", 0) or 0) > 0 or teacher_pool


def resolved_in_workers(config) -> bool:
    """True when each worker, not this process, decides what ``auto`` means (device and dtype):
    the workers are Ray actors (:func:`runs_on_ray`), ``trainer.device`` is ``cuda`` or ``auto``
    and this process sees no CUDA device (verl's layout: a CPU head node, GPU workers). The
    head's CPU says nothing of the workers' GPUs (it would pick fp32 for them)."""
    device = str(getattr(getattr(config, "trainer", None), "device", AUTO))
    if device not in ("cuda", AUTO) or not runs_on_ray(config):
        return False
    import torch

    return not torch.cuda.is_available()


def resolve_auto_dtype(
    device: str, flags: Iterable[str] | None = None, probe: Callable[[], bool] = bf16_matmul_is_fast
) -> tuple[str, str]:
    """``("bf16" | "fp32", reason)``: what ``auto`` means on ``device`` (``cpu``, ``cuda``, or
    ``auto``: cuda when torch sees one, as ``trainer.device=auto``)."""
    import torch

    device = _device_name(device)
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bf16", "the GPU supports bf16"
        return "fp32", "the GPU does not support bf16"
    native, reason = cpu_native_bf16(flags, probe)
    return ("bf16" if native else "fp32"), reason


def auto_dtype_keys(config, prefix: str = "") -> list[str]:
    """Dotted paths of every ``param_dtype`` / ``dtype`` key set to ``auto`` in ``config``. A
    ``???`` value (unset, :func:`hybridrl.config.load_config` names it) is skipped, not read."""
    from omegaconf import DictConfig

    found = []
    for key in config.keys():
        if config._get_node(key)._is_missing():
            continue
        value, path = config[key], f"{prefix}{key}"
        if isinstance(value, DictConfig):
            found.extend(auto_dtype_keys(value, path + "."))
        elif key in DTYPE_LEAVES and value == AUTO:
            found.append(path)
    return found


def resolve_precision(
    config,
    device: str | None = None,
    flags: Iterable[str] | None = None,
    probe: Callable[[], bool] = bf16_matmul_is_fast,
) -> str | None:
    """Replaces every ``auto`` dtype in ``config`` (in place) by what the device computes fast.

    Done once, before anything is built, so every role gets the same choice and the saved run
    config holds the dtype that was used. Where the Ray workers decide (``device`` None and
    :func:`resolved_in_workers`: a GPU-less head), ``auto`` is left for each worker
    (:class:`hybridrl.controller.worker.Worker` resolves its section for its device).

    Args:
        config: a resolved DictConfig (``hybridrl.config.load_config``).
        device: ``cpu``, ``cuda`` or ``auto``; None: the config's ``trainer.device`` (``auto``
            when it has none).

    Returns:
        One line saying what ``auto`` became and why (or that the workers decide), or None when
        no key was ``auto``.
    """
    from omegaconf import OmegaConf, open_dict

    keys = auto_dtype_keys(config)
    if not keys:
        return None
    if device is None and resolved_in_workers(config):
        return f"precision auto: each worker resolves it for its own device (no GPU here): {', '.join(keys)}"
    if device is None:
        device = str(OmegaConf.select(config, "trainer.device", default="auto"))
    device = _device_name(device)  # the printed line says where it runs, not "auto"
    dtype, reason = resolve_auto_dtype(device, flags, probe)
    with open_dict(config):
        for key in keys:
            OmegaConf.update(config, key, dtype, merge=False)
    return f"precision auto -> {dtype} on {device} ({reason}): {', '.join(keys)}"
