"""verl's profiler tools, per chosen step of a worker's process (``global_profiler.tool``):

- ``torch``: a ``torch.profiler`` trace (below);
- ``torch_memory``: a snapshot of the CUDA caching allocator's history over the step
  (``torch.cuda.memory._record_memory_history`` / ``_dump_snapshot``; open it at
  https://pytorch.org/memory_viz), ``<roles>_rank<r>.pickle`` where the trace would go;
- ``nsys``: the step as one Nsight Systems capture range (``torch.cuda.profiler.start`` / ``stop``);
  nsys writes the report of a run started under ``nsys profile --capture-range=cudaProfilerApi``.

The last two record CUDA only: on CPU they record nothing (the config check notes it).

The driver calls ``start_profile(step)`` before and ``stop_profile()`` after each step of
``global_profiler.steps`` (:class:`ProfiledWorker`, the workers' registered methods); a worker whose
roles have ``profiler.enable`` (and ``tool: torch``) on a selected rank (``all_ranks``, else ``ranks``,
else rank 0) records everything its process runs in between, and writes one Chrome trace (JSON:
``chrome://tracing``, Perfetto, TensorBoard's profiler plugin) to

    <save_path>/step_<n>/<roles>_rank<r>.json

``<n>`` is the step the trace started at (with ``profile_continuous_steps``, a run of consecutive
chosen steps shares one trace), ``<roles>`` the roles of the workers in the process joined by ``+``
(``actor_rollout_ref``; ``actor_rollout_ref+critic`` where the local backend runs both in one
process: one process has one torch profiler, so colocated workers share its trace), ``<r>`` the rank.

A worker whose roles do not profile holds ``None`` and its methods return at once: nothing runs
and nothing is written when profiling is off.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.workers.config.profiler import TOOLS

logger = logging.getLogger(__name__)

__all__ = ["ProfiledWorker", "RoleProfiler", "role_profiler", "trace_path"]


def trace_path(save_path: str, step: int, roles: list[str], rank: int, suffix: str = ".json") -> str:
    """Where a process's trace of ``step`` goes: ``<save_path>/step_<step>/<roles>_rank<rank><suffix>``."""
    return os.path.join(save_path, f"step_{step}", f"{'+'.join(roles)}_rank{rank}{suffix}")


@dataclass(frozen=True)
class RoleProfiler:
    """A worker's profiling settings, made once from its roles' ``profiler`` sections."""

    role: str
    rank: int
    save_path: str
    contents: tuple[str, ...] = ()
    tool: str = "torch"

    def options(self) -> dict:
        """``torch.profiler.profile``'s arguments for ``contents`` (verl's mapping: ``cpu`` / ``cuda``
        pick the activities, both when neither is named; ``shapes``, ``memory``, ``stack``)."""
        import torch

        wanted = set(self.contents)
        activities = []
        if not wanted & {"cpu", "cuda"} or "cpu" in wanted:
            activities.append(torch.profiler.ProfilerActivity.CPU)
        if (not wanted & {"cpu", "cuda"} or "cuda" in wanted) and torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return {
            "activities": activities,
            "record_shapes": "shapes" in wanted,
            "profile_memory": "memory" in wanted,
            "with_stack": "stack" in wanted,
        }


def _selected(section, rank: int) -> bool:
    if not section.enable or section.tool not in TOOLS:
        return False
    if section.all_ranks:
        return True
    return rank in section.ranks if section.ranks else rank == 0


def role_profiler(role: str, sections: list, rank: int) -> RoleProfiler | None:
    """The profiler of a worker hosting ``role`` on ``rank`` whose roles have the ``profiler``
    ``sections`` (the actor's, reference's, rollout's of one policy worker: verl's union), or None
    when none of them profiles this rank."""
    chosen = [section for section in sections if _selected(section, rank)]
    if not chosen:
        return None
    first = chosen[0]
    contents = sorted({item for section in chosen for item in section.tool_config.torch.contents})
    return RoleProfiler(role=role, rank=rank, save_path=first.save_path, contents=tuple(contents), tool=first.tool)


class _MemoryHistory:
    """``torch_memory``: the CUDA allocator's events from start to stop, dumped as a snapshot."""

    suffix = ".pickle"

    def start(self) -> None:
        import torch

        if torch.cuda.is_available():  # verl's defaults: 100000 events, every frame of Python and C++
            torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="all")

    def stop(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(enabled=None)

    def export(self, path: str) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return None
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(path)
        return path


class _CaptureRange:
    """``nsys``: the step as one capture range of the Nsight Systems run around the process."""

    suffix = None  # nsys writes its own report

    def start(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.profiler.start()

    def stop(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()


class _TorchTrace:
    """``torch``: a ``torch.profiler`` trace, exported as Chrome JSON."""

    suffix = ".json"

    def __init__(self, options: dict) -> None:
        import torch

        self.profile = torch.profiler.profile(**options)

    def start(self) -> None:
        self.profile.start()

    def stop(self) -> None:
        self.profile.stop()

    def export(self, path: str) -> str | None:
        self.profile.export_chrome_trace(path)
        return path


def _recorder(profiler: RoleProfiler):
    if profiler.tool == "torch_memory":
        return _MemoryHistory()
    if profiler.tool == "nsys":
        return _CaptureRange()
    return _TorchTrace(profiler.options())


@dataclass
class _Session:
    """The process's one running ``torch.profiler.profile`` and the workers recording into it."""

    profile: Any  # the tool's recorder: start / stop / export
    step: int
    save_path: str
    members: list[RoleProfiler] = field(default_factory=list)  # recording now
    roles: list[str] = field(default_factory=list)  # every role that recorded: the file's name


_SESSION: _Session | None = None  # one per process: torch runs one profiler at a time


def start(profiler: RoleProfiler, step: int) -> None:
    """Starts the process's trace for ``step`` (or joins the one another worker started)."""
    global _SESSION
    if _SESSION is None:
        recorder = _recorder(profiler)
        recorder.start()
        _SESSION = _Session(recorder, step, profiler.save_path)
    if profiler not in _SESSION.members:
        _SESSION.members.append(profiler)
    if profiler.role not in _SESSION.roles:
        _SESSION.roles.append(profiler.role)


def stop(profiler: RoleProfiler) -> str | None:
    """Leaves the process's trace; the last worker to leave stops it and writes the file, whose path
    it returns (None while other workers still record)."""
    global _SESSION
    session = _SESSION
    if session is None or profiler not in session.members:
        return None
    if len(session.members) > 1:
        session.members.remove(profiler)
        return None
    _SESSION = None
    session.profile.stop()
    if session.profile.suffix is None:
        return None
    path = trace_path(session.save_path, session.step, session.roles, profiler.rank, session.profile.suffix)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    written = session.profile.export(path)
    if written:
        logger.info("profiler: wrote %s", written)
    return written


class ProfiledWorker:
    """The driver's profiling calls (verl's ``start_profile`` / ``stop_profile``), mixed into the
    workers; a worker sets ``self.profiler`` (:func:`role_profiler`: None when it does not profile)."""

    profiler: RoleProfiler | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int) -> None:
        """Starts recording this process for training step ``step`` (nothing when not profiled)."""
        if self.profiler is not None:
            start(self.profiler, step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> str | None:
        """Stops recording; the path of the trace written, or None (not profiled, or another worker
        of this process still records into the trace)."""
        if self.profiler is None:
            return None
        return stop(self.profiler)
