"""The default code sandbox: every run in fresh Linux namespaces on this machine.

Each run gets its own user, network, mount, PID, IPC and UTS namespaces (``unshare(2)``),
a root file system that holds only the Python install (read-only), a fresh tmpfs as its
directory, resource limits and no capabilities (see :mod:`hybridrl.rewards.sandbox.jail`). So a
program cannot reach the network (not even 127.0.0.1), see or write the host's files, read the
trainer's environment, or outlive its run: when the run ends, the kernel kills every process of
its PID namespace.

Isolation is probed once per process (a trivial program). Where it cannot be set up,
:class:`LocalSandbox` refuses to run anything, unless ``unsafe_no_isolation`` asks for the
unisolated fallback: a subprocess in a temporary directory with the same resource limits (but
not the process-count limit, which would count all of the user's processes) and a clean
environment, and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hybridrl.rewards.sandbox.base import SandboxLimits, SandboxResult, SandboxUnavailableError

__all__ = ["LocalSandbox"]

logger = logging.getLogger(__name__)

JAIL = Path(__file__).with_name("jail.py")
_JAIL_SETUP_FAILED = 125
# What a program sees of the environment: nothing of the trainer's (no tokens, no keys).
_CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/sandbox",
    "TMPDIR": "/sandbox",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}
_TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE_TIMEOUT_S = 30.0
_probe_lock = threading.Lock()
_probe_results: dict[str, str] = {}  # python executable -> "" (isolation works) or why not


class LocalSandbox:
    """Runs Python programs isolated on this machine (see the module docstring).

    Args:
        limits: per-run limits (``reward_model.sandbox.*``).
        unsafe_no_isolation: where namespaces are unavailable, run programs without isolation
            instead of refusing (``reward_model.sandbox.unsafe_no_isolation``; a throwaway
            machine only: the program can then use the network and write the user's files).
        python: the interpreter programs run with; default: this one (its packages visible).
    """

    def __init__(
        self, limits: SandboxLimits | None = None, unsafe_no_isolation: bool = False, python: str | None = None
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.unsafe_no_isolation = bool(unsafe_no_isolation)
        self.python = python or sys.executable

    def run(self, source: str, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``source`` in the sandbox; see :meth:`hybridrl.rewards.sandbox.Sandbox.run`.

        Raises:
            SandboxUnavailableError: isolation cannot be set up here and ``unsafe_no_isolation``
                is off.
        """
        isolated = self.isolation_available()
        timeout = float(timeout_s or self.limits.timeout_s)
        with tempfile.TemporaryDirectory(prefix="hybridrl-sandbox-") as work:
            return self._run_in(Path(work), source, stdin, timeout, isolated)

    def isolation_available(self) -> bool:
        """True if programs run isolated; False if they run unisolated (allowed by the user).

        Raises:
            SandboxUnavailableError: isolation cannot be set up and ``unsafe_no_isolation`` is off.
        """
        why_not = _probe(self)
        if not why_not:
            return True
        if self.unsafe_no_isolation:
            return False
        raise SandboxUnavailableError(
            f"reward_model.sandbox: model-written code cannot be isolated on this machine ({why_not}); "
            "code rewards need Linux user, network, mount and PID namespaces. Set "
            "reward_model.sandbox_fusion.url to a Sandbox Fusion service, or "
            "reward_model.sandbox.unsafe_no_isolation=true to run it unisolated (a throwaway machine only)"
        )

    def _run_in(self, work: Path, source: str, stdin: str, timeout: float, isolated: bool) -> SandboxResult:
        (work / "stdin").write_text(stdin, encoding="utf-8")
        status_file = work / "status"
        status_file.touch()
        if isolated:
            popen = self._isolated_popen(work, source, status_file)
        else:
            (work / "box").mkdir()
            (work / "box" / "main.py").write_text(source, encoding="utf-8")
            env = {**_CLEAN_ENV, "HOME": str(work / "box"), "TMPDIR": str(work / "box")}
            popen = {
                "args": [self.python, "-I", "-B", "main.py"],
                "cwd": str(work / "box"),
                "env": env,
                "preexec_fn": self._unisolated_limits,
            }
        started = time.perf_counter()
        with (
            open(work / "stdin", "rb") as fin,
            open(work / "stdout", "wb") as fout,
            open(work / "stderr", "wb") as ferr,
        ):
            proc = subprocess.Popen(stdin=fin, stdout=fout, stderr=ferr, start_new_session=True, **popen)
            timed_out = _wait_or_kill(proc, timeout)
        wall = time.perf_counter() - started
        stdout, stderr = (self._read(work / name) for name in ("stdout", "stderr"))
        if timed_out:
            return SandboxResult(
                "timeout", None, stdout, stderr, wall, f"ran over the wall-time limit of {timeout:g} s"
            )
        if isolated:
            status = status_file.read_text().strip()
            if proc.returncode != 0 or not status:
                why = _last_line(stderr) or f"the sandbox exited with code {proc.returncode}"
                return SandboxResult("sandbox_error", None, stdout, stderr, wall, why)
            returncode = os.waitstatus_to_exitcode(int(status))
        else:
            returncode = proc.returncode
        return self._classify(returncode, stdout, stderr, wall)

    def _isolated_popen(self, work: Path, source: str, status_file: Path) -> dict:
        """Popen arguments of an isolated run (the jail script, with its spec file)."""
        spec = {
            "status_file": str(status_file),
            "source": source,
            "python": self.python,
            "env": _CLEAN_ENV,
            "binds": self._binds(),
            "symlinks": [(d, os.readlink(d)) for d in _TOP_DIRS if os.path.islink(d)],
            "limits": {**vars(self.limits), "cpu_seconds": self.limits.cpu_seconds},
        }
        (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        return {"args": [self.python, "-I", "-S", str(JAIL), str(work / "spec.json")], "cwd": "/", "env": {}}

    def _classify(self, returncode: int, stdout: str, stderr: str, wall: float) -> SandboxResult:
        limits = self.limits
        if returncode == 0:
            return SandboxResult("ok", 0, stdout, stderr, wall)
        if returncode == _JAIL_SETUP_FAILED and "hybridrl-sandbox:" in stderr:
            return SandboxResult("sandbox_error", None, stdout, stderr, wall, _last_line(stderr))
        if returncode < 0:
            sig = signal.Signals(-returncode)
            if sig is signal.SIGXCPU:
                status, why = "timeout", f"ran over the CPU-time limit of {limits.cpu_seconds} s"
            elif sig is signal.SIGXFSZ:
                status, why = "output_limit", f"wrote a file or output over {limits.max_file_size_mb} MiB"
            else:
                status, why = "killed", f"killed by {sig.name}"
            return SandboxResult(status, returncode, stdout, stderr, wall, why)
        if "MemoryError" in stderr:
            why = f"ran out of memory (limit {limits.memory_limit_mb} MiB): {_last_line(stderr)}"
            return SandboxResult("memory", returncode, stdout, stderr, wall, why)
        if "[Errno 27]" in stderr:  # EFBIG: Python ignores SIGXFSZ, so the write fails instead
            why = f"wrote a file or output over {limits.max_file_size_mb} MiB: {_last_line(stderr)}"
            return SandboxResult("output_limit", returncode, stdout, stderr, wall, why)
        why = f"exit code {returncode}" + (f": {_last_line(stderr)}" if stderr.strip() else "")
        return SandboxResult("error", returncode, stdout, stderr, wall, why)

    def _binds(self) -> list[str]:
        """Read-only paths of the jail: the system libraries and this Python's install."""
        paths = ["/usr", "/etc/ld.so.cache"]
        paths += [d for d in _TOP_DIRS if os.path.isdir(d) and not os.path.islink(d)]
        for prefix in {
            os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(self.python)))
        }:
            if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
                paths.append(prefix)
        return [p for p in paths if os.path.exists(p)]

    def _unisolated_limits(self) -> None:  # runs in the child, before exec
        mib = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (self.limits.memory_limit_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (self.limits.cpu_seconds, self.limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limits.max_file_size_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def _read(self, path: Path) -> str:
        with open(path, "rb") as f:
            return f.read(self.limits.max_file_size_mb * 1024 * 1024).decode("utf-8", errors="replace")


def _wait_or_kill(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for ``proc`` up to ``timeout`` s; on overrun kill its process group. True if it overran."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the jail's init dies with it, and with it the namespace
        except ProcessLookupError:
            pass
        proc.wait(timeout=_PROBE_TIMEOUT_S)
        return True


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _probe(sandbox: LocalSandbox) -> str:
    """ "" if isolated runs work for this interpreter, else why not (cached per process)."""
    with _probe_lock:
        if sandbox.python not in _probe_results:
            _probe_results[sandbox.python] = _why_no_isolation(sandbox)
            if _probe_results[sandbox.python]:
                logger.warning("code sandbox: no isolation on this machine: %s", _probe_results[sandbox.python])
        return _probe_results[sandbox.python]


def _why_no_isolation(sandbox: LocalSandbox) -> str:
    if sys.platform != "linux":
        return f"Linux namespaces are not available on {sys.platform}"
    probe = LocalSandbox(SandboxLimits(timeout_s=_PROBE_TIMEOUT_S), python=sandbox.python)
    with tempfile.TemporaryDirectory(prefix="hybridrl-sandbox-probe-") as work:
        result = probe._run_in(Path(work), "print('ok')", "", _PROBE_TIMEOUT_S, isolated=True)
    if result.ok and result.stdout.strip() == "ok":
        return ""
    return result.reason or _last_line(result.stderr) or f"the probe program ended with {result.status}"
