"""Build the jail and run one program in it (started by :mod:`.local` as ``python -I -S jail.py SPEC``).

Three processes, all started here:

- **this one** (the trainer's user) arms its parent-death signal (SIGTERM, handled: it kills the
  keeper, removes the run's cgroup and work folder and exits), joins the run's cgroup when
  :mod:`.local` made one (``spec["cgroup"]``: a memory limit for all processes of the run), forks
  the keeper and, when the trainer runs as root, writes
  the keeper's uid/gid maps: namespace uid 0 is host uid 0 (to build the jail) and namespace uid
  65534 is host ``nobody`` (to run the program);
- **the keeper** unshares user, mount, network, PID, IPC and UTS namespaces (so no network but
  a down loopback) and forks
- **the init** of the new PID namespace, which makes every mount private (nothing reaches the
  host), builds a new root on a tmpfs over the run's empty ``root`` folder (a fresh tmpfs
  ``/sandbox`` holding ``main.py``, the only writable place, also mounted at /tmp; the spec's
  read-only bind mounts of the system libraries and the Python install, wherever it lives, /tmp
  included; /dev/null, /dev/zero, /dev/urandom, /dev/random),
  chroots there, sets the resource limits (address space, CPU time, processes, file size, open
  files, no core dumps), gives up every privilege for good (capability bounding set emptied,
  then uid ``nobody`` under root or no capabilities otherwise, no_new_privs), ignores SIGINT (the
  one signal Python handles, so the program cannot kill its parent), forks the program (the
  interpreter on ``/sandbox/main.py`` with a clean environment), waits for it and writes its
  wait status to the status file. When the init exits, the kernel kills all that is left.

Nothing outlives the trainer: each of the three dies with its parent (``PR_SET_PDEATHSIG``; the
init arms it again after its uid change, which clears it, and checks that the keeper still
lives), and the death of the init ends every process of the namespace.

Under root the program runs as host ``nobody`` because the kernel never applies the process
limit to uid 0. The program is not PID 1 because PID 1 ignores signals it has no handler for
(SIGXCPU of the CPU limit included). A failure before the program starts prints
``hybridrl-sandbox: <why>`` and exits 125. Standard library only, so that it runs with ``-I -S``.
"""

import ctypes
import json
import os
import resource
import shutil
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIGKILL, SIGTERM = 9, 15
NOBODY = 65534
SETUP_FAILED = 125
DEVICES = ("null", "zero", "urandom", "random")

_libc = ctypes.CDLL(None, use_errno=True)


class JailError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        raise JailError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source, target, fstype, flags, data=None) -> None:
    def enc(s):
        return s.encode() if s is not None else None

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _kept_flags(path: str) -> int:
    """The source mount's flags that a user namespace may not clear on a bind remount."""
    f = os.statvfs(path).f_flag
    flags = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return flags | (MS_RELATIME if f & 4096 else 0)  # ST_RELATIME is 4096, MS_RELATIME is not


