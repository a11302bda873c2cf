"""The async vLLM engine's process, watched from both sides (issue 33, items 3 and 5).

vLLM 0.32's ``AsyncLLM`` runs its engine core (``VLLM::EngineCore``, which starts the
``VLLM::Worker`` holding the weights) in a child process. Two failures used to go unnoticed:

- The driver is killed (kill -9, the OOM killer): its finalizers never run, and the engine core,
  which does not watch its parent, keeps its memory for minutes. :func:`engine_dies_with_parent`
  makes the engine core ask the kernel, first thing, for SIGTERM when the thread that started it
  ends (Linux ``prctl(PR_SET_PDEATHSIG)``; its worker follows through vLLM's own death pipe).
- The engine core dies while the driver waits on it: vLLM marks the client dead, but a request in
  flight waits on for its output. :func:`engine_death` tells, at any moment, whether the engine
  is dead and how (exit code or signal), for the waits to check every second.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading

__all__ = ["engine_death", "engine_dies_with_parent", "engine_processes"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_patch_lock = threading.Lock()
_patch_depth = 0
_original = None


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Asks the kernel to send ``sig`` to this process when the thread that started it ends
    (Linux only; returns whether that holds). If the parent is gone already, sends it now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # died before the prctl: reparented already
        os.kill(os.getpid(), sig)
    return True


def run_engine_core(*args, **kwargs):
    """vLLM's ``EngineCoreProc.run_engine_core`` (the engine process's target), after
    :func:`die_with_parent`. Runs in the spawned engine process, where vLLM's class is unpatched."""
    die_with_parent()
    from vllm.v1.engine.core import EngineCoreProc

    return EngineCoreProc.run_engine_core(*args, **kwargs)


@contextlib.contextmanager
def engine_dies_with_parent():
    """While inside, vLLM engine cores started from this process run :func:`run_engine_core`:
    they die with the thread that starts them. The engine start must happen on a thread that lives
    as long as the engine (the client's event-loop thread does). Without vLLM's
    ``EngineCoreProc.run_engine_core`` (another vLLM version), nothing changes."""
    global _patch_depth, _original
    try:
        from vllm.v1.engine.core import EngineCoreProc
    except ImportError:
        yield
        return
    with _patch_lock:
        if _patch_depth == 0:
            current = EngineCoreProc.__dict__.get("run_engine_core")
            if isinstance(current, staticmethod):
                _original = current
                EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0 and _original is not None:
                EngineCoreProc.run_engine_core = _original
                _original = None


def engine_processes(llm) -> list:
    """The engine core processes (``multiprocessing`` handles) of an ``AsyncLLM``; empty where
    this vLLM keeps them elsewhere or they are not local."""
    manager = getattr(getattr(getattr(llm, "engine_core", None), "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or ())


def _how(exitcode: int) -> str:
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-exitcode).name}"
        return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def engine_death(llm) -> str | None:
    """None while the engine of ``llm`` (an ``AsyncLLM``) lives; else how it died, e.g.
    ``"EngineCore (pid 123) was killed by SIGKILL"``. Cheap (a non-blocking wait per process)."""
    for process in engine_processes(llm):
        code = process.exitcode
        if code is not None:
            return f"{process.name} (pid {process.pid}) {_how(code)}"
    if getattr(llm, "errored", False):  # the engine core marked dead, or the output handler ended
        return "vLLM reports its engine core dead"
    return None
