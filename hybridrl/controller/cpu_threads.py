"""Thread counts from the cores that are free, for runs on a shared CPU (issue 33 item 7).

On a machine where another process keeps a core busy, OpenMP threads that wait for each other at
every parallel region's barrier run at the speed of the thread that shares its core: with 2
threads on 2 cores, one of them busy, the main job ran 10-20x slower instead of ~2x. The remedy
has three parts, all here or set from here:

* :func:`pick_threads` samples how busy each allowed core is (``os.sched_getaffinity``;
  ``psutil.cpu_percent(percpu=True)`` over ~0.3 s, less this process tree's own CPU; without
  psutil, ``os.getloadavg``) and returns one thread per free core, never fewer than 1. The sample
  is taken once per process (:func:`startup_pick`) and printed as one line when it is fewer
  threads than cores. :func:`apply_torch_threads` sets torch's count from it in the driver /
  in-process worker, :func:`engine_threads` gives the vLLM CPU engine's OpenMP threads.
* A user's own choice wins: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment, a
  ``rollout.cpu_threads``, a torch thread count that is not torch's default, or
  ``HYBRIDRL_AUTO_THREADS=0`` leave everything as it is.
* ``OMP_WAIT_POLICY=PASSIVE`` (:data:`WAIT_POLICY_ENV`): idle OpenMP threads sleep instead of
  spinning. It only acts when set before torch loads OpenMP: the ``hybridrl`` command sets it
  first thing, and processes hybridrl starts (Ray workers, the async vLLM engine) inherit it.

:class:`StepWatch` re-checks when a training step is far slower than the one before (> 3x) and
lowers or raises the driver's torch threads to the cores then free.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

AUTO_ENV = "HYBRIDRL_AUTO_THREADS"  # "0": never pick threads from the machine's load
WAIT_POLICY_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
USER_THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
SAMPLE_S = 0.3
BUSY_FRACTION = 0.7  # a core counts as busy from 70% of one core's time used by other processes
SLOW_STEP_FACTOR = 3.0
MIN_STEP_S = 1.0  # steps shorter than this never trigger a re-check (a sample costs SAMPLE_S)
RAISE_CHECK_STEPS = 10  # with threads lowered, re-check every this many steps whether cores came free


@dataclass(frozen=True)
class ThreadPick:
    """What :func:`pick_threads` saw: allowed cores, how many of them other processes keep busy
    (``busy``, in cores: the sum of their use), where the number came from, the thread count."""

    cores: int
    busy: float
    source: str  # "psutil" or "loadavg"
    threads: int

    @property
    def busy_count(self) -> int:
        """The allowed cores counted busy (:data:`BUSY_FRACTION`)."""
        return min(self.cores, int(self.busy + (1.0 - BUSY_FRACTION)))

    def line(self, what: str) -> str:
        """``hybridrl: 1 of 2 cores busy at start-up (load 1.03 cores, psutil): 1 thread for <what>``."""
        plural = "" if self.threads == 1 else "s"
        return (
            f"hybridrl: {self.busy_count} of {self.cores} cores busy at start-up (load {self.busy:.2f} cores, "
            f"{self.source}): {self.threads} thread{plural} for {what}"
        )


def allowed_cores() -> list[int]:
    """The CPUs this process may run on (all of them where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _own_cpu_seconds(psutil) -> float:
    """CPU seconds used so far by this process and its live descendants (engine, Ray workers)."""
    total = 0.0
    try:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def busy_cores(cores: list[int], interval: float = SAMPLE_S) -> tuple[float, str]:
    """How many of ``cores`` other processes keep busy, in cores, and how it was measured:
    per-CPU use over ``interval`` seconds less this process tree's own use (psutil), else the
    1-minute load average less this process (``os.getloadavg``)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        own_before, wall_before = _own_cpu_seconds(psutil), time.monotonic()
        percents = psutil.cpu_percent(interval=interval, percpu=True)
        own = (_own_cpu_seconds(psutil) - own_before) / max(time.monotonic() - wall_before, 1e-3)
        used = sum(percents[c] for c in cores if c < len(percents)) / 100.0
        return max(0.0, used - own), "psutil"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0, "unknown"
    return max(0.0, load - 1.0), "loadavg"  # this process, starting up, is one of the runnable ones


def threads_for(cores: int, busy: float) -> int:
    """One thread per core that other processes leave free (a core counts as busy from
    :data:`BUSY_FRACTION` of it), at least 1."""
    return max(1, cores - min(cores, int(busy + (1.0 - BUSY_FRACTION))))


def pick_threads(interval: float = SAMPLE_S) -> ThreadPick:
    """Samples the machine now: :class:`ThreadPick` for the allowed cores."""
    cores = allowed_cores()
    busy, source = busy_cores(cores, interval)
    return ThreadPick(cores=len(cores), busy=busy, source=source, threads=threads_for(len(cores), busy))


def auto_enabled() -> bool:
    """False when the user chose threads (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``) or turned
    the pick off (``HYBRIDRL_AUTO_THREADS=0``)."""
    if os.environ.get(AUTO_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return not any(os.environ.get(key) for key in USER_THREAD_ENVS)


_STARTUP: dict = {}  # "pick": the start-up ThreadPick; "torch": the one applied; "torch_before": torch's count
_PRINTED: set[str] = set()


def startup_pick() -> ThreadPick | None:
    """The process's one start-up sample (taken on the first call), or None when the pick is off
    (:func:`auto_enabled`)."""
    if not auto_enabled():
        return None
    if "pick" not in _STARTUP:
        try:
            _STARTUP["pick"] = pick_threads()
        except Exception:  # noqa: BLE001 - a failed sample keeps torch's own defaults
            _STARTUP["pick"] = None
    return _STARTUP["pick"]


def _say(pick: ThreadPick, what: str) -> None:
    if pick.threads < pick.cores and what not in _PRINTED:
        _PRINTED.add(what)
        print(pick.line(what), flush=True)


def _torch_default_threads() -> set[int]:
    """The counts torch starts with by itself: one per allowed CPU or per physical core."""
    counts = {len(allowed_cores())}
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        if physical:
            counts.add(int(physical))
    except ImportError:
        pass
    return counts


def apply_torch_threads(what: str = "torch in this process") -> int | None:
    """Lowers torch's thread count in this process to the free cores at start-up (once; later
    calls return the same). Returns the count set, or None when nothing changed: the pick is off,
    the machine is quiet, or torch's count is not its default (the user's choice)."""
    if "torch" in _STARTUP:
        return _STARTUP["torch"].threads if _STARTUP["torch"] else None
    import torch

    current = torch.get_num_threads()
    _STARTUP["torch_before"] = current
    pick = startup_pick() if current in _torch_default_threads() else None
    applied = pick if pick is not None and pick.threads < current else None
    _STARTUP["torch"] = applied
    if applied is not None:
        torch.set_num_threads(applied.threads)
        _say(applied, what)
        return applied.threads
    return None


def engine_threads(configured: int | None, what: str = "the vLLM CPU engine") -> int | None:
    """The vLLM CPU engine's threads: ``rollout.cpu_threads`` when set, else the free cores at
    start-up when fewer than all (None: the engine keeps the trainer's / OpenMP's default)."""
    if configured:
        return int(configured)
    pick = startup_pick()
    if pick is None or pick.threads >= pick.cores:
        return None
    _say(pick, what)
    return pick.threads


def worker_threads(configured: int) -> int:
    """Threads for each Ray worker: ``trainer.cpu_threads_per_worker``, capped at the cores free at
    start-up (never below 1)."""
    pick = startup_pick()
    if pick is None or configured <= pick.threads:
        return int(configured)
    _say(pick, "each Ray worker (trainer.cpu_threads_per_worker)")
    return max(1, pick.threads)


def wait_policy_env() -> dict[str, str]:
    """``OMP_WAIT_POLICY`` for a process hybridrl starts: the user's value, else ``PASSIVE``."""
    return {key: os.environ.get(key) or value for key, value in WAIT_POLICY_ENV.items()}


