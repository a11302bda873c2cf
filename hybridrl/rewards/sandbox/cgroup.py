"""Memory cgroups for the code sandbox's isolated runs: one child cgroup per run, so that the
memory limit covers all of the run's processes together (v2 ``memory.max``, else v1)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

__all__ = ["MemoryCgroup", "WORK_PREFIX"]

logger = logging.getLogger(__name__)

WORK_PREFIX = "hybridrl-sandbox-"  # the runs' work folders (temp dir) and cgroups


class MemoryCgroup:
    """A child of this process's memory cgroup holding one isolated run, so that the memory limit
    covers all the run's processes together (and its scratch files, on tmpfs).

    cgroup v2 (``memory.max``, no swap) where this process's cgroup has the memory controller
    and may give it to a child; else cgroup v1's memory hierarchy (``memory.limit_in_bytes``,
    ``memory.memsw.limit_in_bytes``). Creating one needs write access there (root, or a delegated
    cgroup); where it fails, :meth:`create` returns ``None`` and each process keeps only its own
    address-space limit (see :class:`~hybridrl.rewards.sandbox.SandboxLimits`).
    """

    _base: tuple[str, str] | None = None  # (version, our cgroup's folder), once found
    _why_not: str | None = None  # why none can be made here, once known

    def __init__(self, path: str, version: str) -> None:
        self.path, self.version = path, version

    @classmethod
    def why_unavailable(cls) -> str:
        """ "" if runs get a memory cgroup here, else why not (found once per process)."""
        if cls._why_not is None:
            probe = cls.create(WORK_PREFIX + f"probe-{os.getpid()}", 64)
            if probe is not None:
                probe.remove()
        return cls._why_not or ""

    @classmethod
    def create(cls, name: str, limit_mb: int) -> MemoryCgroup | None:
        """A new cgroup ``name`` limited to ``limit_mb`` MiB, or ``None`` where none can be made."""
        if cls._why_not:
            return None
        limit = str(limit_mb * 1024 * 1024)
        try:
            version, base = cls._base or _memory_cgroup_base()
            path = os.path.join(base, name)
            os.mkdir(path)
        except OSError as exc:
            cls._why_not = f"cannot create a memory cgroup: {exc}"
            logger.warning("code sandbox: %s; the memory limit is per process", cls._why_not)
            return None
        cls._base, cls._why_not = (version, base), ""
        cgroup = cls(path, version)
        try:
            if version == "v2":
                _write(path, "memory.max", limit)
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(path, "memory.swap.max", "0")
            else:
                _write(path, "memory.limit_in_bytes", limit)
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _write(path, "memory.memsw.limit_in_bytes", limit)
        except OSError as exc:
            cgroup.remove()
            cls._why_not = f"cannot set a cgroup's memory limit: {exc}"
            logger.warning("code sandbox: %s; the memory limit is per process", cls._why_not)
            return None
        return cgroup

    def oom_kills(self) -> int:
        """How many processes of the run the kernel killed for the cgroup's limit."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> int:
        """Kill what is left in it, remove it; the number of OOM kills it saw."""
        oom_kills = self.oom_kills()
        for attempt in range(300):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:  # busy: the namespace's processes are still being reaped
                if attempt % 50 == 49:
                    _kill_all(self.path)
                time.sleep(0.01)
        else:
            logger.warning("code sandbox: could not remove the cgroup %s", self.path)
        return oom_kills

    @classmethod
    def remove_stale(cls, name: str) -> None:
        """Remove the cgroup of a dead trainer's run (its work folder ``name``), if any."""
        try:
            _, base = cls._base or _memory_cgroup_base()
        except OSError:
            return
        if os.path.isdir(os.path.join(base, name)):
            cls(os.path.join(base, name), "").remove()


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


def _kill_all(cgroup: str) -> None:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            pids = [int(line) for line in f if line.strip()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _memory_cgroup_base() -> tuple[str, str]:
    """("v2" or "v1", the folder of this process's memory cgroup) where children can be made.

    Raises:
        OSError: no memory cgroup hierarchy is mounted, or v2's cannot give memory to a child.
    """
    mounts: dict[str, tuple[str, str]] = {}  # version -> (root of the mount, mount point)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _source, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                mounts.setdefault("v2", (fields[3], fields[4]))
            elif fstype == "cgroup" and "memory" in options.split(","):
                mounts.setdefault("v1", (fields[3], fields[4]))
    folders: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            version = "v2" if hierarchy == "0" and not controllers else "v1"
            if version == "v1" and "memory" not in controllers.split(","):
                continue
            if version in mounts:
                root, point = mounts[version]
                if path == root or path.startswith(root.rstrip("/") + "/") or root == "/":
                    folders[version] = point + path[len(root.rstrip("/")) :]
    why = "no memory cgroup is mounted"
    if "v2" in folders:
        folder = folders["v2"]
        with open(os.path.join(folder, "cgroup.controllers")) as f:
            available = f.read().split()
        if "memory" in available:
            with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            try:
                if "memory" not in enabled:
                    _write(folder, "cgroup.subtree_control", "+memory")
                return "v2", folder
            except OSError as exc:
                why = f"cgroup v2 cannot give the memory controller to a child of {folder} ({exc})"
        else:
            why = f"cgroup v2 has no memory controller at {folder}"
    if "v1" in folders:
        return "v1", folders["v1"]
    raise OSError(why)
