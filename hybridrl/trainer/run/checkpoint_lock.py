"""One run per folder: a trainer holds ``<trainer.default_local_dir>/.run.lock`` while it runs.

Two runs writing checkpoints, ``metrics.jsonl`` and ``config.yaml`` into one folder would
overwrite each other's steps. The lock is ``fcntl.flock`` on that file: the kernel releases it
when its process ends, however it ends, so a killed run never blocks the next one. The file
names its holder (pid, host, start time) for the message a second run stops with; a clean exit
empties it, so a holder still named when the lock is free is a run that died, and the next run
takes its place with a one-line warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from hybridrl.errors import UserError

__all__ = ["LOCK_FILE", "RunFolderBusy", "run_folder_lock"]

LOCK_FILE = ".run.lock"
# what flock answers on a file system without it (some network and parallel file systems)
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunFolderBusy(UserError, RuntimeError):
    """Another running trainer holds the run folder (the message names the folder and the holder)."""


def _holder(fd: int) -> str:
    """The holder the lock file names, as ``pid P on host H, started T``; "" when it names none."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return ""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return repr(text[:200])


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


@contextlib.contextmanager
def run_folder_lock(folder: str) -> Iterator[None]:
    """Holds the lock of the run folder ``folder`` (made if missing) for the ``with`` block;
    released when the block ends, by an error too. A folder made here that holds nothing else
    when the block ends is removed: a run that stops at start-up leaves no trace.

    Raises:
        RunFolderBusy: another process holds it (one line: the folder, the holder's pid, host and
            start time, what to do).
    """
    folder = os.path.abspath(os.path.expanduser(folder))
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _lock(fd, folder):
            print(
                f"hybridrl: warning: {folder} does not support file locks; two runs on it are not prevented", flush=True
            )
            yield
            return
        stale = _holder(fd)
        if stale:
            print(
                f"hybridrl: warning: taking over {folder} from a run that ended without releasing it ({stale})",
                flush=True,
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        _write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
        try:
            yield
        finally:
            _write(fd, "")  # a clean exit names no holder; closing the file releases the lock
    finally:
        os.close(fd)
        if made and os.listdir(folder) == [LOCK_FILE]:
            with contextlib.suppress(OSError):  # another run may have come in meanwhile: leave it
                os.remove(os.path.join(folder, LOCK_FILE))
                os.rmdir(folder)


def _lock(fd: int, folder: str) -> bool:
    """Takes the lock of the open lock file ``fd``; False when ``folder``'s file system has no ``flock``.

    Raises:
        RunFolderBusy: another process holds it.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        raise RunFolderBusy(
            f"trainer.default_local_dir={folder} is in use by another run "
            f"({_holder(fd) or 'its holder is still starting'}); wait for it to end or stop it, "
            "or set trainer.default_local_dir to another folder"
        ) from None
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            raise
        return False
