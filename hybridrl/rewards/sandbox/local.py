"""The default code sandbox: every run in fresh Linux namespaces on this machine.

Each run gets its own user, network, mount, PID, IPC and UTS namespaces (``unshare(2)``),
a root file system that holds only the Python install (read-only), a fresh tmpfs as its
directory, resource limits and no capabilities (see :mod:`hybridrl.rewards.sandbox.jail`). So a
program cannot reach the network (not even 127.0.0.1), see or write the host's files, read the
trainer's environment, or outlive its run: when the run ends, the kernel kills every process of
its PID namespace. The wall-time limit is a SIGKILL of the run's process group from here, which
no program can catch. Nor does a run outlive its trainer: the jail dies with it (parent-death
signals) and removes the run's work folder and cgroup; :func:`sweep_stale_work_dirs`, run once
per process, removes what a dead trainer still left.

Memory: each isolated run gets its own memory cgroup (:class:`MemoryCgroup`, v2 or v1) where
one can be made, so ``memory_limit_mb`` holds for all its processes together; elsewhere the
limit is per process only (up to ``max_processes`` times ``memory_limit_mb`` in all).

Isolation is probed once per process (a trivial program). Where it cannot be set up,
:class:`LocalSandbox` refuses to run anything, unless ``unsafe_no_isolation`` asks for the
unisolated fallback: a subprocess in a temporary directory with the same resource limits (but
not the process-count limit, which would count all of the user's processes) and a clean
environment, and nothing else (no cgroup; the program dies with the trainer, but a child it
starts in a new session escapes both the wall-time kill and the trainer's death).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import glob
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hybridrl.rewards.sandbox.base import SandboxLimits, SandboxResult, SandboxUnavailableError
from hybridrl.rewards.sandbox.cgroup import WORK_PREFIX, MemoryCgroup

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
STALE_AFTER_S = 60.0  # an unlocked work folder this old belongs to a dead trainer
_swept = False
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


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
        _sweep_once()
        with _work_dir() as work:
            return self._run_in(work, source, stdin, timeout, isolated)

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
        cgroup = MemoryCgroup.create(work.name, self.limits.memory_limit_mb) if isolated else None
        try:
            result = self._run_with(work, source, timeout, isolated, cgroup)
        finally:
            oom_kills = cgroup.remove() if cgroup else 0
        if oom_kills and result.status in ("error", "killed", "sandbox_error"):
            why = f"ran out of memory (limit {self.limits.memory_limit_mb} MiB for all its processes)"
            return SandboxResult("memory", result.returncode, result.stdout, result.stderr, result.wall_s, why)
        return result

    def _run_with(
        self, work: Path, source: str, timeout: float, isolated: bool, cgroup: MemoryCgroup | None
    ) -> SandboxResult:
        status_file = work / "status"
        if isolated:
            popen = self._isolated_popen(work, source, status_file, cgroup)
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

    def _isolated_popen(self, work: Path, source: str, status_file: Path, cgroup: MemoryCgroup | None) -> dict:
        """Popen arguments of an isolated run (the jail script, with its spec file)."""
        (work / "root").mkdir()  # the jail's root is mounted here, in its own mount namespace only
        spec = {
            "root": str(work / "root"),
            "parent_pid": os.getpid(),
            "cgroup": cgroup.path if cgroup else None,
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
        own = (_install_of(os.path.abspath(self.python)), _install_of(os.path.realpath(self.python)))
        for prefix in sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *own)}, key=len):
            if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
                paths.append(prefix)
        return [p for p in paths if os.path.exists(p)]

    def _unisolated_limits(self) -> None:  # runs in the child, before exec
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the trainer
        mib = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (self.limits.memory_limit_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (self.limits.cpu_seconds, self.limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limits.max_file_size_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def _read(self, path: Path) -> str:
        with open(path, "rb") as f:
            return f.read(self.limits.max_file_size_mb * 1024 * 1024).decode("utf-8", errors="replace")


def _install_of(python: str) -> str:
    """The install (or virtual environment) an interpreter belongs to: ``<prefix>/bin/python`` ->
    ``<prefix>`` (a venv's ``bin/python`` is a link into another install: both are bound)."""
    folder = os.path.dirname(python)
    prefix = os.path.dirname(folder)
    return prefix if os.path.basename(folder) == "bin" and prefix != "/" else folder  # never the host's /


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
    with _work_dir() as work:
        result = probe._run_in(work, "print('ok')", "", _PROBE_TIMEOUT_S, isolated=True)
    if result.ok and result.stdout.strip() == "ok":
        return ""
    return result.reason or _last_line(result.stderr) or f"the probe program ended with {result.status}"


@contextlib.contextmanager
def _work_dir() -> Iterator[Path]:
    """A fresh work folder for one run, locked (``flock``) while this process lives, then removed.

    The lock is what tells a later :func:`sweep_stale_work_dirs` that the folder's trainer is gone
    (the kernel drops it with the process, whatever its pid namespace)."""
    path = tempfile.mkdtemp(prefix=WORK_PREFIX)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def sweep_stale_work_dirs(older_than_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the work folders (and their cgroups) that a dead trainer left behind.

    A folder is stale when it is ours, unchanged for ``older_than_s`` and no live process holds its
    lock. A trainer killed with ``kill -9`` normally leaves nothing (the jail removes its folder on
    the trainer's death); this catches the rest, e.g. a jail killed at the same time.

    Returns:
        the folders removed.
    """
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), WORK_PREFIX + "*")):
        try:
            st = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
                continue
            if time.time() - st.st_mtime < older_than_s:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live run's
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        MemoryCgroup.remove_stale(os.path.basename(path))
        removed.append(path)
    return removed


def _sweep_once() -> None:
    global _swept
    with _probe_lock:
        if _swept:
            return
        _swept = True
    removed = sweep_stale_work_dirs()
    if removed:
        logger.info("code sandbox: removed %d work folders of dead trainers", len(removed))
