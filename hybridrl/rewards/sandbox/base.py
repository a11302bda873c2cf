"""What every code sandbox takes and returns: limits, one run's result, and the errors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from hybridrl.rewards.custom import RewardConfigError

__all__ = ["SandboxLimits", "SandboxResult", "Sandbox", "SandboxConfigError", "SandboxUnavailableError", "RUN_STATUSES"]

# ok: exit code 0. error: another exit code. timeout: wall or CPU time ran out. memory: the memory
# limit was hit. output_limit: a file or stdout/stderr grew over max_file_size_mb. killed: a signal
# we did not send. sandbox_error: the sandbox itself failed (not the program's fault).
RUN_STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")


class SandboxConfigError(RewardConfigError):
    """A ``reward_model.sandbox.*`` or ``reward_model.sandbox_fusion.*`` value is invalid."""


class SandboxUnavailableError(RewardConfigError):
    """Programs cannot be isolated on this machine (and running them unisolated was not allowed).

    A setup problem, not a sample's: reward managers stop on it whatever ``on_error`` says."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits of a sandboxed program (config ``reward_model.sandbox.*``).

    Attributes:
        timeout_s: wall-clock seconds one run may take.
        cpu_time_s: CPU seconds one run may use (all its processes); ``None``: ``timeout_s``.
        memory_limit_mb: memory of the whole run, in MiB: of all its processes together (and
            its scratch files) where the local sandbox can make a memory cgroup; also the
            address space of each process. Without a cgroup only the per-process limit holds,
            so a run may use up to ``max_processes`` times this.
        max_processes: processes and threads the program may have at once.
        max_file_size_mb: the largest file it may write, stdout and stderr included, and the size
            of its scratch directory, in MiB.
    """

    timeout_s: float = 10.0
    cpu_time_s: float | None = None
    memory_limit_mb: int = 1024
    max_processes: int = 32
    max_file_size_mb: int = 16

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "cpu_time_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SandboxConfigError(f"reward_model.sandbox.{field.name}={value!r} must be a number > 0")

    @property
    def cpu_seconds(self) -> int:
        """The CPU-time limit, whole seconds (rounded up), at least 1."""
        return max(1, int(-(-(self.cpu_time_s or self.timeout_s) // 1)))


@dataclass(frozen=True)
class SandboxResult:
    """One sandboxed run of a program.

    Attributes:
        status: one of :data:`RUN_STATUSES`.
        returncode: the program's exit code; negative for a signal; ``None`` if it never ran.
        stdout, stderr: what it printed (decoded as UTF-8 with replacement, cut at the limit).
        wall_s: seconds from start to end of the run, sandbox set-up included.
        reason: one line saying why the run is not ``ok`` (``""`` when it is).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox(Protocol):
    """Runs a Python program and reports how it ended; never raises for the program's faults."""

    def run(self, source: str, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``source`` (Python) with ``stdin`` as its standard input.

        Args:
            source: the program text.
            stdin: text fed to its standard input.
            timeout_s: wall-clock limit of this run; ``None``: the sandbox's ``timeout_s``.
        """
        ...