class StepWatch:
    """Re-checks the free cores when a step takes more than :data:`SLOW_STEP_FACTOR` times the one
    before, and sets torch's thread count in this process to them (one line when it changes).
    Acts only where :func:`apply_torch_threads` may (the pick is on and torch's count was
    hybridrl's or torch's default); never above the count torch started with. While the count is
    below that, it also re-checks every :data:`RAISE_CHECK_STEPS` steps, to take cores back."""

    def __init__(self, factor: float = SLOW_STEP_FACTOR, raise_every: int = RAISE_CHECK_STEPS) -> None:
        import torch

        self.factor, self.raise_every = factor, raise_every
        self.enabled = auto_enabled() and (
            "torch" in _STARTUP and _STARTUP["torch"] is not None or torch.get_num_threads() in _torch_default_threads()
        )
        self.ceiling = int(_STARTUP.get("torch_before") or torch.get_num_threads())
        self.previous: float | None = None

    def after_step(self, seconds: float, step: int) -> int | None:
        """Call with each step's wall time; returns the new thread count when it changed."""
        if not self.enabled or seconds < MIN_STEP_S:  # short steps are not compared at all
            return None
        previous, self.previous = self.previous, seconds
        if previous is None:
            return None
        import torch

        slow = seconds > self.factor * previous
        lowered = torch.get_num_threads() < self.ceiling and self.raise_every > 0 and step % self.raise_every == 0
        if not (slow or lowered):
            return None
        try:
            pick = pick_threads()
        except Exception:  # noqa: BLE001 - keep the threads as they are
            return None
        current = torch.get_num_threads()
        threads = min(pick.threads, self.ceiling)
        if threads == current:
            return None
        torch.set_num_threads(threads)
        why = f"took {seconds:.1f} s ({seconds / previous:.1f}x the one before)" if slow else "re-check"
        print(
            f"hybridrl: step {step} {why}; "
            f"{pick.busy_count} of {pick.cores} cores busy now (load {pick.busy:.2f} cores): "
            f"torch threads {current} -> {threads}",
            flush=True,
        )
        return threads


def _reset_for_tests() -> None:
    _STARTUP.clear()
    _PRINTED.clear()