def _bind_readonly(path: str, root: str) -> None:
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(path, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path))


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def build_root(spec: dict) -> None:
    """The jail's root on a tmpfs over ``spec["root"]``, an empty folder of the run's own: no host
    folder is hidden while the binds are made, so a Python installed under /tmp is found too."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for link, target in spec["symlinks"]:
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    # /sandbox first, and /tmp the same mount: a bind below /tmp (a Python installed there) lands
    # in it, read-only, and the program's /tmp is writable as usual.
    for place in ("/sandbox", "/tmp"):
        os.makedirs(root + place)
    size = f"size={spec['limits']['max_file_size_mb']}m,mode=0777"
    _mount("tmpfs", root + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, size)
    _mount(root + "/sandbox", root + "/tmp", None, MS_BIND)
    _write(root + "/sandbox/main.py", spec["source"])
    for path in spec["binds"]:
        _bind_readonly(path, root)
    os.makedirs(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "a").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/sandbox")


def set_limits(limits: dict) -> None:
    mib = 1024 * 1024
    for res, value in (
        (resource.RLIMIT_AS, limits["memory_limit_mb"] * mib),
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["max_file_size_mb"] * mib),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
    ):
        hard = value + 1 if res == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(res, (value, hard))


def drop_privileges(to_nobody: bool) -> None:
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    if to_nobody:  # leaving uid 0 clears every capability
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    else:
        header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): all empty
        _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def run_init(spec: dict, status_fd: int, as_root: bool, keeper_alive: int) -> None:
    """PID 1 of the new namespace: build the jail, fork the program, report its wait status."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "parent-death signal")
    build_root(spec)
    set_limits(spec["limits"])
    drop_privileges(to_nobody=as_root)
    # Changing the uid cleared the parent-death signal: arm it again (allowed unprivileged), then
    # make sure the keeper did not die in between (its end of the pipe closed: end of file).
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "parent-death signal")
    os.set_blocking(keeper_alive, False)
    try:
        if os.read(keeper_alive, 1) == b"":
            os._exit(SETUP_FAILED)
    except BlockingIOError:
        pass
    os.close(keeper_alive)
    # The program may signal its parent, this init: the kernel only delivers what it has a handler
    # for, and Python's SIGINT handler would end the run as a sandbox error instead of a score.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the program gets Python's usual SIGINT
        python = spec["python"]
        try:
            os.execve(python, [python, "-I", "-B", "/sandbox/main.py"], spec["env"])
        except OSError as exc:
            print(f"hybridrl-sandbox: cannot start {python}: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, str(status).encode())


def run_keeper(spec: dict, status_fd: int, as_root: bool, ready_w: int, mapped_r: int, parent: int) -> None:
    """Unshare the namespaces, wait for the uid map (root) or write it (others), fork the init."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(SETUP_FAILED)
    uid, gid = os.getuid(), os.getgid()
    _check(
        _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS),
        "unshare (user namespaces disabled?)",
    )
    if as_root:
        os.write(ready_w, b"u")
        if os.read(mapped_r, 1) != b"m":
            raise JailError("the uid map was not written")
    else:  # an unprivileged user may map only itself: it becomes root of the namespace
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    alive_r, alive_w = os.pipe()  # the init reads end of file once this keeper is gone
    pid = os.fork()  # the first child in the new PID namespace is its init
    if pid == 0:
        os.close(alive_w)
        _run_guarded(lambda: run_init(spec, status_fd, as_root, alive_r))
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


def _run_guarded(body) -> None:
    try:
        body()
    except (JailError, OSError, ValueError, KeyError) as exc:
        print(f"hybridrl-sandbox: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    os._exit(0)


_keeper = 0  # the keeper's pid, once forked
_cleanup: dict = {}  # what main() leaves behind if the trainer dies: work folder, cgroup


def _abandon(*_signal_args) -> None:
    """The trainer died (parent-death signal): end the run and remove its traces, then exit."""
    if _keeper:
        try:
            os.kill(_keeper, SIGKILL)  # its death kills the init, whose death ends the namespace
            os.waitpid(_keeper, 0)
        except OSError:
            pass
    cgroup = _cleanup.get("cgroup")
    if cgroup:  # leave it, then remove it once the namespace's processes are gone
        try:
            _write(os.path.join(os.path.dirname(cgroup), "cgroup.procs"), str(os.getpid()))
        except OSError:
            pass
        for _ in range(200):
            try:
                os.rmdir(cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
    if _cleanup.get("work"):
        shutil.rmtree(_cleanup["work"], ignore_errors=True)
    os._exit(SETUP_FAILED)


def main() -> None:
    global _keeper
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    # Die with the trainer: SIGTERM on its death, handled here (nothing else runs in this process)
    _cleanup.update(work=os.path.dirname(os.path.abspath(sys.argv[1])), cgroup=spec.get("cgroup"))
    signal.signal(SIGTERM, _abandon)
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0), "parent-death signal")
    if os.getppid() != spec["parent_pid"]:  # it died before the signal was armed
        _abandon()
    if spec.get("cgroup"):  # every process of the run is charged to the run's cgroup
        try:
            _write(os.path.join(spec["cgroup"], "cgroup.procs"), str(os.getpid()))
        except OSError as exc:
            print(f"hybridrl-sandbox: cannot join the run's cgroup {spec['cgroup']}: {exc}", file=sys.stderr)
            sys.exit(SETUP_FAILED)
    status_fd = os.open(spec["status_file"], os.O_WRONLY)
    as_root = os.geteuid() == 0
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    me = os.getpid()
    _keeper = os.fork()
    keeper = _keeper
    if keeper == 0:
        signal.signal(SIGTERM, signal.SIG_DFL)
        _run_guarded(lambda: run_keeper(spec, status_fd, as_root, ready_w, mapped_r, me))
    os.close(ready_w)  # so that a keeper dying before it unshares reads as end of file here
    if as_root:
        _map_ids(keeper, ready_r, mapped_w)
    _, status = os.waitpid(keeper, 0)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


def _map_ids(keeper: int, ready_r: int, mapped_w: int) -> None:
    """Root only: map namespace uid/gid 0 to host 0 and 65534 to host nobody for the keeper."""
    if os.read(ready_r, 1) != b"u":
        return  # the keeper failed before unsharing; it reports why
    try:
        for name in ("uid_map", "gid_map"):
            _write(f"/proc/{keeper}/{name}", f"0 0 1\n{NOBODY} {NOBODY} 1")
    except OSError as exc:
        print(f"hybridrl-sandbox: cannot write the namespace's {name}: {exc}", file=sys.stderr)
        os.kill(keeper, SIGKILL)
        return
    os.write(mapped_w, b"m")


if __name__ == "__main__":
    main()
